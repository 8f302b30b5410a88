"""A lane that is done is freed (processors/state.py) and its slots and node id go to the next import: every stage
forgets what it kept of them, so the GPU that gets a slot starts from nothing, and what the freed lane had open goes
without a message. Each test fails when one stage keeps what it knew of a freed slot."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.config import DetectorSettings
from pipeline.events import EventKind, Finding, GpuEvent, InterpretedBatch, Workload
from processors.detectors.stage import Detectors
from processors.state import GpuSlots
from tests.unit.processors.detectors.driver import T0, S, Shape, kinds, run, starts

#: the live part runs two and a half days after the history imported beside it
LIVE = 200_000
#: the table frees a lane idle this long (s of its clock)
IDLE_S = 600.0


def _job3(_t: int, _gpu: int) -> Workload:
    return Workload("llm-pretraining", job_id="job-3", source="simulator", confidence=1.0, job_gpus=8)


def _freeing() -> tuple[Detectors, list[float]]:
    """Detectors over a table that frees lanes idle for IDLE_S of a clock the test moves: ``wall[0]`` (s), moved
    on by ``wall[1]`` each time the table reads it (once a batch)."""
    wall = [0.0, 0.0]

    def clock() -> float:
        wall[0] += wall[1]
        return wall[0]

    return Detectors(DetectorSettings(), slots=GpuSlots(idle_s=IDLE_S, clock=clock)), wall


def _free(det: Detectors, wall: list[float], live_at: int, gpus: int = 8) -> list[Finding]:
    """The imports are done: the live node reports on for 60 rounds while the wall clock moves past IDLE_S (the
    table's clock moves only while batches come: processors.state), and its lane frees theirs."""
    wall[1] = (IDLE_S + 100) / 60
    found = run(60, start=live_at, gpus=gpus, detectors=det)[1]
    wall[1] = 0.0
    assert det.slots.freed >= 1
    return found


def _xids(*at: int, gpu: int = 1) -> Callable[[int], list[GpuEvent]]:
    return lambda t: [GpuEvent("c1", "node-1", f"GPU-{gpu}", gpu, T0 + t * S, EventKind.XID, 13, "")] if t in at else []


def _slow(gpu: int, since: int) -> Shape:
    """One GPU of the job slower from ``since`` (lower clock and duty cycle), its peers waiting on it."""

    def shape(t: int, g: int, m: dict[str, float]) -> dict[str, float]:
        if t < since:
            return m
        if g == gpu:
            return m | {"sm_clock_mhz": 1400.0, "utilization_gpu_percent": 88.0}
        return m | {"utilization_gpu_percent": 35.0 if t % 10 < 3 else 97.0}

    return shape


def _brake(t: int, _gpu: int, m: dict[str, float]) -> dict[str, float]:
    """Every GPU of the job held at 60% of its power and 70% of its SM clock from t=600 s, busy as before."""
    return m | {"power_watts": m["power_watts"] * 0.6, "sm_clock_mhz": m["sm_clock_mhz"] * 0.7} if t >= 600 else m


def _said(found: list[Finding]) -> list[tuple[str, str | None, bool, int, int, str]]:
    return [(f.detector, f.gpu_uuid, f.active, f.ts_ns, f.since_ns, f.summary) for f in found]


def _explained(batches: list[InterpretedBatch]) -> list[tuple[str, ...]]:
    return [b.explanation for b in batches]


def test_xids_of_a_freed_lane_count_towards_no_storm_on_its_slot() -> None:
    """Four XIDs on GPU-1 in an import (a storm takes five in 300 s), then one in the next import of the range, on
    the slot GPU-1's lane freed: one XID, no storm."""
    det, wall = _freeing()
    run(10, start=LIVE, gpus=2, detectors=det)
    first = run(300, gpus=2, events=_xids(100, 150, 200, 250), detectors=det)[1]
    _free(det, wall, LIVE + 10, gpus=2)
    assert det.slots.find(("c1", "node-1", "GPU-1"), 1) is None
    second = run(300, gpus=2, events=_xids(260), detectors=det)[1]
    assert det.slots.find(("c1", "node-1", "GPU-1"), 2) == 3  # the slot GPU-1 had in the first import
    assert kinds(first) == kinds(second) == {("xid", "GPU-1")}
    assert [f.ts_ns for f in starts(second)] == [T0 + 260 * S]


def test_a_straggler_of_a_freed_lane_leaves_its_job_and_the_next_import_is_judged_alike() -> None:
    """A straggler in an import of job 3 (its finding still open when the import ends); the lane is freed and the
    same range is imported again onto its slots: the job's peer group holds none of the freed GPUs, and the second
    import's straggler is found as the first's was (an inherited peer group had its windows judged already)."""
    det, wall = _freeing()
    live = run(300, start=LIVE, detectors=det)[1]
    first = run(1200, _slow(5, 600), job=_job3, detectors=det)[1]
    live += _free(det, wall, LIVE + 300)
    assert det.stragglers.peers_of(0) == list(range(1, 8))  # live's job-7 on slots 0-7
    assert det.stragglers.peers_of(13) == []  # GPU-5 of the freed lane: in no job
    second = run(1200, _slow(5, 600), job=_job3, detectors=det)[1]
    assert kinds(first) == {("straggler", "GPU-5")} and _said(second) == _said(first)
    assert det.stragglers.peers_of(13) == [8, 9, 10, 11, 12, 14, 15]  # the second import's job-3, afresh
    assert starts(live) == []


def test_a_job_slowdown_of_a_freed_lane_goes_unsent_and_the_next_import_is_judged_alike() -> None:
    """A power brake on job 3 in an import: its node-level finding is open when the import ends. The lane is freed:
    the finding goes without a message, and the same range imported again onto the lane's node id is judged as the
    first import was."""
    det, wall = _freeing()
    run(300, start=LIVE, detectors=det)
    first = run(1200, _brake, job=_job3, detectors=det)[1]
    assert kinds(first) == {("job-slowdown", None)} and det.report.nodes.is_open(1, "job-slowdown")
    live = _free(det, wall, LIVE + 300)
    assert live == [] and not det.report.nodes and det.pace._open == {}
    second = run(1200, _brake, job=_job3, detectors=det)[1]
    assert _said(second) == _said(first)


def test_a_job_slowdown_open_on_a_freed_node_id_goes_with_it_while_the_job_goes_on() -> None:
    """Job 3 runs braked in an import, its finding open on the import lane's node id when it ends; live runs job 3
    too, braked from its first sample there (a peer group and a pace of its own: the same job at another time; its
    first window holds none of job 7's readings before it). Once the import's lane is freed its node id holds no
    finding of the job, and the job's end on live clears nothing there (a clear of an episode the freed lane took
    with it)."""
    det, wall = _freeing()
    run(10, start=LIVE, detectors=det)
    run(1200, _brake, job=_job3, detectors=det)
    run(120, _brake, start=LIVE + 10, job=_job3, detectors=det)
    assert det.report.nodes.is_open(1, "job-slowdown") and 1 in det.pace._open
    wall[1] = (IDLE_S + 100) / 60
    run(60, _brake, start=LIVE + 130, job=_job3, detectors=det)
    wall[1] = 0.0
    assert det.slots.freed == 1 and det.stragglers.peers_of(0) == list(range(1, 8))
    assert 1 not in det.pace._open and not det.report.nodes.is_open(1, "job-slowdown")
    ended = run(60, start=LIVE + 190, job=lambda _t, _g: None, detectors=det)[1]  # the job ends
    assert not any(f.detector == "job-slowdown" and not f.active for f in ended)


def test_a_freed_lane_is_not_remembered_as_asked_for_its_topology() -> None:
    det, wall = _freeing()
    run(10, start=LIVE, gpus=2, detectors=det)
    run(10, gpus=2, detectors=det)
    assert ("c1", "node-1", 1) in det.links._asked
    _free(det, wall, LIVE + 10, gpus=2)
    assert ("c1", "node-1", 1) not in det.links._asked and ("c1", "node-1", 0) in det.links._asked


def test_an_import_onto_a_freed_lanes_slots_finds_only_its_own_and_live_is_untouched() -> None:
    """A live node (job 7) judged every second; an import of its older range (job 3) with three XIDs on GPU-1 and
    GPU-5 a straggler, open when the import ends; the wall clock moves past IDLE_S, its lane is freed; a second import
    of another older range of job 3, onto the same slots and node id, with two XIDs on GPU-1 and GPU-2 a straggler.
    The second import finds its own faults and nothing of the first's (an XID storm of five, GPU-5's straggler
    repeated or cleared): exactly what a processor that never saw the first import finds in it. Live's findings and
    state are those of a table that never frees."""

    def second_import(det: Detectors) -> tuple[list[Finding], list[InterpretedBatch]]:
        _, found, batches = run(1800, _slow(2, 750), job=_job3, events=_xids(250, 300), start=150, detectors=det)
        return found, batches

    freeing, wall = _freeing()
    kept = Detectors(DetectorSettings())
    live: list[list[Finding]] = []
    first: list[list[Finding]] = []
    for det in (freeing, kept):
        found = run(300, start=LIVE, detectors=det)[1]
        first.append(run(1800, _slow(5, 600), job=_job3, events=_xids(100, 150, 200), detectors=det)[1])
        wall[1] = (IDLE_S + 100) / 60  # the wall clock moves on while live reports
        found += run(60, start=LIVE + 300, detectors=det)[1]
        wall[1] = 0.0
        if det is freeing:
            second, batches = second_import(det)
        found += run(60, start=LIVE + 360, detectors=det)[1]
        live.append(found)
    alone = Detectors(DetectorSettings())
    run(300, start=LIVE, detectors=alone)
    second_alone, batches_alone = second_import(alone)
    assert freeing.slots.freed == 1 and len(freeing.slots) == 16  # the second import took the first's slots
    assert kinds(first[0]) == {("xid", "GPU-1"), ("straggler", "GPU-5")} and _said(first[0]) == _said(first[1])
    assert kinds(second) == {("xid", "GPU-1"), ("straggler", "GPU-2")} and not any(
        f.gpu_uuid == "GPU-5" for f in second
    )
    assert _said(second) == _said(second_alone) and _explained(batches) == _explained(batches_alone)
    assert live[0] == live[1] == []
    for column in ("ts", "counters", "explained_until"):
        assert np.array_equal(getattr(freeing.latest, column)[:8], getattr(kept.latest, column)[:8], equal_nan=True)
    assert freeing.stragglers.peers_of(0) == kept.stragglers.peers_of(0) == list(range(1, 8))


def test_an_import_of_the_job_running_live_is_judged_apart_from_it() -> None:
    """Job 3 runs live while its older range is imported (GPU-5 slower from 600 to 1200 s, every GPU braked from
    2400 s): the
    import's GPUs make a peer group of their own, not the live one's (one job key, two times: their windows would
    never be judged together), so the import finds what a processor that never saw live finds, and live stays as it
    was: its 8 GPUs each other's peers, nothing found."""

    def history(t: int, g: int, m: dict[str, float]) -> dict[str, float]:
        return _slow(5, 600)(t, g, m) if t < 1200 else _brake(t - 1800, g, m)

    det = Detectors(DetectorSettings())
    live = run(300, start=LIVE, job=_job3, detectors=det)[1]
    imported = run(3000, history, job=_job3, detectors=det)[1]
    live += run(60, start=LIVE + 300, job=_job3, detectors=det)[1]
    alone = run(3000, history, job=_job3)[1]
    assert kinds(imported) == {("straggler", "GPU-5"), ("job-slowdown", None)}
    assert _said(imported) == _said(alone)
    assert live == [] and det.stragglers.peers_of(0) == list(range(1, 8))
    assert det.stragglers.peers_of(13) == [8, 9, 10, 11, 12, 14, 15]
