"""``hermeneut alerts ...``: the alert manager service and self-service subscriptions, silences, acks, history.

Input is validated before anything connects: a malformed matcher, duration, receiver or query is one line on
stderr and exit code 2.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hermeneut.cli.base import cli, errors, expose, fail, metrics_port_option, resolved, stop_event
from pipeline.config import Settings
from pipeline.errors import InvalidInput, ServiceError
from pipeline.vocab import NS_PER_S, format_duration, parse_seconds

if TYPE_CHECKING:
    from pipeline.escalation import Episode

log = logging.getLogger(__name__)


@contextmanager
def _usage() -> Iterator[None]:
    """Bad user input is a usage error (exit 2), everything else goes through the common mapping."""
    with errors():
        try:
            yield
        except InvalidInput as exc:
            fail(str(exc), 2)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


@cli.group("alerts")
def alerts_group() -> None:
    """Alert lifecycle, subscriptions, silences, acknowledgements and notification history."""


def _stored_episodes(settings: Settings) -> list[Episode]:
    """The finding episodes escalation reads (pipeline.escalation), as stored; none, said on stderr, when InfluxDB
    does not answer: the health topic's escalations then start from the findings the manager sees from now on."""
    from sinks.query.fleet import finding_episodes
    from sinks.query.store import Store

    now = time.time_ns()
    try:
        with Store.from_settings(settings) as store:
            return finding_episodes(store, now - int(settings.health.lookback_s * NS_PER_S), now + NS_PER_S)
    except ServiceError as exc:
        log.warning("no finding history for escalation (%s): it starts from the findings seen from now on", exc)
        return []


@alerts_group.command("run")
@click.option("--stats-file", type=click.Path(path_type=Path))
@metrics_port_option
@click.pass_context
def run_cmd(ctx: click.Context, stats_file: Path | None, metrics_port: int | None) -> None:
    """The alert manager: findings in, notifications out, until SIGTERM/Ctrl-C (then it drains)."""
    from alerting.manager import AlertManager
    from alerting.receivers import EmailSender, HttpSender, KafkaSender, Sender
    from alerting.targets import TargetPolicy
    from pipeline.publisher import Publisher

    settings = resolved(ctx)
    a = settings.alerts
    http = HttpSender(a.external_url, a.http_timeout_s, policy=TargetPolicy.parse(a.allowed_targets))
    kafka_out = Publisher(settings.kafka.client_config(), linger_ms=0)
    senders: dict[str, Sender] = {
        "webhook": http,
        "slack": http,
        "email": EmailSender(a.email_from, a.external_url, a.http_timeout_s),
        "kafka": KafkaSender(kafka_out, a.external_url, a.http_timeout_s),
    }
    stop = stop_event()
    exposed = expose(settings, "alerts", metrics_port)
    with errors():
        past = _stored_episodes(settings)
        manager = AlertManager(settings, senders, stats_file, registry=exposed.registry, past=past)
        manager.start()
    try:
        manager.run(stop)
    finally:
        kafka_out.close(10)
        exposed.close()


@alerts_group.command("subscribe")
@click.option("--name", required=True, help="What this subscription is for.")
@click.option("--owner", required=True, help="Who owns it (a person).")
@click.option("--team", help="The owner's team.")
@click.option("--match", "match", multiple=True, help='Label matcher, e.g. severity=~"warning|critical" (repeatable).')
@click.option("--webhook", multiple=True, help="Webhook URL (Alertmanager JSON, HMAC-signed with --secret-env).")
@click.option("--secret-env", help="Environment variable of the alert manager holding the webhook HMAC secret.")
@click.option("--slack", multiple=True, help="Slack-style incoming webhook URL.")
@click.option("--email", multiple=True, help="E-mail address.")
@click.option("--smtp", help="SMTP server host:port for --email.")
@click.option("--smtp-starttls", is_flag=True, help="Use STARTTLS with the SMTP server.")
@click.option("--smtp-user", help="SMTP login user.")
@click.option("--smtp-password-env", help="Environment variable of the alert manager holding the SMTP password.")
@click.option("--kafka-topic", multiple=True, help="Kafka topic to publish notifications to.")
@click.option("--group-by", help="Comma-separated labels to group by (default: alerts.group_by; ... = none).")
@click.option("--group-wait", help="Wait before a new group's first notification (e.g. 30s).")
@click.option("--group-interval", help="Wait between notifications of a group that changed (e.g. 5m).")
@click.option("--repeat", help="Repeat a group's unchanged firing alerts this often (e.g. 4h).")
@click.option("--no-resolved", is_flag=True, help="Do not send resolved notices.")
@click.pass_context
def subscribe_cmd(
    ctx: click.Context,
    name: str,
    owner: str,
    team: str | None,
    match: tuple[str, ...],
    webhook: tuple[str, ...],
    secret_env: str | None,
    slack: tuple[str, ...],
    email: tuple[str, ...],
    smtp: str | None,
    smtp_starttls: bool,
    smtp_user: str | None,
    smtp_password_env: str | None,
    kafka_topic: tuple[str, ...],
    group_by: str | None,
    group_wait: str | None,
    group_interval: str | None,
    repeat: str | None,
    no_resolved: bool,
) -> None:
    """Subscribe a person or team to the alerts matching --match (all must match; none: every alert)."""
    from alerting.admin import AlertAdmin, make_receiver, make_subscription

    with _usage():
        receivers = [make_receiver("webhook", url, secret_env=secret_env) for url in webhook]
        receivers += [make_receiver("slack", url) for url in slack]
        receivers += [
            make_receiver(
                "email",
                addr,
                smtp=smtp,
                smtp_starttls=smtp_starttls,
                smtp_user=smtp_user,
                smtp_password_env=smtp_password_env,
            )
            for addr in email
        ]
        receivers += [make_receiver("kafka", topic) for topic in kafka_topic]
        sub = make_subscription(
            name,
            owner,
            list(match),
            receivers,
            team=team,
            group_by=group_by.split(",") if group_by else None,
            group_wait=group_wait,
            group_interval=group_interval,
            repeat=repeat,
            send_resolved=not no_resolved,
        )
    settings = resolved(ctx, influxdb=False)
    with _usage():
        admin = AlertAdmin(settings, state=False).start()
        try:
            admin.add(sub)
        finally:
            admin.close()
    click.echo(f"subscribed: {sub.id} ({sub.name}, {len(sub.receivers)} receiver(s))")


