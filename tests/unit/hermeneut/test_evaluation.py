"""The evaluation's scoring rules (hermeneut/jobs/evaluation.py): every finding a user sees counts, extra alerts
inside a fault are counted per fault, matching is tight, undetectable tails are excluded and counted, recall per
magnitude band, false alarms per kind and severity, and the acceptance verdict."""

from __future__ import annotations

import pytest

from hermeneut.jobs.evalreport import format_table
from hermeneut.jobs.evaluation import (
    DAY_S,
    GRACE_S,
    MIN_VISIBLE_S,
    PAGING,
    Thresholds,
    classify_score,
    combine,
    episodes,
    failures,
    healthy_gpu_days,
    score,
    truths,
)
from pipeline.events import FaultRecord, Finding, Severity
from pipeline.kinds import FAULTS

S = 1_000_000_000
T0 = 1_700_000_000 * S
END = T0 + int(DAY_S * S)
OBSERVED = {("c", "n1", f"G{i}"): (T0, END) for i in range(4)}


def finding(detector: str, gpu: str | None, since_s: float, ts_s: float | None = None, active: bool = True,
            node: str = "n1", severity: Severity = Severity.WARNING) -> Finding:  # fmt: skip
    since = T0 + int(since_s * S)
    ts = since if ts_s is None else T0 + int(ts_s * S)
    return Finding(detector, severity, active, "c", node, gpu, "H100", ts, since, "s")


def fault(kind: str, gpu: str | None, start_s: float, end_s: float, node: str = "n1",
          magnitude: float | None = None) -> FaultRecord:  # fmt: skip
    return FaultRecord("c", node, gpu, kind, T0 + int(start_s * S), T0 + int(end_s * S), magnitude=magnitude)


def by(ev: object, kind: str):  # type: ignore[no-untyped-def]
    return next(c for c in ev.classes if c.fault == kind)  # type: ignore[attr-defined]


def test_an_episode_runs_from_its_start_to_its_clear_at_its_highest_severity() -> None:
    found = [
        finding("thermal-throttling", "G1", 100),
        finding("thermal-throttling", "G1", 100, 160, severity=Severity.CRITICAL),
        finding("thermal-throttling", "G1", 100, 300, active=False),
        finding("thermal-throttling", "G1", 900),
    ]
    eps = episodes(found, END)
    assert [(e.start_ns, e.end_ns, e.severity) for e in eps] == [
        (T0 + 100 * S, T0 + 300 * S, Severity.CRITICAL),
        (T0 + 900 * S, END, Severity.WARNING),
    ]


def test_precision_recall_and_flapping_counted_as_extra_alerts() -> None:
    faults = [fault("thermal-throttling", "G1", 100, 400), fault("thermal-throttling", "G2", 1000, 1300),
              fault("thermal-throttling", "G3", 5000, 5200)]  # fmt: skip
    found = [
        finding("thermal-throttling", "G1", 110, 200, active=False),  # detected after 10 s ...
        finding("thermal-throttling", "G1", 350),  # ... and it flapped: a second alert inside the same fault
        finding("thermal-throttling", "G2", 1340),  # 40 s after the end: inside the 60 s grace, detected
        finding("thermal-throttling", "G0", 2000),  # nothing there: a false alarm
    ]
    ev = score(found, faults, OBSERVED, run_end_ns=END)
    thermal = by(ev, "thermal-throttling")
    assert (thermal.faults, thermal.detected, thermal.episodes, thermal.true_episodes) == (3, 2, 4, 3)
    assert thermal.precision == pytest.approx(0.75) and thermal.recall == pytest.approx(2 / 3)
    assert thermal.delays_s == (10.0, 340.0)
    assert sorted(thermal.alerts_per_fault) == [0, 1, 2]
    assert ev.false_alarms == {("thermal-throttling", Severity.WARNING): 1}


