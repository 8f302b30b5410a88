"""The engine with an injected clock: who is told what and when (grouping timers, repeats, acks, silences,
inhibition, flap damping), exactly as the manager runs it."""

from __future__ import annotations

import dataclasses
from typing import Any

from alerting.admin import make_receiver, make_silence, make_subscription
from alerting.engine import AlertEngine
from alerting.grouping import Notification
from alerting.inhibit import parse_inhibit_rules
from alerting.model import Ack, AlertStatus, Silence, Subscription
from pipeline.config import DEFAULT_INHIBIT_RULES, AlertSettings
from pipeline.events import Finding, Severity
from tests.unit.alerting.helpers import S, finding, settings


def sub(match: list[str], **kwargs: object) -> Subscription:
    return make_subscription("s", "alice", match, [make_receiver("kafka", "out")], now_ns=0, **kwargs)  # type: ignore[arg-type]


class Clocked:
    """An engine, a clock, and every notification per subscription."""

    def __init__(self, cfg: AlertSettings, subs: list[Subscription], silences: list[Silence] | None = None) -> None:
        self.engine = AlertEngine(cfg, parse_inhibit_rules(cfg.inhibit_rules))
        self.subs, self.silences, self.acks = subs, silences or [], list[Ack]()
        self.engine.configure(subs, self.silences, [])
        self.sent: dict[str, list[Notification]] = {s.id: [] for s in subs}
        self.held: list[tuple[str, str, str]] = []  # (subscription, dedup key, why)

    def at(self, t_s: float, *findings: Finding) -> None:
        for f in findings:
            self.engine.apply(f)
        result = self.engine.step(int(t_s * S))
        for s, n in result.notifications:
            self.sent[s.id].append(n)
        self.held += [(s.id, h.alert.dedup_key, h.why) for s, h in result.suppressed]

    def ack(self, key: str, t_s: float) -> None:
        self.acks.append(Ack(key, "bob", int(t_s * S)))
        self.engine.configure(self.subs, self.silences, self.acks)

    def statuses(self, sub_id: str) -> list[tuple[str, str, int]]:
        return [(n.status.value, n.reason, len(n.alerts)) for n in self.sent[sub_id]]


def test_one_fault_one_notification_per_matching_subscription_then_one_resolved() -> None:
    warn = sub(['severity=~"warning|critical"'])
    app = sub(['application="llm-pretraining"', 'detector="thermal-throttling"'])
    other = sub(['application="llm-serving"'])
    c = Clocked(settings(), [warn, app, other])
    for t in range(100, 400, 60):  # the detector repeats the finding every 60 s
        c.at(t, finding(True, t, since_s=70))
    c.at(420, finding(False, 420))
    for s in (warn, app):
        assert c.statuses(s.id) == [("firing", "firing", 1), ("resolved", "resolved", 1)]
    assert c.sent[other.id] == []
    firing, resolved = c.sent[warn.id]
    assert firing.alerts[0].annotations["summary"] == "thermal-throttling on n1/GPU-1"
    assert resolved.alerts[0].ends_ns == 420 * S and resolved.alerts[0].starts_ns == 100 * S
    assert firing.group_labels == {"cluster": "c1", "node": "n1", "detector": "thermal-throttling"}


def test_group_wait_batches_and_group_interval_spaces_notifications() -> None:
    s = sub([], group_wait="30s", group_interval="5m")
    c = Clocked(settings(), [s])
    c.at(100, finding(True, 100, gpu="GPU-1"))
    c.at(110, finding(True, 110, gpu="GPU-2"))
    c.at(129)
    assert c.sent[s.id] == []
    c.at(130)
    assert c.statuses(s.id) == [("firing", "firing", 2)]  # both GPUs of the node in one notification
    c.at(140, finding(True, 140, gpu="GPU-3"))
    for t in range(160, 430, 60):  # the detector repeats what is still active
        c.at(t, *(finding(True, t, gpu=g) for g in ("GPU-1", "GPU-2", "GPU-3")))
    c.at(429)
    assert len(c.sent[s.id]) == 1
    c.at(430)
    assert c.statuses(s.id)[-1] == ("firing", "firing", 3)
    c.at(440, finding(False, 440, gpu="GPU-1"), finding(False, 440, gpu="GPU-2"), finding(False, 440, gpu="GPU-3"))
    c.at(730)
    assert c.statuses(s.id)[-1] == ("resolved", "resolved", 3)


