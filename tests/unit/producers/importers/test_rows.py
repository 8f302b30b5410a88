"""The pure steps from imported rows to what the pipeline reads: intervals per series, duplicates, context changes
dated by their first row, and node messages."""

from __future__ import annotations

import numpy as np

from pipeline.events import EventKind, GpuEvent, Workload
from producers.importers.rows import (
    Intervals,
    Rows,
    context_changes,
    detect_intervals,
    duplicates,
    node_batches,
    series_codes,
)

S = 10**9


def rows(node: list[str], gpu: list[str], ts_s: list[float], workload: list[Workload | None] | None = None) -> Rows:
    n = len(gpu)
    return Rows(
        node=tuple(node), gpu_uuid=tuple(gpu), gpu_index=(0,) * n, gpu_model=("m",) * n,
        ts_ns=np.array([round(t * S) for t in ts_s], dtype=np.int64),
        metrics={"power_watts": np.arange(n, dtype=np.float64)}, origin=tuple(f"f:{i}" for i in range(n)),
        original=(b"",) * n, workload=None if workload is None else tuple(workload),
    )  # fmt: skip


def test_the_interval_is_the_median_gap_of_a_series_robust_to_an_outage_and_jitter() -> None:
    # every 57 s, one sample 2 s late, an outage of 10 minutes; another series every 60 s; one with a single sample
    a = [0, 57, 116, 171, 228, 828, 885, 942]
    r = rows(["n"] * 12, ["a"] * 8 + ["b"] * 3 + ["c"], [*a, 0, 60, 120, 5])
    codes, series = series_codes(r)
    found = {series[k]: v for k, v in detect_intervals(codes, r.ts_ns).items()}
    assert found == {("n", "a"): 57.0, ("n", "b"): 60.0}


def test_intervals_are_kept_per_series_across_blocks() -> None:
    memory = Intervals()
    first = memory.per_row(rows(["n"] * 3, ["a"] * 3, [0, 60, 120]))
    later = memory.per_row(rows(["n"] * 3, ["a"] * 3, [180, 240.5, 300]))  # a jitter of its own: not a new value
    assert first.tolist() == [60.0] * 3 and later.tolist() == [60.0] * 3
    assert np.isnan(memory.per_row(rows(["n"], ["z"], [0]))).all()


def test_a_second_row_of_a_gpu_at_the_same_millisecond_is_a_duplicate() -> None:
    r = rows(["n"] * 5, ["a", "a", "b", "a", "a"], [1.0, 1.0004, 1.0, 2.0, 1.0])
    codes, _ = series_codes(r)
    assert duplicates(codes, r.ts_ns).tolist() == [False, True, False, False, True]


def test_a_context_is_published_where_a_gpus_workload_changes_dated_by_its_first_row() -> None:
    train, serve = Workload("llm-pretraining", job_id="t"), Workload("llm-serving", job_id="s")
    r = rows(
        ["n"] * 6, ["a", "b", "a", "a", "b", "a"], [10, 10, 0, 20, 20, 30], [train, serve, train, None, serve, serve]
    )
    last: dict[tuple[str, str], Workload | None] = {}
    changes = context_changes(r, "c", last)
    assert [(c.gpu_uuid, c.ts_ns // S, c.workload) for c in changes] == [
        ("a", 0, train), ("b", 10, serve), ("a", 20, None), ("a", 30, serve),
    ]  # fmt: skip
    assert context_changes(rows(["n"], ["b"], [40], [serve]), "c", last) == []  # unchanged across blocks


def test_one_message_per_node_and_time_with_each_series_interval_and_the_events() -> None:
    r = rows(["n1", "n2", "n1", "n1"], ["a", "x", "b", "a"], [0, 0, 0, 60])
    xid = GpuEvent("c", "n1", "a", 0, 30 * S, EventKind.XID, 79, "")
    late = GpuEvent("c", "n2", "x", 0, 90 * S, EventKind.XID, 48, "")
    r = Rows(**{**r.__dict__, "events": (xid, late)})
    batches = list(node_batches(r, "c", np.array([60.0, np.nan, np.nan, 60.0])))
    assert [(b.node, [s.gpu_uuid for s in b.samples], b.events) for b in batches] == [
        ("n1", ["a", "b"], ()), ("n2", ["x"], ()), ("n1", ["a"], (xid,)), ("n2", [], (late,)),
    ]  # fmt: skip
    first = batches[0].samples
    assert first[0].metrics == {"power_watts": 0.0, "sample_interval_seconds": 60.0}
    assert first[1].metrics == {"power_watts": 2.0}  # no interval known: none claimed