def test_other_kinds_inside_a_fault_are_extra_alerts_elsewhere_false_alarms() -> None:
    faults = [fault("nvlink-down", "G1", 1000, 2000)]
    found = [
        finding("baseline-anomaly", "G1", 1100),  # inside the fault, on its GPU: an extra alert, not a false alarm
        finding("baseline-anomaly", "G2", 1100),  # another GPU: a false alarm like any other finding
        finding("nvlink-down", "G1", 900, 950, active=False),  # cleared before the fault started: not a detection
        finding("idle-capacity", "G3", 50, severity=Severity.INFO),  # no idle truth there: a false alarm too
    ]
    ev = score(found, faults, OBSERVED, run_end_ns=END)
    nvlink = by(ev, "nvlink-down")
    assert nvlink.detected == 0 and nvlink.f1 == 0.0 and nvlink.alerts_per_fault == (1,)
    assert ev.false_alarms == {
        ("baseline-anomaly", Severity.WARNING): 1,
        ("nvlink-down", Severity.WARNING): 1,
        ("idle-capacity", Severity.INFO): 1,
    }
    assert ev.false_alarm_rate(severities=PAGING) == pytest.approx(
        2 / healthy_gpu_days(OBSERVED, truths(faults, END, {}))
    )


def test_an_episode_still_active_from_before_is_credited() -> None:
    faults = [fault("pcie-link-degraded", "G1", 100, 200), fault("pcie-link-degraded", "G1", 300, 400)]
    ev = score([finding("pcie-link-degraded", "G1", 110)], faults, OBSERVED, run_end_ns=END)
    pcie = by(ev, "pcie-link-degraded")
    assert (pcie.detected, pcie.episodes, pcie.true_episodes) == (2, 1, 1) and pcie.delays_s == (10.0, 0.0)


def test_peers_a_fault_slows_are_touched_by_it() -> None:
    faults = [fault("straggler", "G1", 100, 500)]
    found = [finding("straggler", "G1", 150), finding("baseline-anomaly", "G2", 160)]
    without = score(found, faults, OBSERVED, run_end_ns=END)
    assert without.false_alarm_total == 1
    with_peers = score(found, faults, OBSERVED, run_end_ns=END, peers={("G1", faults[0].start_ns): ("G2",)})
    assert with_peers.false_alarm_total == 0 and by(with_peers, "straggler").alerts_per_fault == (2,)


def test_a_multi_node_jobs_peers_on_another_node_are_touched_by_its_fault() -> None:
    """G1 on n1 straggles and slows its peer G9 on n2 (one job over two nodes). G9's anomaly while it waits is an
    extra alert of the straggler, not a false alarm, and G9's waiting time is not healthy; on G8 (n2, not a peer) the
    same anomaly is a false alarm."""
    observed = OBSERVED | {("c", "n2", "G8"): (T0, END), ("c", "n2", "G9"): (T0, END)}
    faults = [fault("straggler", "G1", 1000, 2000)]
    found = [
        finding("straggler", "G1", 1030),
        finding("baseline-anomaly", "G9", 1100, node="n2"),
        finding("baseline-anomaly", "G8", 1100, node="n2"),
    ]
    ev = score(found, faults, observed, run_end_ns=END, peers={("G1", faults[0].start_ns): ("G9",)})
    assert by(ev, "straggler").alerts_per_fault == (2,)
    assert ev.false_alarms == {("baseline-anomaly", Severity.WARNING): 1}
    window = 1000 + GRACE_S["straggler"]  # the fault's window and its grace, on G1 and on G9
    assert ev.healthy_gpu_days == pytest.approx(len(observed) - 2 * window / DAY_S)


def test_an_episode_that_detects_another_fault_is_that_faults_alert_not_this_ones() -> None:
    """Two faults in one job at once: G1 straggles (slowing its peer G2) while G2's NVLink is down. G2's nvlink-down
    episode is the NVLink fault's own alert, not a second alert of the straggler; an anomaly on G2 that detects
    neither is an extra alert of both."""
    faults = [fault("straggler", "G1", 100, 500), fault("nvlink-down", "G2", 200, 600)]
    found = [finding("straggler", "G1", 150), finding("nvlink-down", "G2", 200), finding("baseline-anomaly", "G2", 300)]
    ev = score(found, faults, OBSERVED, run_end_ns=END, peers={("G1", faults[0].start_ns): ("G2",)})
    assert by(ev, "straggler").alerts_per_fault == (2,)  # its own and the anomaly
    assert by(ev, "nvlink-down").alerts_per_fault == (2,)  # its own and the anomaly
    assert ev.false_alarm_total == 0


