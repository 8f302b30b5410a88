"""Self-service administration of alerting, shared by the CLI and the HTTP API.

Reads the current subscriptions/silences/acks (``topics.alert_config``) and alert states (``topics.alert_state``)
through topic mirrors; writes validated config records (or tombstones) to ``topics.alert_config`` and waits until
its own mirror shows them, so a caller reads its own write. The input builders turn user input (CLI options or
API JSON) into records or raise :class:`AlertConfigError` with one line; they keep no control character in the
free text people type (:func:`alerting.model.clean_text`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from alerting.inhibit import Inhibitor, parse_inhibit_rules, silenced_by
from alerting.model import (
    Ack,
    AlertState,
    AlertStatus,
    ConfigRecord,
    Receiver,
    Silence,
    StateRecord,
    Subscription,
    clean_text,
    decode_config,
    decode_state,
    encode_config,
    new_id,
    parse_matchers,
)
from alerting.targets import TargetPolicy
from pipeline.config import Settings
from pipeline.errors import AlertConfigError, ServiceError
from pipeline.mirror import TopicMirror
from pipeline.publisher import Publisher
from pipeline.vocab import parse_duration, parse_seconds

_RECEIVER_KEYS = {
    "kind",
    "url",
    "secret",
    "secret_env",
    "to",
    "smtp",
    "smtp_starttls",
    "smtp_user",
    "smtp_password_env",
    "topic",
}
_SUBSCRIPTION_KEYS = {
    "name",
    "owner",
    "team",
    "match",
    "receivers",
    "group_by",
    "group_wait",
    "group_interval",
    "repeat",
    "send_resolved",
}
_SILENCE_KEYS = {"match", "for", "starts", "by", "comment"}


def _smtp(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep:
        return value, 25
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AlertConfigError(f"SMTP server {value!r} is not host:port")
    return host, int(port)


def make_receiver(
    kind: str,
    target: str,
    secret_env: str | None = None,
    secret: str | None = None,
    smtp: str | None = None,
    smtp_starttls: bool = False,
    smtp_user: str | None = None,
    smtp_password_env: str | None = None,
) -> Receiver:
    """``kind`` webhook/slack (target = URL), email (target = address), kafka (target = topic)."""
    if kind in ("webhook", "slack"):
        r = Receiver(kind, url=target, secret=secret, secret_env=secret_env)
    elif kind == "email":
        host, port = _smtp(smtp) if smtp else (None, None)
        r = Receiver(
            kind,
            to=target,
            smtp_host=host,
            smtp_port=port,
            smtp_starttls=smtp_starttls,
            smtp_user=smtp_user,
            smtp_password_env=smtp_password_env,
        )
    else:
        r = Receiver(kind, topic=target)
    return r.validate()


def make_subscription(
    name: str,
    owner: str,
    match: list[str],
    receivers: list[Receiver],
    team: str | None = None,
    group_by: list[str] | None = None,
    group_wait: str | None = None,
    group_interval: str | None = None,
    repeat: str | None = None,
    send_resolved: bool = True,
    now_ns: int | None = None,
) -> Subscription:
    def seconds(value: str | None, what: str) -> float | None:
        return None if value is None else parse_seconds(value, what, error=AlertConfigError, zero=True)

    return Subscription(
        new_id(),
        clean_text(name),
        clean_text(owner),
        parse_matchers(match),
        tuple(receivers),
        clean_text(team) or None if team else None,
        tuple(x.strip() for x in group_by or () if x.strip()),
        seconds(group_wait, "group wait"),
        seconds(group_interval, "group interval"),
        seconds(repeat, "repeat interval"),
        send_resolved,
        time.time_ns() if now_ns is None else now_ns,
    ).validate()


def make_silence(match: list[str], duration: str, by: str, comment: str = "", now_ns: int | None = None) -> Silence:
    now = time.time_ns() if now_ns is None else now_ns
    length = parse_duration(duration, "silence duration", error=AlertConfigError)
    return Silence(new_id(), parse_matchers(match), now, now + length, clean_text(by), clean_text(comment)).validate()


def _check(obj: Any, allowed: set[str], what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise AlertConfigError(f"{what} must be a JSON object")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise AlertConfigError(f"{what}: unknown field {unknown[0]!r} (fields: {', '.join(sorted(allowed))})")
    return obj


def _str(obj: dict[str, Any], name: str, what: str, required: bool = False) -> str | None:
    value = obj.get(name)
    if value is None:
        if required:
            raise AlertConfigError(f"{what} needs {name!r}")
        return None
    if not isinstance(value, str):
        raise AlertConfigError(f"{what}: {name!r} must be a string")
    return value


def _str_list(obj: dict[str, Any], name: str, what: str) -> list[str]:
    value = obj.get(name, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AlertConfigError(f"{what}: {name!r} must be a list of strings")
    return value


def receiver_from_json(obj: Any) -> Receiver:
    d = _check(obj, _RECEIVER_KEYS, "receiver")
    kind = _str(d, "kind", "receiver", required=True) or ""
    target_key = {"webhook": "url", "slack": "url", "email": "to", "kafka": "topic"}.get(kind)
    if target_key is None:
        raise AlertConfigError(f"receiver kind {kind!r} is not one of webhook, slack, email, kafka")
    starttls = d.get("smtp_starttls", False)
    if not isinstance(starttls, bool):
        raise AlertConfigError("receiver: 'smtp_starttls' must be true or false")
    return make_receiver(
        kind,
        _str(d, target_key, f"{kind} receiver", required=True) or "",
        secret_env=_str(d, "secret_env", "receiver"),
        secret=_str(d, "secret", "receiver"),
        smtp=_str(d, "smtp", "receiver"),
        smtp_starttls=starttls,
        smtp_user=_str(d, "smtp_user", "receiver"),
        smtp_password_env=_str(d, "smtp_password_env", "receiver"),
    )


def subscription_from_json(obj: Any) -> Subscription:
    d = _check(obj, _SUBSCRIPTION_KEYS, "subscription")
    receivers = d.get("receivers")
    if not isinstance(receivers, list) or not receivers:
        raise AlertConfigError("subscription needs 'receivers': a non-empty list")
    send_resolved = d.get("send_resolved", True)
    if not isinstance(send_resolved, bool):
        raise AlertConfigError("subscription: 'send_resolved' must be true or false")
    return make_subscription(
        _str(d, "name", "subscription", required=True) or "",
        _str(d, "owner", "subscription", required=True) or "",
        _str_list(d, "match", "subscription"),
        [receiver_from_json(r) for r in receivers],
        team=_str(d, "team", "subscription"),
        group_by=_str_list(d, "group_by", "subscription"),
        group_wait=_str(d, "group_wait", "subscription"),
        group_interval=_str(d, "group_interval", "subscription"),
        repeat=_str(d, "repeat", "subscription"),
        send_resolved=send_resolved,
    )


def silence_from_json(obj: Any) -> Silence:
    d = _check(obj, _SILENCE_KEYS - {"starts"}, "silence")
    return make_silence(
        _str_list(d, "match", "silence"),
        _str(d, "for", "silence", required=True) or "",
        _str(d, "by", "silence", required=True) or "",
        _str(d, "comment", "silence") or "",
    )


@dataclass(frozen=True, slots=True)
class AlertRow:
    """An alert as people see it: its state plus whether a silence, an inhibition or an ack applies now."""

    alert: AlertState
    silenced_by: str | None
    inhibited: bool
    acked_by: str | None


def _alert_json(row: AlertRow) -> dict[str, Any]:
    a = row.alert
    return {
        "fingerprint": a.fingerprint,
        "dedup_key": a.dedup_key,
        "status": a.status.value,
        "labels": a.labels,
        "summary": a.summary,
        "action": a.action,
        "starts_ns": a.starts_ns,
        "ends_ns": a.ends_ns,
        "episode": a.episode,
        "flapping": a.flapping,
        "stale_since_ns": a.stale_since_ns,
        "silenced_by": row.silenced_by,
        "inhibited": row.inhibited,
        "acked_by": row.acked_by,
    }


def subscription_json(s: Subscription) -> dict[str, Any]:
    return {
        "id": s.id,
        "name": s.name,
        "owner": s.owner,
        "team": s.team,
        "match": [str(m) for m in s.matchers],
        "receivers": [
            {k: v for k, v in _receiver_dict(r.redacted()).items() if v not in (None, False)} for r in s.receivers
        ],
        "group_by": list(s.group_by),
        "group_wait_s": s.group_wait_s,
        "group_interval_s": s.group_interval_s,
        "repeat_interval_s": s.repeat_interval_s,
        "send_resolved": s.send_resolved,
        "created_ns": s.created_ns,
    }


def _receiver_dict(r: Receiver) -> dict[str, Any]:
    return {name: getattr(r, name) for name in Receiver.__dataclass_fields__}


def silence_json(s: Silence, now_ns: int) -> dict[str, Any]:
    return {
        "id": s.id,
        "match": [str(m) for m in s.matchers],
        "starts_ns": s.starts_ns,
        "ends_ns": s.ends_ns,
        "state": s.state(now_ns),
        "created_by": s.created_by,
        "comment": s.comment,
    }


class AlertAdmin:
    """Mirrors of the alerting topics plus a publisher; ``start`` before use, ``close`` after."""

    def __init__(self, settings: Settings, clock_ns: Callable[[], int] = time.time_ns, state: bool = True) -> None:
        self.settings = settings
        self.clock_ns = clock_ns
        kafka = settings.kafka.client_config()
        self._config: TopicMirror[ConfigRecord] = TopicMirror(kafka, settings.topics.alert_config, decode_config)
        self._state: TopicMirror[StateRecord] | None = (
            TopicMirror(kafka, settings.topics.alert_state, decode_state) if state else None
        )
        self._pub = Publisher(kafka, linger_ms=0)
        self._rules = parse_inhibit_rules(settings.alerts.inhibit_rules)
        self._targets = TargetPolicy.parse(settings.alerts.allowed_targets)

    def start(self, timeout_s: float = 60.0) -> AlertAdmin:
        for mirror in (self._config, self._state):
            if mirror is not None and not mirror.start().wait_ready(timeout_s):
                raise ServiceError(f"could not read {mirror.topic} within {timeout_s:.0f}s")
        return self

    def close(self) -> None:
        self._config.stop()
        if self._state is not None:
            self._state.stop()
        self._pub.close(10)

    # --- reads ---------------------------------------------------------------------------------------------

    def subscriptions(self) -> list[Subscription]:
        subs = [r for r in self._config.snapshot().values() if isinstance(r, Subscription)]
        return sorted(subs, key=lambda s: (s.created_ns, s.id))

    def silences(self) -> list[Silence]:
        sils = [r for r in self._config.snapshot().values() if isinstance(r, Silence)]
        return sorted(sils, key=lambda s: (s.starts_ns, s.id))

    def alerts(self, status: AlertStatus | None = None) -> list[AlertRow]:
        assert self._state is not None, "AlertAdmin(state=True) to read alerts"
        states = [r for r in self._state.snapshot().values() if isinstance(r, AlertState)]
        config = list(self._config.snapshot().values())
        silences = [r for r in config if isinstance(r, Silence)]
        acks = {r.dedup_key: r for r in config if isinstance(r, Ack)}
        inhibitor = Inhibitor(self._rules, states)
        now = self.clock_ns()
        rows = []
        for a in sorted(states, key=lambda a: (a.status.value, -a.starts_ns, a.dedup_key)):
            if status is not None and a.status is not status:
                continue
            ack = acks.get(a.dedup_key)
            acked = ack.by if ack is not None and a.status is AlertStatus.FIRING and ack.at_ns >= a.starts_ns else None
            firing = a.status is AlertStatus.FIRING
            rows.append(AlertRow(a, silenced_by(a, silences, now), firing and inhibitor.inhibited(a), acked))
        return rows

    def alerts_json(self, status: AlertStatus | None = None) -> list[dict[str, Any]]:
        return [_alert_json(r) for r in self.alerts(status)]

    def find_alert(self, ref: str) -> AlertState:
        """An alert by fingerprint (16 hex digits) or dedup key."""
        for row in self.alerts():
            if ref in (row.alert.fingerprint, row.alert.dedup_key):
                return row.alert
        raise AlertConfigError(
            f"no alert {ref!r} (give a fingerprint or dedup key from `hermeneut alerts list --firing`)"
        )

    # --- writes --------------------------------------------------------------------------------------------

    def _write(self, key: bytes, value: bytes | None, visible: Callable[[], bool]) -> None:
        self._pub.publish(self.settings.topics.alert_config, key, value)
        if self._pub.flush(30.0) or self._pub.stats.failed:
            raise ServiceError(f"could not write to {self.settings.topics.alert_config}: {self._pub.last_error}")
        deadline = time.monotonic() + 30.0
        while not visible() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not visible():
            raise ServiceError(f"wrote to {self.settings.topics.alert_config} but could not read it back within 30s")

    def add(self, record: Subscription | Silence | Ack) -> None:
        """Write a validated record; a subscription's webhook and Slack URLs must name a host that
        ``alerts.allowed_targets`` allows (alerting/targets.py), else AlertConfigError."""
        if isinstance(record, Subscription):
            for r in record.receivers:
                if r.kind in ("webhook", "slack"):
                    self._targets.check_url(r.url or "")
        self._write(record.key, encode_config(record), lambda: self._config.get(record.key) == record)

    def remove_subscription(self, sub_id: str) -> Subscription:
        key = f"subscription/{sub_id}".encode()
        found = self._config.get(key)
        if not isinstance(found, Subscription):
            raise AlertConfigError(f"no subscription {sub_id!r} (see `hermeneut alerts list --subscriptions`)")
        self._write(key, None, lambda: self._config.get(key) is None)
        return found

    def remove_silence(self, silence_id: str) -> Silence:
        key = f"silence/{silence_id}".encode()
        found = self._config.get(key)
        if not isinstance(found, Silence):
            raise AlertConfigError(f"no silence {silence_id!r} (see `hermeneut alerts list --silences`)")
        self._write(key, None, lambda: self._config.get(key) is None)
        return found

    def ack(self, ref: str, by: str, comment: str = "") -> Ack:
        alert = self.find_alert(ref)
        if alert.status is not AlertStatus.FIRING:
            raise AlertConfigError(f"alert {ref!r} is {alert.status.value}, not firing: nothing to acknowledge")
        by, comment = clean_text(by), clean_text(comment)
        if not by:
            raise AlertConfigError("an acknowledgement needs a name (--by)")
        ack = Ack(alert.dedup_key, by, self.clock_ns(), comment)
        self.add(ack)
        return ack