@alerts_group.command("unsubscribe")
@click.argument("subscription_id")
@click.pass_context
def unsubscribe_cmd(ctx: click.Context, subscription_id: str) -> None:
    """Delete a subscription (its pending notifications are dropped)."""
    from alerting.admin import AlertAdmin

    settings = resolved(ctx, influxdb=False)
    with _usage():
        admin = AlertAdmin(settings, state=False).start()
        try:
            sub = admin.remove_subscription(subscription_id)
        finally:
            admin.close()
    click.echo(f"unsubscribed: {sub.id} ({sub.name})")


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) if ns else "-"


@alerts_group.command("list")
@click.option("--subscriptions", "what", flag_value="subscriptions", help="Subscriptions (secrets redacted).")
@click.option("--silences", "what", flag_value="silences", help="Silences (active, pending and expired).")
@click.option("--firing", "what", flag_value="firing", default=True, help="Firing alerts (default).")
@click.option("--all", "what", flag_value="all", help="Every known alert (pending, firing, resolved).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def list_cmd(ctx: click.Context, what: str, fmt: str) -> None:
    """List subscriptions, silences or alerts."""
    from alerting.admin import AlertAdmin, silence_json, subscription_json
    from alerting.model import AlertStatus

    settings = resolved(ctx, influxdb=False)
    with _usage():
        admin = AlertAdmin(settings, state=what in ("firing", "all")).start()
        try:
            now = time.time_ns()
            data: list[dict[str, Any]]
            if what == "subscriptions":
                data = [subscription_json(s) for s in admin.subscriptions()]
                rows = [
                    [
                        d["id"],
                        d["name"],
                        d["owner"] + (f" ({d['team']})" if d["team"] else ""),
                        ",".join(d["match"]) or "(all)",
                        ", ".join(f"{r['kind']}" for r in d["receivers"]),
                    ]
                    for d in data
                ]
                header = ["id", "name", "owner", "match", "receivers"]
            elif what == "silences":
                data = [silence_json(s, now) for s in admin.silences()]
                rows = [
                    [d["id"], d["state"], ",".join(d["match"]), _when(d["ends_ns"]), d["created_by"], d["comment"]]
                    for d in data
                ]
                header = ["id", "state", "match", "ends (UTC)", "by", "comment"]
            else:
                data = admin.alerts_json(AlertStatus.FIRING if what == "firing" else None)
                rows = [
                    [
                        d["fingerprint"],
                        d["status"]
                        + (" (flapping)" if d["flapping"] else "")
                        + (f" (stale since {_when(d['stale_since_ns'])})" if d["stale_since_ns"] else ""),
                        d["labels"].get("severity", ""),
                        d["dedup_key"],
                        _when(d["starts_ns"]),
                        "silenced"
                        if d["silenced_by"]
                        else "inhibited"
                        if d["inhibited"]
                        else f"acked by {d['acked_by']}"
                        if d["acked_by"]
                        else "",
                        d["summary"],
                    ]
                    for d in data
                ]
                header = ["fingerprint", "status", "severity", "alert", "since (UTC)", "note", "summary"]
        finally:
            admin.close()
    click.echo(json.dumps(data, indent=1) if fmt == "json" else _table(header, rows) if rows else f"(no {what})")


@alerts_group.command("silence")
@click.option("--match", "match", multiple=True, required=True, help='Label matcher, e.g. node="n7" (repeatable).')
@click.option("--for", "duration", required=True, help="How long, e.g. 2h.")
@click.option("--comment", default="", help="Why.")
@click.option("--by", default=None, help="Who (default: your user name).")
@click.pass_context
def silence_cmd(ctx: click.Context, match: tuple[str, ...], duration: str, comment: str, by: str | None) -> None:
    """Mute matching alerts for a while (they still resolve, and what was told still gets its resolved notice)."""
    from alerting.admin import AlertAdmin, make_silence

    with _usage():
        silence = make_silence(list(match), duration, by or _user(), comment)
    settings = resolved(ctx, influxdb=False)
    with _usage():
        admin = AlertAdmin(settings, state=False).start()
        try:
            admin.add(silence)
        finally:
            admin.close()
    length = format_duration(silence.ends_ns - silence.starts_ns)
    click.echo(f"silenced: {silence.id} until {_when(silence.ends_ns)} UTC ({length})")


@alerts_group.command("unsilence")
@click.argument("silence_id")
@click.pass_context
def unsilence_cmd(ctx: click.Context, silence_id: str) -> None:
    """End a silence now."""
    from alerting.admin import AlertAdmin

    settings = resolved(ctx, influxdb=False)
    with _usage():
        admin = AlertAdmin(settings, state=False).start()
        try:
            admin.remove_silence(silence_id)
        finally:
            admin.close()
    click.echo(f"unsilenced: {silence_id}")


@alerts_group.command("ack")
@click.argument("alert")
@click.option("--by", default=None, help="Who (default: your user name).")
@click.option("--comment", default="")
@click.pass_context
def ack_cmd(ctx: click.Context, alert: str, by: str | None, comment: str) -> None:
    """Acknowledge a firing ALERT (fingerprint or dedup key): no repeats until it resolves (that still notifies)."""
    from alerting.admin import AlertAdmin

    settings = resolved(ctx, influxdb=False)
    with _usage():
        admin = AlertAdmin(settings).start()
        try:
            ack = admin.ack(alert, by or _user(), comment)
        finally:
            admin.close()
    click.echo(f"acknowledged: {ack.dedup_key} by {ack.by}")


@alerts_group.command("shadow")
@click.option("--range", "range_", default="24h", show_default=True, help="How far back.")
@click.option("--cluster", help="Only this cluster.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def shadow_cmd(ctx: click.Context, range_: str, cluster: str | None, fmt: str) -> None:
    """What the store-only kinds (alerts.shadow) would have raised over the range, from their stored findings: per
    kind, the alerts (one per episode), their severity, and the GPUs and nodes they were on."""
    from alerting.shadow import report
    from sinks.query.fleet import finding_episodes
    from sinks.query.store import Store

    with _usage():
        span_ns = int(parse_seconds(range_, "--range") * NS_PER_S)
    settings = resolved(ctx, kafka=False)
    kinds = settings.alerts.shadow_kinds
    if not kinds:
        fail("no kind runs in shadow mode: set alerts.shadow (HERMENEUT_ALERTS__SHADOW), e.g. power-brake", 2)
    with errors(), Store.from_settings(settings) as store:
        now = time.time_ns()
        rows = report(finding_episodes(store, now - span_ns, now + NS_PER_S, cluster), kinds)
    if fmt == "json":
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
        return
    click.echo(f"shadow mode (store-only, never alerted) over {range_}: what it would have raised")
    for r in rows:
        click.echo(
            f"  {r.kind}: {r.episodes} alerts ({r.critical} critical, {r.warning} warning, {r.info} info) "
            f"on {r.gpus} GPUs of {r.nodes} nodes"
        )


@alerts_group.command("history")
@click.option("--range", "range_", default="24h", show_default=True, help="How far back.")
@click.option("--subscription", help="Only this subscription id.")
@click.option("--detector", help="Only this detector.")
@click.option(
    "--outcome",
    help="delivered, retrying, failed, suppressed-silence, suppressed-inhibited, suppressed-maintenance, damped.",
)
@click.option("--status", help="firing or resolved.")
@click.option("--limit", default=1000, show_default=True, type=int)
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True)
@click.pass_context
def history_cmd(
    ctx: click.Context,
    range_: str,
    subscription: str | None,
    detector: str | None,
    outcome: str | None,
    status: str | None,
    limit: int,
    fmt: str,
) -> None:
    """What fired, who was told, when, and how it went (newest first)."""
    from sinks.query.alerts import HistoryQuery, format_history, run_history

    query = HistoryQuery(range_, subscription, detector, outcome, status, limit=limit)
    with _usage():
        query.validate()
    settings = resolved(ctx, kafka=False)
    with _usage():
        rows = run_history(settings, query)
    click.echo(format_history(rows, fmt))
