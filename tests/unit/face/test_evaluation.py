"""The evaluation's scoring: matching findings to ground truth, precision/recall/F1, delays, false alarms per
healthy GPU-day, classification accuracy, and the acceptance verdict."""

from __future__ import annotations

import pytest

from pipeline.events import FAULTS, FaultRecord, Finding, Severity
from pipeline.face.evaluation import (
    DAY_S,
    Thresholds,
    classify_score,
    episodes,
    failures,
    format_table,
    healthy_gpu_days,
    merge_faults,
    score,
)

S = 1_000_000_000
T0 = 1_700_000_000 * S


def finding(detector: str, gpu: str | None, since_s: float, ts_s: float | None = None, active: bool = True,
            node: str = "n1") -> Finding:  # fmt: skip
    since = T0 + int(since_s * S)
    ts = since if ts_s is None else T0 + int(ts_s * S)
    return Finding(detector, Severity.WARNING, active, "c", node, gpu, "H100", ts, since, "s")


def fault(kind: str, gpu: str | None, start_s: float, end_s: float, node: str = "n1") -> FaultRecord:
    return FaultRecord("c", node, gpu, kind, T0 + int(start_s * S), T0 + int(end_s * S))


OBSERVED = {("c", "n1", f"G{i}"): (T0, T0 + int(DAY_S * S)) for i in range(4)}


def test_repeats_and_clears_are_one_episode() -> None:
    found = [
        finding("thermal-throttling", "G1", 100),
        finding("thermal-throttling", "G1", 100, 160),
        finding("thermal-throttling", "G1", 100, 300, active=False),
        finding("thermal-throttling", "G1", 900),
    ]
    assert [e.start_ns for e in episodes(found)] == [T0 + 100 * S, T0 + 900 * S]


def test_precision_recall_f1_and_delays() -> None:
    faults = [fault("thermal-throttling", "G1", 100, 400), fault("thermal-throttling", "G2", 1000, 1300),
              fault("thermal-throttling", "G3", 5000, 5200)]  # fmt: skip
    found = [
        finding("thermal-throttling", "G1", 110),  # detected after 10 s
        finding("thermal-throttling", "G1", 350),  # a second episode inside the same fault: still true
        finding("thermal-throttling", "G2", 1400),  # 100 s after the end: inside the grace, detected (delay 400 s)
        finding("thermal-throttling", "G0", 2000),  # nothing there: a false alarm
    ]
    ev = score(found, faults, OBSERVED, tolerance_s=30, grace_s=300)
    thermal = next(c for c in ev.classes if c.fault == "thermal-throttling")
    assert (thermal.faults, thermal.detected, thermal.episodes, thermal.true_episodes) == (3, 2, 4, 3)
    assert thermal.precision == pytest.approx(0.75) and thermal.recall == pytest.approx(2 / 3)
    assert thermal.f1 == pytest.approx(2 * 0.75 * (2 / 3) / (0.75 + 2 / 3))
    assert thermal.delays_s == (10.0, 400.0) and thermal.delay_median_s == 205.0
    assert ev.false_alarms == 1 and ev.false_alarm_examples[0].gpu_uuid == "G0"


def test_wrong_class_wrong_gpu_and_too_early_do_not_match() -> None:
    faults = [fault("nvlink-down", "G1", 1000, 2000)]
    found = [
        finding("pcie-link-degraded", "G1", 1100),  # other class: no detection, but on a faulty GPU: no false alarm
        finding("nvlink-down", "G2", 1100),  # other GPU: false alarm
        finding("nvlink-down", "G1", 900),  # 100 s before the start (tolerance 30 s): not a detection
    ]
    ev = score(found, faults, OBSERVED, tolerance_s=30, grace_s=300)
    nvlink = next(c for c in ev.classes if c.fault == "nvlink-down")
    assert nvlink.detected == 0 and nvlink.f1 == 0.0 and nvlink.precision == 0.0
    pcie = next(c for c in ev.classes if c.fault == "pcie-link-degraded")
    assert pcie.faults == 0 and pcie.f1 is None and pcie.episodes == 1 and pcie.true_episodes == 0
    assert ev.false_alarms == 2


def test_node_level_fault_matches_any_gpu_of_the_node() -> None:
    faults = [fault("xid-storm", None, 100, 200)]
    ev = score([finding("xid-storm", "G3", 120), finding("xid-storm", "G3", 120, node="n2")], faults, OBSERVED)
    storm = next(c for c in ev.classes if c.fault == "xid-storm")
    assert storm.detected == 1 and storm.true_episodes == 1 and ev.false_alarms == 1


def test_other_detectors_are_reported_but_not_false_alarms() -> None:
    ev = score([finding("xid", "G0", 10), finding("idle-capacity", "G1", 20)], [], OBSERVED)
    assert ev.false_alarms == 0 and ev.other_episodes == {"xid": 1, "idle-capacity": 1}


def test_healthy_gpu_days_subtract_fault_windows_once() -> None:
    observed = {("c", "n1", "G0"): (T0, T0 + 2 * int(DAY_S * S)), ("c", "n1", "G1"): (T0, T0 + int(DAY_S * S))}
    faults = [
        fault("thermal-throttling", "G0", 0, DAY_S / 2),
        fault("memory-leak", "G0", DAY_S / 4, DAY_S / 2),  # overlaps the first: counted once
        fault("xid-storm", None, DAY_S, DAY_S * 1.25),  # node-level: G0 only (G1 no longer observed)
    ]
    assert healthy_gpu_days(observed, faults) == pytest.approx(2 - 0.5 - 0.25 + 1)


def test_merge_keeps_the_latest_end_and_closes_open_faults() -> None:
    start = fault("memory-leak", "G1", 100, 0)  # sent at the start, end unknown
    end = fault("memory-leak", "G1", 100, 700)  # sent again when it ended
    still_open = fault("straggler", "G2", 500, 0)
    merged = merge_faults([start, end, still_open], run_end_ns=T0 + 1000 * S)
    assert [(m.fault, m.end_ns) for m in merged] == [("memory-leak", T0 + 700 * S), ("straggler", T0 + 1000 * S)]


def test_classification_accuracy_counts_missing_predictions_as_wrong() -> None:
    cl = classify_score([("llm-serving", "llm-serving"), (None, "hashing"), ("rendering", "hashing"),
                         ("idle", "idle")])  # fmt: skip
    assert cl.rows == 4 and cl.correct == 2 and cl.accuracy == 0.5
    assert cl.confusion[("hashing", "none")] == 1 and cl.confusion[("hashing", "rendering")] == 1


def test_acceptance_verdict_and_table() -> None:
    faults = [fault(kind, "G1", 1000 * i, 1000 * i + 500) for i, kind in enumerate(FAULTS)]
    found = [finding(kind, "G1", 1000 * i + 20) for i, kind in enumerate(FAULTS)]
    good = score(found, faults, OBSERVED, classification=classify_score([("idle", "idle")] * 10))
    assert failures(good, Thresholds()) == []
    table = format_table(good)
    assert table.count("| 1.00 |") >= len(FAULTS) and "per GPU-day" in table and "1.000 over 10 rows" in table

    many_false = [finding("straggler", "G0", 20_000 + 60 * i) for i in range(10)]
    bad = score(found[1:] + many_false, faults, OBSERVED)
    problems = failures(bad, Thresholds())
    assert any(p.startswith("thermal-throttling: F1 0.00") for p in problems)
    assert any(p.startswith("false alarms") for p in problems)
    assert any("classification was not measured" in p for p in problems)
