"""Receivers: what a notification looks like on the wire, how it is signed, and the senders that deliver it.

* webhook: Alertmanager's webhook JSON (version 4) so existing tooling takes it, plus
  ``X-Hermeneut-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` when the receiver has a
  secret (Stripe's scheme: the timestamp is signed, so a captured request cannot be replayed later; check it
  with :func:`verify_signature`) and ``X-Hermeneut-Delivery: <id>`` (the same id on every retry, so a receiver
  can drop the duplicate a crash can cause).
* slack: an incoming-webhook message (``text`` + ``blocks``).
* email: a plain-text mail through SMTP (STARTTLS and login optional).
* kafka: the webhook JSON published to a topic, keyed by the group key.

Each sender returns a :class:`SendResult`; only the delivery workers call them. Transient failures (connection
refused, timeouts, HTTP 408/429/5xx, SMTP 4xx) are retried; others (HTTP 4xx, SMTP 5xx, a missing secret) are
permanent. Secrets are read at send time and never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import smtplib
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any, Protocol

import urllib3

from alerting.model import AlertStatus, AlertView, Delivery, Receiver
from alerting.targets import TargetPolicy
from pipeline.errors import AlertConfigError
from pipeline.publisher import Publisher

SIGNATURE_HEADER = "X-Hermeneut-Signature"
DELIVERY_HEADER = "X-Hermeneut-Delivery"
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not ended"


@dataclass(frozen=True, slots=True)
class SendResult:
    ok: bool
    retry: bool = False
    http_status: int = 0
    error: str = ""


def _rfc3339(ns: int) -> str:
    if ns <= 0:
        return _ZERO_TIME
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _common(items: list[dict[str, str]]) -> dict[str, str]:
    if not items:
        return {}
    first = items[0]
    return {k: v for k, v in first.items() if all(i.get(k) == v for i in items[1:])}


def webhook_payload(d: Delivery, receiver_name: str, external_url: str) -> dict[str, Any]:
    """Alertmanager's webhook payload (version 4) for one notification."""
    alerts = [_alert_json(a, external_url) for a in d.alerts]
    return {
        "version": "4",
        "groupKey": f"{d.subscription_id}:{d.group_key}",
        "truncatedAlerts": 0,
        "status": d.status.value,
        "receiver": receiver_name,
        "groupLabels": dict(d.group_labels),
        "commonLabels": _common([a.labels for a in d.alerts]),
        "commonAnnotations": _common([a.annotations for a in d.alerts]),
        "externalURL": external_url,
        "alerts": alerts,
    }


def _alert_json(a: AlertView, external_url: str) -> dict[str, Any]:
    return {
        "status": a.status.value,
        "labels": dict(a.labels),
        "annotations": dict(a.annotations),
        "startsAt": _rfc3339(a.starts_ns),
        "endsAt": _rfc3339(a.ends_ns) if a.status is AlertStatus.RESOLVED else _ZERO_TIME,
        "generatorURL": f"{external_url.rstrip('/')}/alerts/{a.fingerprint}",
        "fingerprint": a.fingerprint,
    }