def test_undetectable_tails_are_excluded_and_counted() -> None:
    end = T0 + 10_000 * S
    late = 10_000 - MIN_VISIBLE_S["memory-leak"] / 2
    faults = [fault("memory-leak", "G1", 100, 2000), fault("memory-leak", "G2", late, 10_000)]
    ev = score([finding("memory-leak", "G1", 500)], faults, OBSERVED, run_end_ns=end)
    leak = by(ev, "memory-leak")
    assert (leak.faults, leak.excluded, leak.detected, leak.f1) == (1, 1, 1, 1.0)


def test_events_and_idle_stretches_are_truth_too() -> None:
    truth = [fault("xid", "G0", 50, 50), fault("idle-capacity", "G3", 100, 2000)]
    found = [finding("xid", "G0", 50, severity=Severity.INFO), finding("idle-capacity", "G3", 800, 1900, False)]
    ev = score(found, truth, OBSERVED, run_end_ns=END)
    assert ev.false_alarm_total == 0
    assert by(ev, "xid").detected == 1 and by(ev, "idle-capacity").detected == 1
    # an event is an instant: it does not make the GPU faulty for the rest of the run
    assert healthy_gpu_days(OBSERVED, truths(truth, END, {})) == pytest.approx(4.0)


def test_node_level_fault_touches_every_gpu_of_the_node() -> None:
    faults = [fault("power-capping", None, 100, 200)]
    ev = score([finding("power-capping", None, 220), finding("power-capping", None, 220, node="n2")], faults,
               OBSERVED, run_end_ns=END)  # fmt: skip
    power = by(ev, "power-capping")
    assert power.detected == 1 and power.true_episodes == 1 and ev.false_alarm_total == 1


def test_healthy_gpu_days_subtract_fault_windows_once() -> None:
    observed = {("c", "n1", "G0"): (T0, T0 + 2 * int(DAY_S * S)), ("c", "n1", "G1"): (T0, T0 + int(DAY_S * S))}
    faults = [
        fault("thermal-throttling", "G0", 0, DAY_S / 2 - 60),
        fault("memory-leak", "G0", DAY_S / 4, DAY_S / 2 - 300),  # overlaps the first: counted once
        fault("power-capping", None, DAY_S, DAY_S * 1.25 - 180),  # node-level: G0 only (G1 no longer observed)
    ]
    assert healthy_gpu_days(observed, truths(faults, T0, {})) == pytest.approx(2 - 0.5 - 0.25 + 1)


def test_a_fault_sent_twice_counts_once_with_its_latest_end_and_an_open_one_lasts_to_the_end() -> None:
    records = [
        fault("memory-leak", "G1", 100, 0),
        fault("memory-leak", "G1", 100, 700),
        fault("straggler", "G2", 500, 0),
    ]
    merged = truths(records, T0 + 1000 * S, {})
    assert [(t.kind, t.record.end_ns) for t in merged] == [("memory-leak", T0 + 700 * S), ("straggler", T0 + 1000 * S)]


def test_recall_per_magnitude_band() -> None:
    faults = [fault("straggler", f"G{i}", 100 + 1000 * i, 900 + 1000 * i, magnitude=m)
              for i, m in enumerate((0.12, 0.2, 0.3, 0.4))]  # fmt: skip
    found = [finding("straggler", "G2", 2200), finding("straggler", "G3", 3200), finding("straggler", "G1", 1200)]
    ev = score(found, faults, OBSERVED, run_end_ns=END, magnitudes={"straggler": (0.1, 0.15, 0.25, 0.45)})
    straggler = by(ev, "straggler")
    assert straggler.bands == ((0.1, 0.15, 1, 0), (0.15, 0.25, 1, 1), (0.25, 0.45, 2, 2))
    assert straggler.recall_from(0.15) == 1.0 and straggler.recall_from(0.1) == 0.75


def test_classification_accuracy_counts_missing_predictions_as_wrong() -> None:
    cl = classify_score([("llm-serving", "llm-serving"), (None, "hashing"), ("rendering", "hashing"),
                         ("idle", "idle")])  # fmt: skip
    assert cl.rows == 4 and cl.correct == 2 and cl.accuracy == 0.5
    assert cl.confusion[("hashing", "none")] == 1 and cl.confusion[("hashing", "rendering")] == 1