def test_repeat_interval_and_ack() -> None:
    s = sub([], repeat="1h")
    c = Clocked(settings(), [s])
    start = 1000
    for t in range(start, start + 3600, 60):
        c.at(t, finding(True, t))
    c.at(start + 3600, finding(True, start + 3600))
    assert c.statuses(s.id) == [("firing", "firing", 1), ("firing", "repeat", 1)]
    c.ack("thermal-throttling/c1/n1/GPU-1", start + 3610)
    for t in range(start + 3660, start + 3600 * 3, 60):
        c.at(t, finding(True, t))
    assert len(c.sent[s.id]) == 2  # acknowledged: no more repeats...
    c.at(start + 3600 * 3, finding(False, start + 3600 * 3))
    assert c.statuses(s.id)[-1] == ("resolved", "resolved", 1)  # ...but the resolve is told
    c.at(start + 4 * 3600, finding(True, start + 4 * 3600))  # a new episode: the old ack does not cover it
    assert c.statuses(s.id)[-1] == ("firing", "firing", 1)
    assert not c.engine.acked(c.engine.alerts["thermal-throttling/c1/n1/GPU-1"])


def test_silenced_alert_sends_nothing_and_still_resolves() -> None:
    s = sub([])
    silence = make_silence(['gpu="GPU-1"'], "1h", "carol", now_ns=0)
    c = Clocked(settings(), [s], [silence])
    c.at(100, finding(True, 100, gpu="GPU-1"), finding(True, 100, gpu="GPU-2", node="n2"))
    for t in (160, 220):
        c.at(t, finding(True, t, gpu="GPU-1"), finding(True, t, gpu="GPU-2", node="n2"))
    assert [n.alerts[0].labels["gpu"] for n in c.sent[s.id]] == ["GPU-2"]
    assert c.held == [(s.id, "thermal-throttling/c1/n1/GPU-1", "silence")]  # recorded once, not per repeat
    c.at(300, finding(False, 300, gpu="GPU-1"))
    assert c.engine.alerts["thermal-throttling/c1/n1/GPU-1"].status is AlertStatus.RESOLVED
    c.at(1000)
    told = [n.alerts[0].labels["gpu"] for n in c.sent[s.id]]
    assert "GPU-1" not in told  # no resolved notice for what nobody was told


def test_a_node_in_a_maintenance_window_pages_nobody_and_its_alerts_are_kept() -> None:
    s = sub([])
    c = Clocked(settings(), [s])

    def drained(t: float, active: bool = True) -> Finding:
        return dataclasses.replace(finding(active, t, gpu="GPU-1"), maintenance="slurm IDLE+DRAIN: swap PSU 2")

    for t in (100, 160, 220):
        c.at(t, drained(t), finding(True, t, gpu="GPU-2", node="n2"))
    assert [n.alerts[0].labels["gpu"] for n in c.sent[s.id]] == ["GPU-2"]
    assert c.held == [(s.id, "thermal-throttling/c1/n1/GPU-1", "maintenance")]
    kept = c.engine.alerts["thermal-throttling/c1/n1/GPU-1"]
    assert kept.status is AlertStatus.FIRING and kept.labels["maintenance"] == "slurm IDLE+DRAIN: swap PSU 2"


def test_when_a_silence_ends_a_still_firing_alert_is_told() -> None:
    s = sub([])
    silence = make_silence(['gpu="GPU-1"'], "5m", "carol", now_ns=0)
    c = Clocked(settings(), [s], [silence])
    for t in range(100, 420, 60):
        c.at(t, finding(True, t))
    assert c.statuses(s.id) == [("firing", "firing", 1)]
    assert c.sent[s.id][0].alerts[0].starts_ns == 100 * S


def test_a_page_gets_its_all_clear_even_under_a_later_silence() -> None:
    s = sub([])
    c = Clocked(settings(), [s])
    c.at(100, finding(True, 100))
    c.silences.append(make_silence(['gpu="GPU-1"'], "1h", "carol", now_ns=110 * S))
    c.engine.configure(c.subs, c.silences, [])
    c.at(160, finding(True, 160))
    c.at(200, finding(False, 200))
    assert c.statuses(s.id) == [("firing", "firing", 1), ("resolved", "resolved", 1)]