def sign(secret: str, body: bytes, t: int) -> str:
    """The signature header value for ``body`` sent at unix time ``t``."""
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(secret: str, header: str, body: bytes, now_s: float, tolerance_s: float = 300.0) -> bool:
    """True when ``header`` is a valid signature of ``body`` made within ``tolerance_s`` of ``now_s``."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now_s - t) > tolerance_s:
        return False
    expected = sign(secret, body, t).split("v1=", 1)[1]
    return any(hmac.compare_digest(expected, v) for k, v in parts.items() if k == "v1")


def headline(d: Delivery) -> str:
    """``[FIRING:2] thermal-throttling dc1/n7`` : one line for chat and mail subjects."""
    firing = sum(a.status is AlertStatus.FIRING for a in d.alerts)
    count = firing if d.status is AlertStatus.FIRING else len(d.alerts)
    what = " ".join(v for _, v in sorted(d.group_labels.items()) if v) or d.group_key
    prefix = "[FLAPPING-SUMMARY] " if d.reason == "flap-summary" else ""
    return f"{prefix}[{d.status.value.upper()}:{count}] {what}"


def text_body(d: Delivery, external_url: str) -> str:
    lines = [headline(d), ""]
    for a in d.alerts:
        where = "/".join(a.labels.get(x, "") for x in ("cluster", "node", "gpu") if a.labels.get(x))
        lines.append(
            f"- {a.status.value.upper()} {a.labels.get('detector', '')} {where}: {a.annotations.get('summary', '')}"
        )
        for name in ("action", "flapping", "stale", "resolved_reason"):
            if name in a.annotations:
                lines.append(f"  {name}: {a.annotations[name]}")
        lines.append(f"  since {_rfc3339(a.starts_ns)}" + (f", ended {_rfc3339(a.ends_ns)}" if a.ends_ns else ""))
        lines.append(f"  {external_url.rstrip('/')}/alerts/{a.fingerprint}")
    return "\n".join(lines)


def slack_payload(d: Delivery, external_url: str) -> dict[str, Any]:
    body = text_body(d, external_url)
    return {
        "text": headline(d),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": headline(d)[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": "```" + body.split("\n", 2)[-1][:2900] + "```"}},
        ],
    }


class Sender(Protocol):
    def __call__(self, d: Delivery, r: Receiver) -> SendResult: ...


class HttpSender:
    """Webhook and Slack receivers over one urllib3 pool (connections are reused per address).

    Each request goes to an address :class:`~alerting.targets.TargetPolicy` checked (loopback, link-local and
    metadata targets refused unless allowed), with the URL's name as Host header and TLS server name."""

    def __init__(
        self,
        external_url: str,
        timeout_s: float,
        clock: Callable[[], float] = time.time,
        policy: TargetPolicy | None = None,
    ) -> None:
        self._http = urllib3.PoolManager(num_pools=64, maxsize=4, retries=False)
        self._timeout = urllib3.Timeout(connect=min(timeout_s, 5.0), read=timeout_s)
        self._external_url = external_url
        self._clock = clock
        self._policy = policy or TargetPolicy()

    def __call__(self, d: Delivery, r: Receiver) -> SendResult:
        headers = {"Content-Type": "application/json", "User-Agent": "hermeneut-alerts", DELIVERY_HEADER: d.id}
        if r.kind == "slack":
            body = json.dumps(slack_payload(d, self._external_url)).encode()
        else:
            payload = webhook_payload(d, f"{d.subscription_id}/{d.receiver_index}", self._external_url)
            body = json.dumps(payload, separators=(",", ":")).encode()
            secret = r.secret
            if r.secret_env is not None:
                secret = os.environ.get(r.secret_env)
                if not secret:
                    return SendResult(False, error=f"secret environment variable {r.secret_env} is not set")
            if secret:
                headers[SIGNATURE_HEADER] = sign(secret, body, int(self._clock()))
        try:
            resp = self._post(r.url or "", body, headers)
        except AlertConfigError as exc:
            return SendResult(False, error=f"target refused: {exc}"[:300])
        except (urllib3.exceptions.HTTPError, OSError) as exc:  # OSError: the name does not resolve (now)
            error = _scrub(f"{type(exc).__name__}: {_reason(exc)}", r.url or "")
            return SendResult(False, retry=True, error=error[:300])
        status = resp.status
        if 200 <= status < 300:
            return SendResult(True, http_status=status)
        retry = status in (408, 425, 429) or status >= 500
        return SendResult(False, retry=retry, http_status=status, error=f"HTTP {status}: {resp.data[:200]!r}")

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> urllib3.BaseHTTPResponse:
        """POST to the checked address of the URL's host (the name still given as Host and TLS server name)."""
        self._policy.check_url(url)  # a receiver made before the URL checks of today is held to them too
        parsed = urllib3.util.parse_url(url)
        scheme, host = parsed.scheme or "http", parsed.host or ""
        port = parsed.port or (443 if scheme == "https" else 80)
        address = self._policy.resolve(host, port)
        pool_kwargs: dict[str, Any] = {}
        if scheme == "https":
            pool_kwargs = {"server_hostname": host.strip("[]"), "assert_hostname": host.strip("[]")}
        pool = self._http.connection_from_host(address, port, scheme, pool_kwargs=pool_kwargs)
        netloc = host if parsed.port is None else f"{host}:{parsed.port}"
        return pool.urlopen(
            "POST",
            parsed.request_uri,
            body=body,
            headers=headers | {"Host": netloc},
            timeout=self._timeout,
            retries=False,
            redirect=False,
        )


def _scrub(text: str, url: str) -> str:
    """Error text without the URL's path and query: a Slack-style URL's path is its secret."""
    rest = url.split("://", 1)[-1]
    path = rest[rest.find("/") :] if "/" in rest else ""
    for secret in (url, path):
        if len(secret) > 1:
            text = text.replace(secret, "/…")
    return text


def _reason(exc: Exception) -> str:
    inner = getattr(exc, "reason", None)
    return str(inner or exc)


class EmailSender:
    def __init__(self, sender: str, external_url: str, timeout_s: float) -> None:
        self._from, self._external_url, self._timeout = sender, external_url, timeout_s

    def __call__(self, d: Delivery, r: Receiver) -> SendResult:
        msg = EmailMessage()
        msg["Subject"] = headline(d)
        msg["From"] = self._from
        msg["To"] = r.to or ""
        msg["X-Hermeneut-Delivery"] = d.id
        msg.set_content(text_body(d, self._external_url))
        password = None
        if r.smtp_password_env is not None:
            password = os.environ.get(r.smtp_password_env)
            if not password:
                return SendResult(False, error=f"SMTP password variable {r.smtp_password_env} is not set")
        try:
            with smtplib.SMTP(r.smtp_host or "", r.smtp_port or 25, timeout=self._timeout) as smtp:
                if r.smtp_starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if r.smtp_user and password:
                    smtp.login(r.smtp_user, password)
                smtp.send_message(msg)
        except smtplib.SMTPResponseException as exc:
            return SendResult(
                False, retry=400 <= exc.smtp_code < 500, http_status=exc.smtp_code, error=f"SMTP {exc.smtp_code}"
            )
        except (smtplib.SMTPException, OSError) as exc:
            return SendResult(False, retry=True, error=f"{type(exc).__name__}: {exc}"[:300])
        return SendResult(True, http_status=250)


class KafkaSender:
    """Publishes the webhook JSON to the receiver's topic and waits for the broker's acknowledgement."""

    def __init__(self, publisher: Publisher, external_url: str, timeout_s: float) -> None:
        self._pub, self._external_url, self._timeout = publisher, external_url, timeout_s

    def __call__(self, d: Delivery, r: Receiver) -> SendResult:
        payload = webhook_payload(d, f"{d.subscription_id}/{d.receiver_index}", self._external_url)
        failed_before = self._pub.stats.failed
        self._pub.publish(
            r.topic or "",
            f"{d.subscription_id}:{d.group_key}".encode(),
            json.dumps(payload).encode(),
            [(DELIVERY_HEADER, d.id.encode())],
        )
        if self._pub.flush(self._timeout):
            return SendResult(False, retry=True, error="not acknowledged by Kafka in time")
        if self._pub.stats.failed > failed_before:
            return SendResult(False, retry=True, error=f"Kafka: {self._pub.last_error}")
        return SendResult(True)