def test_acceptance_verdict_combination_and_table() -> None:
    faults = [fault(kind, "G1", 1000 * i, 1000 * i + 500) for i, kind in enumerate(FAULTS)]
    found = [finding(kind, "G1", 1000 * i + 2) for i, kind in enumerate(FAULTS)]
    good = score(found, faults, OBSERVED, run_end_ns=END, classification=classify_score([("idle", "idle")] * 10))
    problems = failures(good, Thresholds())
    assert problems == [], problems
    table = format_table(good)
    assert table.count("| 1.00 |") >= len(FAULTS) and "per healthy GPU-day" in table and "1.000 over 10 rows" in table

    noisy = [finding("baseline-anomaly", "G0", 20_000 + 600 * i) for i in range(10)]
    bad = score(found[1:] + noisy, faults, OBSERVED, run_end_ns=END)
    problems = failures(bad, Thresholds())
    assert any(p.startswith("thermal-throttling: F1 0.00") for p in problems)
    assert any(p.startswith("paging false alarms") for p in problems)
    assert any(p.startswith("baseline-anomaly: ") for p in problems)
    assert any("classification was not measured" in p for p in problems)

    both = combine([good, bad])
    assert by(both, "power-capping").faults == 2 and both.false_alarm_total == 10
    assert both.healthy_gpu_days == pytest.approx(good.healthy_gpu_days + bad.healthy_gpu_days)


def test_health_states_how_soon_a_hard_fault_makes_its_gpu_unhealthy_and_healthy_gpus_called_unhealthy() -> None:
    crit = Severity.CRITICAL
    faults = [fault("ecc-uncorrectable", "G1", 100, 400), fault("ecc-uncorrectable", "G2", 1000, 1300),
              fault("fallen-off-bus", "G3", 2000, 2600), fault("xid-storm", "G0", 3000, 3300)]  # fmt: skip
    storm = finding("xid-storm", "G0", 3002, severity=crit)
    found = [
        finding("ecc-uncorrectable", "G1", 101, severity=crit),  # unhealthy after 1 s
        finding("ecc-uncorrectable", "G2", 1020, severity=crit),  # after 20 s: late
        finding("xid", "G3", 2000, severity=crit),  # by another finding of the GPU: unhealthy at once
        Finding(
            storm.detector,
            crit,
            True,
            "c",
            "n1",
            "G0",
            "H100",
            storm.ts_ns,
            storm.since_ns,
            "s",
            evidence={"last_xid": 13.0},
        ),  # the application's storm: degraded, as it must be
        Finding(
            "xid", crit, True, "c", "n1", "G1", "H100", T0 + 5000 * S, T0 + 5000 * S, "s", evidence={"xid": 119.0}
        ),  # nothing injected there: a healthy GPU called unhealthy
        finding("thermal-throttling", "G2", 7000),  # a false alarm, but degraded, not unhealthy
    ]
    ev = score(found, faults, OBSERVED, run_end_ns=END)
    health = {h.fault: h for h in ev.health}
    assert health["ecc-uncorrectable"].delays_s == (1.0, 20.0)
    assert health["ecc-uncorrectable"].in_time(5.0) == 1
    assert health["fallen-off-bus"].delays_s == (0.0,)
    assert health["xid-storm"].delays_s == (2.0,) and health["xid-storm"].expected.value == "degraded"
    assert ev.false_unhealthy == 1
    missed = failures(ev, Thresholds())
    assert "ecc-uncorrectable: 1 of 2 GPUs not unhealthy (or worse) within 5 s" in missed
    assert any(m.startswith("false unhealthy ") for m in missed)
    assert not any("GPUs not" in m for m in missed if m.startswith(("fallen-off-bus", "xid-storm")))
    both = combine([ev, ev])
    assert both.false_unhealthy == 2 and {h.fault: h.faults for h in both.health}["ecc-uncorrectable"] == 4
    table = format_table(ev)
    assert "| ecc-uncorrectable | unhealthy | 2 | 2 | 1 | 10 |" in table
    assert "Healthy GPUs called unhealthy: 1" in table
