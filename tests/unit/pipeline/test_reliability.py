"""Reliability figures from finding points: incidents and degradations by the state they gave, MTBI over the
GPU-hours observed, time to repair of the incidents that ended, open ones apart, lemon nodes, per day."""

from __future__ import annotations

import pytest

from pipeline.config import HealthSettings
from pipeline.escalation import Episode
from pipeline.reliability import reliability, report_json

H = 3600 * 10**9
DAY = 24 * H
T0 = 1_800_000_000 * 10**9 - (1_800_000_000 * 10**9) % DAY  # a day's start
STOP = T0 + 2 * DAY
SPANS = [("c", "n1", f"G{i}", "NVIDIA H100 80GB HBM3", T0, STOP) for i in range(4)] + [
    ("c", "n2", "G9", "NVIDIA A100-SXM4-80GB", T0 + DAY, STOP)
]


def point(gpu: str, start_h: float, seen_h: float, active: bool, code: int = 119, node: str = "n1") -> Episode:
    severity = "warning" if code == 13 else "critical"
    since = T0 + int(start_h * H)
    return Episode("c", node, gpu, "xid", severity, since, None, frozenset({code}), active, T0 + int(seen_h * H))


def test_figures_per_gpu_model_and_per_day() -> None:
    points = [
        point("G0", 1, 1, True), point("G0", 1, 1.5, False),  # repaired after 30 min
        point("G1", 30, 30, True), point("G1", 30, 32, False),  # after 2 h, on day two
        point("G2", 40, 40, True),  # still open
        point("G3", 5, 5, True, code=13), point("G3", 5, 5.1, False, code=13),  # the application's: degraded
        point("G9", 26, 26, True, node="n2"), point("G9", 26, 27, False, node="n2"),
    ]  # fmt: skip
    report = reliability(SPANS, points, T0, STOP, "gpu_model", HealthSettings())
    rows = {r.group: r for r in report.rows}
    h100, a100 = rows["NVIDIA H100 80GB HBM3"], rows["NVIDIA A100-SXM4-80GB"]
    assert (h100.gpus, h100.gpu_hours, h100.incidents, h100.degradations, h100.open_incidents) == (4, 192, 3, 1, 1)
    assert h100.mtbi_hours == 64.0
    assert h100.repair_median_min == pytest.approx(75.0) and h100.repair_p90_min == pytest.approx(111.0)
    assert (a100.gpus, a100.gpu_hours, a100.incidents, a100.mtbi_hours, a100.repair_median_min) == (1, 24, 1, 24.0, 60)
    assert report.days == ((T0, 1, 1), (T0 + DAY, 3, 0))
    assert report.lemons == ()
    by_node = {r.group: r for r in reliability(SPANS, points, T0, STOP, "node", HealthSettings()).rows}
    assert by_node["c/n1"].incidents == 3 and by_node["c/n2"].incidents == 1
    assert report_json(report)["rows"][0]["group"] == "NVIDIA A100-SXM4-80GB"


def test_time_to_tell_is_from_an_incidents_start_to_the_first_notification_of_it_someone_got() -> None:
    """G0's two incidents (hours 1 and 10): told 90 s and 30 s after they began; G1's nobody was told of (no
    subscription, or muted); a notification of G0's first incident is not its second's."""
    points = [
        point("G0", 1, 1, True), point("G0", 1, 2, False),
        point("G0", 10, 10, True), point("G0", 10, 11, False),
        point("G1", 5, 5, True), point("G1", 5, 6, False),
    ]  # fmt: skip
    told = {"xid/c/n1/G0": [T0 + H + 90 * 10**9, T0 + H + 600 * 10**9, T0 + 10 * H + 30 * 10**9]}
    [row] = reliability(SPANS, points, T0, STOP, "cluster", HealthSettings(), told=told).rows
    assert (row.incidents, row.told, row.tell_median_s) == (3, 2, 60.0)
    late = {"xid/c/n1/G0": [T0 + 10 * H + 30 * 10**9]}  # only the second incident was told of
    [row] = reliability(SPANS, points, T0, STOP, "cluster", HealthSettings(), told=late).rows
    assert (row.told, row.tell_median_s) == (1, 30.0)
    [row] = reliability(SPANS, points, T0, STOP, "cluster", HealthSettings()).rows
    assert (row.told, row.tell_median_s) == (0, None)


def test_a_node_with_five_remediations_is_a_lemon_and_a_gpu_without_incidents_has_no_mtbi() -> None:
    points = [point(f"G{i % 3}", 2 + i, 2.5 + i, False) for i in range(5)]
    report = reliability(SPANS, points, T0, STOP, "cluster", HealthSettings())
    [(cluster, node, why)] = report.lemons
    assert (cluster, node) == ("c", "n1") and "5 remediations" in why
    quiet = reliability(SPANS, [], T0, STOP, "cluster", HealthSettings())
    assert [(r.group, r.incidents, r.mtbi_hours, r.repair_median_min) for r in quiet.rows] == [("c", 0, None, None)]
    with pytest.raises(ValueError, match="group by one of"):
        reliability(SPANS, [], T0, STOP, "rack", HealthSettings())


def test_a_jobs_effective_time_is_its_time_with_every_gpu_healthy_and_busy() -> None:
    """Job j1 runs 10 h on 4 GPUs: an ECC error costs one GPU 1 h (h 2-3), a thermal warning another 2 h that
    overlap it by half an hour (h 2.5-4.5), an idle GPU 1 h (h 8-9): lost 3.5 h, 65% effective. An info finding
    (no state) and another job's fault cost j1 nothing; j2 lost nothing."""

    def ep(gpu: str, detector: str, severity: str, start_h: float, end_h: float, job: str = "j1") -> Episode:
        return Episode("c", "n1", gpu, detector, severity, T0 + int(start_h * H), job, frozenset(), False,
                       T0 + int(end_h * H))  # fmt: skip

    points = [
        ep("G0", "ecc-uncorrectable", "critical", 2, 3),
        ep("G1", "thermal-throttling", "warning", 2.5, 4.5),
        ep("G2", "idle-capacity", "info", 8, 9),
        ep("G3", "phase-shift", "info", 5, 6),
        ep("G3", "fallen-off-bus", "critical", 11, 12, job="j2"),
    ]
    jobs = [("c", "j1", "llm-pretraining", T0, T0 + 10 * H, 40.0), ("c", "j2", "bert", T0 + 20 * H, T0 + 22 * H, 2.0)]
    report = reliability(SPANS, points, T0, STOP, "cluster", HealthSettings(), jobs)
    j1, j2 = report.jobs
    assert (j1.job, j1.hours, j1.gpu_hours, j1.lost_hours) == ("j1", 10.0, 40.0, 3.5)
    assert j1.effective == pytest.approx(0.65)
    assert j1.causes == (("thermal-throttling", 2.0), ("ecc-uncorrectable", 1.0), ("idle-capacity", 1.0))
    assert (j2.job, j2.lost_hours, j2.effective) == ("j2", 0.0, 1.0)
    # a range that cuts a job counts its part inside only
    cut = reliability(SPANS, points, T0 + 5 * H, STOP, "cluster", HealthSettings(), jobs).jobs[0]
    assert (cut.hours, cut.lost_hours) == (5.0, 1.0)
    assert report_json(report)["jobs"][0]["effective"] == pytest.approx(0.65)
