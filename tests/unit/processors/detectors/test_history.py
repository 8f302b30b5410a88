"""History and live never share a clock: a long-lived processor that judges a node live and, on the same partition,
an import of the node's older history (or the same range imported twice) finds in each only what that data holds.

The scenario of issue 37: with the main job's processor still running, an import read back in time made one-GPU
nodes "silent for 40755 s while the node's other GPUs keep reporting", and error counters read back lower and then
higher again look like new errors. Each test here fails on a slot table that keys GPUs by identity alone."""

from __future__ import annotations

from pipeline.config import DetectorSettings
from pipeline.events import Finding, InterpretedBatch
from processors.detectors.stage import Detectors
from tests.unit.processors.detectors.driver import T0, S, Shape, run, starts

#: the live part runs two and a half days after the history it is given
LIVE = 200_000


def _explanations(batches: list[InterpretedBatch]) -> list[tuple[str, ...]]:
    return [b.explanation for b in batches]


def test_history_read_after_live_fakes_no_silence_on_one_gpu_nodes() -> None:
    det = Detectors(DetectorSettings())
    found: list[Finding] = []
    for start, seconds in ((LIVE, 600), (0, 1800), (0, 1800), (LIVE + 600, 120)):  # live, import, --restart, live
        found += run(seconds, gpus=1, start=start, detectors=det)[1]
    assert starts(found) == []


def test_a_silence_in_history_is_found_at_its_own_time_and_alike_on_every_import() -> None:
    """GPU-7 of an 8-GPU node is silent for 400 s in the imported history while the node's other GPUs report: found
    once per import (started 15 s into the silence, back 30 s after it reports again), live untouched; the second
    import of the same range is judged as the first, row for row."""

    def silent(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        return None if gpu == 7 and 500 <= t < 900 else m

    det = Detectors(DetectorSettings())
    live = run(600, start=LIVE, detectors=det)[1]
    _, first, judged_first = run(1200, silent, detectors=det)
    _, second, judged_second = run(1200, silent, detectors=det)
    live += run(120, start=LIVE + 600, detectors=det)[1]
    assert starts(live) == []
    for found in (first, second):
        assert [(f.detector, f.gpu_uuid, f.ts_ns) for f in starts(found)] == [("fallen-off-bus", "GPU-7", T0 + 514 * S)]
        assert "silent for 15 s" in starts(found)[0].summary
        assert [f.ts_ns for f in found if not f.active] == [T0 + 930 * S]
    assert _explanations(judged_second) == _explanations(judged_first)


def test_live_and_history_interleaved_on_one_partition_keep_their_own_counters_and_clocks() -> None:
    """Live rounds and an import's messages of the same node alternate (one partition, two streams): the live GPU
    has 5 uncorrected ECC errors in total, its history 2; neither stream sees the other's counter as a rise."""

    def counted(total: float) -> Shape:
        return lambda _t, _gpu, m: m | {"ecc_uncorrected_total": total}

    det = Detectors(DetectorSettings())
    found: list[Finding] = []
    for k in range(0, 300, 5):
        found += run(5, counted(5.0), gpus=2, start=LIVE + k, detectors=det)[1]
        found += run(5, counted(2.0), gpus=2, start=k, detectors=det)[1]
    assert starts(found) == []
    assert det.slots.lanes_of(("c1", "node-1")) == 2  # live and history: a lane each


def test_rows_a_little_late_stay_in_their_lane() -> None:
    """A round that arrives a few seconds behind its node's newest (a retried message) is the same stream: judged
    with it, not as history of its own."""
    det = Detectors(DetectorSettings())
    run(60, start=100, detectors=det)
    run(5, start=150, detectors=det)
    run(1, start=161, detectors=det)
    assert det.slots.lanes_of(("c1", "node-1")) == 1 and len(det.slots) == 8
