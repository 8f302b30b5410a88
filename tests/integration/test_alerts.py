"""Alerting end to end on real parts: findings published to the real Kafka, the alert manager running as a
real child process (``hermeneut alerts run``), a real local HTTP receiver (webhook and Slack-style), a real
SMTP server (aiosmtpd), a Kafka receiver topic, and the notification history read back from the real InfluxDB.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from alerting.admin import AlertAdmin, make_receiver, make_subscription
from alerting.model import AlertStatus, Subscription
from hermeneut.cli import cli
from pipeline.config import Settings, settings_env
from pipeline.deadletter import headers_dict
from pipeline.events import Severity
from pipeline.services.stages import Stage, wait_for
from pipeline.topics import TopicSpec, ensure_topics
from tests.integration.alerting_parts import (
    HttpReceiver,
    SmtpReceiver,
    fault,
    publish_findings,
    publish_findings_raw,
    signed_ok,
    start_manager,
    storing_history,
    tail,
    wait_history,
    with_alerts,
)
from tests.integration.harness import consume_all

pytestmark = pytest.mark.integration

SECRET = "integration-secret"


@pytest.fixture
def http() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture
def history_sink(settings: Settings, tmp_path: Path) -> Iterator[Stage]:
    with storing_history(settings, tmp_path / "sink") as sink:
        yield sink


@pytest.fixture
def admin(settings: Settings) -> Iterator[AlertAdmin]:
    a = AlertAdmin(with_alerts(settings)).start()  # the tests' receivers listen on loopback, which it must allow
    yield a
    a.close()


def _cli(settings: Settings, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _stop(stage: Stage) -> None:
    assert stage.stop(30) == 0, tail(stage)


def _webhook_sub(settings: Settings, admin: AlertAdmin, url: str, match: list[str], **kw: object) -> Subscription:
    hook = make_receiver("webhook", url, secret=SECRET)
    sub = make_subscription("hook", "alice", match, [hook], **kw)  # type: ignore[arg-type]
    admin.add(sub)
    return sub


def test_fault_notifies_every_matching_subscription_once_and_resolves(
    settings: Settings,
    http: HttpReceiver,
    admin: AlertAdmin,
    history_sink: Stage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = with_alerts(settings)
    smtp = SmtpReceiver().start()
    notify_topic = f"{settings.topics.alerts}.notify"
    ensure_topics(settings.kafka.client_config(), [TopicSpec(notify_topic, 1, 1)])
    # one subscription through the CLI (secret by environment variable), the others through the admin API
    out = _cli(
        settings,
        monkeypatch,
        "alerts",
        "subscribe",
        "--name",
        "gpu warnings",
        "--owner",
        "alice",
        "--team",
        "gpu-ops",
        "--match",
        'severity=~"warning|critical"',
        "--match",
        'application="llm-pretraining"',
        "--webhook",
        http.url("/cli-hook"),
        "--secret-env",
        "HOOK_SECRET",
        "--group-wait",
        "500ms",
    )
    assert out.startswith("subscribed: ")
    _webhook_sub(settings, admin, http.url("/hook"), ['detector="thermal-throttling"'])
    admin.add(make_subscription("chat", "bob", [], [make_receiver("slack", http.url("/slack"))]))
    admin.add(
        make_subscription(
            "mail", "carol", ['node="n1"'], [make_receiver("email", "ops@example.com", smtp=f"127.0.0.1:{smtp.port}")]
        )
    )
    admin.add(make_subscription("bus", "dave", [], [make_receiver("kafka", notify_topic)]))
    other = _webhook_sub(settings, admin, http.url("/other"), ['application="llm-serving"'])
    manager = start_manager(settings, tmp_path, env={"HOOK_SECRET": SECRET})
    try:
        start = time.time_ns()
        # the processor's rhythm, compressed: start, two repeats, clear
        publish_findings(settings, [fault(settings, True, ts_ns=start)])
        assert wait_for(lambda: len(http.requests) >= 3 and len(smtp.messages) >= 1, 30), tail(manager)
        publish_findings(settings, [fault(settings, True, ts_ns=start + i * 10**9) for i in (1, 2)])
        time.sleep(1.5)
        publish_findings(settings, [fault(settings, False, ts_ns=start + 3 * 10**9)])
        assert wait_for(lambda: len(http.requests) >= 6 and len(smtp.messages) >= 2, 30), tail(manager)
        time.sleep(3)  # anything extra (a duplicate, a repeat) would arrive now
        for path in ("/cli-hook", "/hook", "/slack"):
            assert len(http.on(path)) == 2, (path, [r.path for r in http.requests])
        assert http.on("/other") == []
        for path in ("/cli-hook", "/hook"):
            firing, resolved = (r.json() for r in http.on(path))
            assert (firing["status"], resolved["status"]) == ("firing", "resolved")
            assert firing["version"] == "4" and firing["commonLabels"]["detector"] == "thermal-throttling"
            assert resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
            assert all(signed_ok(r, SECRET) for r in http.on(path))
            assert not signed_ok(http.on(path)[0], "wrong secret")
        assert [r.json()["text"][:9] for r in http.on("/slack")] == ["[FIRING:1", "[RESOLVED"]
        assert [rcpt for rcpt, _ in smtp.messages] == [["ops@example.com"]] * 2
        assert b"Subject: [FIRING:1]" in smtp.messages[0][1] and b"Subject: [RESOLVED:1]" in smtp.messages[1][1]
        bus = consume_all(settings, notify_topic, 2, timeout_s=15)
        assert [m.value() and json.loads(m.value())["status"] for m in bus] == ["firing", "resolved"]
        rows = wait_history(settings, lambda r: len(r) >= 10, outcome="delivered")
        told = sorted((r.receiver_kind, r.status) for r in rows)
        assert told == sorted(
            [(k, s) for k in ("webhook", "webhook", "slack", "email", "kafka") for s in ("firing", "resolved")]
        )
        assert other.id not in {r.subscription for r in rows}
        assert all(r.detector == "thermal-throttling" and r.dedup_key.startswith("thermal-throttling/") for r in rows)
        assert SECRET not in str(rows)
    finally:
        _stop(manager)
        smtp.stop()


def test_silenced_and_inhibited_alerts_send_nothing_and_still_resolve(
    settings: Settings,
    http: HttpReceiver,
    admin: AlertAdmin,
    history_sink: Stage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = with_alerts(settings)
    sub = _webhook_sub(settings, admin, http.url("/all"), [], group_by=["..."])
    out = _cli(settings, monkeypatch, "alerts", "silence", "--match", 'gpu="GPU-2"', "--for", "1h", "--by", "carol")
    assert out.startswith("silenced: ")
    manager = start_manager(settings, tmp_path)
    try:
        publish_findings(
            settings,
            [
                fault(settings, True, gpu="GPU-1"),
                fault(settings, True, gpu="GPU-2"),
                fault(settings, True, detector="fallen-off-bus", gpu="GPU-3", severity=Severity.CRITICAL),
                fault(settings, True, detector="thermal-throttling", gpu="GPU-3"),
            ],
        )
        assert wait_for(lambda: len(http.requests) >= 2, 30), tail(manager)
        time.sleep(2)
        told = sorted((a["labels"]["detector"], a["labels"]["gpu"]) for r in http.requests for a in r.json()["alerts"])
        assert told == [("fallen-off-bus", "GPU-3"), ("thermal-throttling", "GPU-1")]
        listed = {row.alert.labels["gpu"] + "/" + row.alert.labels["detector"]: row for row in admin.alerts()}
        assert listed["GPU-2/thermal-throttling"].silenced_by and listed["GPU-3/thermal-throttling"].inhibited
        publish_findings(settings, [fault(settings, False, gpu="GPU-2")])
        assert wait_for(
            lambda: any(
                r.alert.labels["gpu"] == "GPU-2" and r.alert.status is AlertStatus.RESOLVED for r in admin.alerts()
            ),
            30,
        )
        time.sleep(2)
        assert len(http.requests) == 2  # the silenced one resolved without a word to anyone
        rows = wait_history(settings, lambda r: len(r) >= 4, subscription=sub.id)
        outcomes = sorted((r.outcome, r.dedup_key.split("/")[-1], r.detector) for r in rows if r.outcome != "delivered")
        assert outcomes == [
            ("suppressed-inhibited", "GPU-3", "thermal-throttling"),
            ("suppressed-silence", "GPU-2", "thermal-throttling"),
        ]
        # the rest of the CLI against the same servers
        firing = json.loads(_cli(settings, monkeypatch, "alerts", "list", "--firing", "--format", "json"))
        gpu1 = next(a for a in firing if a["labels"]["gpu"] == "GPU-1")
        assert {a["labels"]["gpu"] for a in firing} == {"GPU-1", "GPU-3"}
        assert _cli(settings, monkeypatch, "alerts", "ack", gpu1["fingerprint"], "--by", "bob").startswith(
            "acknowledged"
        )
        assert "acked by bob" in _cli(settings, monkeypatch, "alerts", "list", "--firing")
        assert "carol" in _cli(settings, monkeypatch, "alerts", "list", "--silences")
        assert sub.id in _cli(settings, monkeypatch, "alerts", "list", "--subscriptions")
        csv_out = _cli(
            settings, monkeypatch, "alerts", "history", "--range", "1h", "--subscription", sub.id, "--format", "csv"
        )
        assert csv_out.splitlines()[0].startswith("time,cluster,subscription,owner") and "suppressed-silence" in csv_out
        silence_id = _cli(settings, monkeypatch, "alerts", "list", "--silences", "--format", "json")
        assert _cli(settings, monkeypatch, "alerts", "unsilence", json.loads(silence_id)[0]["id"]).startswith(
            "unsilenced"
        )
        assert _cli(settings, monkeypatch, "alerts", "unsubscribe", sub.id).startswith("unsubscribed")
    finally:
        _stop(manager)


def test_a_flapping_signal_is_damped_to_one_summary(
    settings: Settings, http: HttpReceiver, admin: AlertAdmin, history_sink: Stage, tmp_path: Path
) -> None:
    settings = with_alerts(settings)
    sub = _webhook_sub(settings, admin, http.url("/flap"), [], group_wait="0s", group_interval="0s")
    manager = start_manager(settings, tmp_path)
    try:
        start = time.time_ns()
        for i in range(10):  # ten changes, 0.4 s apart
            publish_findings(settings, [fault(settings, i % 2 == 0, ts_ns=start + i * 400_000_000)])
            time.sleep(0.4)
        publish_findings_raw(settings, b"not a finding")  # bad input: dead-lettered with its reason, not a crash
        assert wait_for(lambda: any(r.json()["alerts"][0]["annotations"].get("flapping") for r in http.requests), 30)
        time.sleep(4)
        bodies = [r.json() for r in http.requests]
        assert [b["status"] for b in bodies[:3]] == ["firing", "resolved", "firing"]
        assert len(bodies) == 4, [b["status"] for b in bodies]  # ten changes, four notifications
        summary = bodies[-1]["alerts"][0]
        assert summary["status"] == "resolved" and "flapped: " in summary["annotations"]["flapping"]
        rows = wait_history(settings, lambda r: len(r) >= 6, subscription=sub.id, outcome="damped")
        assert len(rows) == 7  # every held change is on the record
        letters = [
            m for m in consume_all(settings, settings.topics.dead_letter, 2, 15) if m.value() == b"not a finding"
        ]
        stages = {headers_dict(m.headers()).get("hermeneut-stage") for m in letters}
        assert "alerting" in stages, letters  # (the InfluxDB sink, which also reads findings, would add its own)
        assert manager.stats()["dead_lettered"] == 1
    finally:
        _stop(manager)


def test_a_dead_receiver_is_retried_and_does_not_hold_up_the_others(
    settings: Settings, http: HttpReceiver, admin: AlertAdmin, history_sink: Stage, tmp_path: Path
) -> None:
    settings = with_alerts(settings)
    down = HttpReceiver()  # its port stays closed until the receiver comes back
    dead = _webhook_sub(settings, admin, down.url("/late"), [])
    live = _webhook_sub(settings, admin, http.url("/live"), [])
    manager = start_manager(settings, tmp_path)
    try:
        sent = time.monotonic()
        publish_findings(settings, [fault(settings, True)])
        assert wait_for(lambda: len(http.on("/live")) == 1, 30), tail(manager)
        assert http.on("/live")[0].at - sent < 5
        rows = wait_history(settings, lambda r: len(r) >= 3, subscription=dead.id, outcome="retrying")
        assert [r.attempt for r in sorted(rows, key=lambda r: r.time)][:3] == [1, 2, 3]
        assert "Connection refused" in rows[0].error or "ConnectionRefused" in rows[0].error or rows[0].error
        down.start()
        try:
            assert wait_for(lambda: len(down.requests) == 1, 30), tail(manager)
            time.sleep(2)
            assert len(down.requests) == 1 and signed_ok(down.requests[0], SECRET)
            assert down.requests[0].json()["status"] == "firing"
            assert len(http.on("/live")) == 1
            delivered = wait_history(settings, lambda r: len(r) >= 1, subscription=dead.id, outcome="delivered")
            assert delivered[0].attempt > 3
            assert {r.subscription for r in wait_history(settings, bool, outcome="delivered")} >= {live.id}
        finally:
            down.stop()
    finally:
        _stop(manager)


def test_state_survives_a_hard_kill_of_the_manager(
    settings: Settings, http: HttpReceiver, admin: AlertAdmin, tmp_path: Path
) -> None:
    """SIGKILL, restart: the firing alert is not told twice, its resolve is told once, and a delivery that was
    still being retried at the kill is delivered by the next run (from the outbox in Kafka)."""
    settings = with_alerts(settings)
    _webhook_sub(settings, admin, http.url("/kept"), [])
    down = HttpReceiver()
    _webhook_sub(settings, admin, down.url("/pending"), [])
    manager = start_manager(settings, tmp_path / "1")
    start = time.time_ns()
    publish_findings(settings, [fault(settings, True, ts_ns=start)])
    assert wait_for(lambda: len(http.on("/kept")) == 1, 30), tail(manager)
    assert wait_for(lambda: manager.stats().get("retries", 0) >= 2, 30), tail(manager)
    manager.proc.kill()
    manager.proc.wait()
    down.start()
    manager = start_manager(settings, tmp_path / "2")
    try:
        assert wait_for(lambda: len(down.requests) == 1, 30), tail(manager)
        assert manager.stats().get("recovered_deliveries") == 1
        publish_findings(settings, [fault(settings, True, ts_ns=start + 10**9)])
        publish_findings(settings, [fault(settings, False, ts_ns=start + 2 * 10**9)])
        assert wait_for(lambda: len(http.on("/kept")) >= 2 and len(down.requests) >= 2, 30), tail(manager)
        time.sleep(2)
        assert [r.json()["status"] for r in http.on("/kept")] == ["firing", "resolved"]
        assert [r.json()["status"] for r in down.requests] == ["firing", "resolved"]
    finally:
        _stop(manager)
        down.stop()


def test_a_fleet_gone_silent_keeps_its_alerts_open_marked_stale(
    settings: Settings, http: HttpReceiver, admin: AlertAdmin, tmp_path: Path
) -> None:
    """The real manager, findings through Kafka: an uncorrectable ECC error and a throttling GPU fire, then no
    finding arrives for three times the staleness limit (the fleet stopped reporting). Both stay firing, marked
    stale since their last finding; the receiver gets no all-clear. A clear then resolves the ECC alert, told once."""
    settings = with_alerts(settings, stale_after_s=2.0)
    _webhook_sub(settings, admin, http.url("/fleet"), [])
    manager = start_manager(settings, tmp_path / "run")
    try:
        start = time.time_ns()
        ecc = fault(settings, True, "ecc-uncorrectable", "GPU-1", severity=Severity.CRITICAL, ts_ns=start)
        publish_findings(settings, [ecc, fault(settings, True, "thermal-throttling", "GPU-2", ts_ns=start)])
        assert wait_for(lambda: manager.stats().get("alerts_firing") == 2, 30), tail(manager)

        def marked() -> bool:
            rows = [r.alert for r in admin.alerts() if r.alert.labels.get("cluster") == settings.cluster]
            return len(rows) == 2 and all(a.stale_since_ns == start for a in rows)

        assert wait_for(marked, 30), tail(manager)
        time.sleep(6)  # three times stale_after_s of silence
        rows = [r.alert for r in admin.alerts() if r.alert.labels.get("cluster") == settings.cluster]
        assert {a.status for a in rows} == {AlertStatus.FIRING}
        assert manager.stats().get("alerts_firing") == 2
        assert all(r.json()["status"] == "firing" for r in http.on("/fleet")), [r.json() for r in http.on("/fleet")]

        cleared = fault(settings, False, "ecc-uncorrectable", "GPU-1", severity=Severity.CRITICAL)
        publish_findings(settings, [cleared])
        assert wait_for(lambda: manager.stats().get("alerts_firing") == 1, 30), tail(manager)
        assert wait_for(lambda: any(r.json()["status"] == "resolved" for r in http.on("/fleet")), 30), tail(manager)
    finally:
        _stop(manager)