def test_fallen_off_bus_inhibits_that_gpus_other_alerts_and_node_silent_the_node() -> None:
    s = sub([], group_by=["..."])
    c = Clocked(settings(inhibit_rules=DEFAULT_INHIBIT_RULES), [s])
    c.at(
        100,
        finding(True, 100, detector="fallen-off-bus", severity=Severity.CRITICAL),
        finding(True, 100, detector="thermal-throttling", gpu="GPU-1"),
        finding(True, 100, detector="thermal-throttling", gpu="GPU-2"),
    )
    told = sorted((n.alerts[0].labels["detector"], n.alerts[0].labels["gpu"]) for n in c.sent[s.id])
    assert told == [("fallen-off-bus", "GPU-1"), ("thermal-throttling", "GPU-2")]
    assert c.held == [(s.id, "thermal-throttling/c1/n1/GPU-1", "inhibited")]
    c.at(150, finding(True, 150, detector="node-silent", gpu=None), finding(True, 150, detector="xid", gpu="GPU-3"))
    assert ("xid", "GPU-3") not in [
        (n.alerts[0].labels["detector"], n.alerts[0].labels.get("gpu")) for n in c.sent[s.id]
    ]
    assert (s.id, "xid/c1/n1/GPU-3", "inhibited") in c.held


def test_flapping_is_damped_to_one_summary() -> None:
    s = sub([])
    c = Clocked(settings(flap_threshold=4, flap_window_s=600, flap_quiet_s=300), [s])
    t = 100
    for i in range(10):  # 10 changes, 30 s apart
        c.at(t, finding(i % 2 == 0, t))
        t += 30
    assert c.statuses(s.id) == [("firing", "firing", 1), ("resolved", "resolved", 1), ("firing", "firing", 1)]
    assert [why for _, _, why in c.held] == ["damped"] * 7  # every held change is on the record
    c.at(t + 200)
    assert len(c.sent[s.id]) == 3  # still within the quiet period
    c.at(t + 400)
    assert len(c.sent[s.id]) == 4
    summary = c.sent[s.id][-1]
    assert (summary.status, summary.reason) == (AlertStatus.RESOLVED, "flap-summary")
    assert "flapped: 10 firing/resolved changes in 3.0 min" in summary.alerts[0].annotations["flapping"]
    c.at(t + 2000)
    assert len(c.sent[s.id]) == 4


def test_send_resolved_false_and_subscription_removal() -> None:
    quiet = sub([], send_resolved=False)
    c = Clocked(settings(), [quiet])
    c.at(100, finding(True, 100))
    c.at(200, finding(False, 200))
    assert c.statuses(quiet.id) == [("firing", "firing", 1)]
    c.engine.configure([], [], [])
    result = c.engine.step(300 * S)
    assert [g.subscription_id for g in result.dropped_groups] == [quiet.id]


def test_a_fleet_that_stops_reporting_keeps_its_alerts_open_and_marked_stale() -> None:
    """Every node goes dark at t=400 with an uncorrectable ECC error and a throttling GPU firing: a day of silence
    resolves neither (no all-clear is sent), both are marked stale with the last finding's time, and the next
    repeat or clear is the only thing that ends the mark or the alert."""
    everything = sub(['severity=~"warning|critical"'])
    c = Clocked(settings(stale_after_s=180), [everything])
    ecc: dict[str, Any] = {"detector": "ecc-uncorrectable", "gpu": "GPU-2", "severity": Severity.CRITICAL}
    for t in range(100, 401, 60):
        c.at(t, finding(True, t, since_s=100), finding(True, t, since_s=100, **ecc))
    told = len(c.sent[everything.id])
    for t in range(420, 86_400, 600):
        c.at(t)
    assert {a.status for a in c.engine.alerts.values()} == {AlertStatus.FIRING}
    assert {a.stale_since_ns for a in c.engine.alerts.values()} == {400 * S}
    assert all(n.status is AlertStatus.FIRING for n in c.sent[everything.id][told:])  # no all-clear, ever
    assert c.engine.firing() == 2
    c.at(86_460, finding(False, 86_460, **ecc))
    c.at(86_460 + 400)
    ecc_alert = next(a for a in c.engine.alerts.values() if a.labels["detector"] == "ecc-uncorrectable")
    assert ecc_alert.status is AlertStatus.RESOLVED and ecc_alert.resolved_reason == "cleared"
    assert c.engine.firing() == 1
