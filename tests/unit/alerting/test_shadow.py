"""Shadow mode: store-only kinds run through the alert lifecycle in a ledger of their own and count the alerts
they would have raised; the report counts the stored episodes per kind."""

from __future__ import annotations

from alerting.lifecycle import LifecycleConfig
from alerting.shadow import Shadow, ShadowRow, report
from pipeline.escalation import Episode
from pipeline.events import Severity
from tests.unit.alerting.helpers import S, finding, settings


def test_the_ledger_counts_each_alert_it_would_have_raised_once() -> None:
    shadow = Shadow(frozenset({"power-brake"}), LifecycleConfig.of(settings(for_s=60)))
    brake = [finding(True, t, "power-brake", since_s=100) for t in (100, 130, 160, 190)]
    assert all(shadow.holds(f) for f in brake) and not shadow.holds(finding(True, 100))
    for f in brake[:2]:
        shadow.apply(f, f.ts_ns)
    assert shadow.counts.alerts == {} and shadow.firing() == 0  # pending: "for" 60 s has not passed
    for f in brake[2:]:
        shadow.apply(f, f.ts_ns)
    assert shadow.counts.alerts == {"power-brake": 1} and shadow.firing() == 1
    shadow.apply(finding(False, 200, "power-brake", since_s=100), 200 * S)
    assert shadow.firing() == 0
    again = finding(True, 900, "power-brake", gpu="GPU-2")
    shadow.apply(again, again.ts_ns)
    shadow.step(961 * S)  # "for" passes on the timer, without a new finding
    assert shadow.counts.alerts == {"power-brake": 2}
    assert shadow.counts.findings == {"power-brake": 6}


def test_the_report_counts_stored_episodes_per_kind_at_their_worst_severity() -> None:
    def point(gpu: str | None, since: int, severity: Severity, detector: str = "power-brake") -> Episode:
        return Episode("c", "n1" if gpu != "G9" else "n2", gpu, detector, severity.value, since * S)

    points = [
        point("G1", 10, Severity.WARNING), point("G1", 10, Severity.CRITICAL), point("G1", 10, Severity.WARNING),
        point("G2", 50, Severity.WARNING), point("G9", 70, Severity.WARNING), point(None, 80, Severity.INFO),
        point("G3", 90, Severity.CRITICAL, detector="thermal-throttling"),  # not in shadow mode
    ]  # fmt: skip
    rows = report(points, frozenset({"power-brake", "hbm-temperature"}))
    assert rows == [
        ShadowRow("hbm-temperature", 0, 0, 0, 0, 0, 0),
        ShadowRow("power-brake", 4, critical=1, warning=2, info=1, gpus=3, nodes=2),
    ]
