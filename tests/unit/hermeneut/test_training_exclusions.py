"""What training leaves out: the windows of faults and the events operators marked anomalous, counted per reason;
the rows the classifier named are not learned from at all."""

from __future__ import annotations

import numpy as np

from hermeneut.jobs.training import left_out
from sinks.query.history import History

S = 10**9


def _history(gpus: list[str], seconds: list[int], clusters: list[str] | None = None) -> History:
    n = len(gpus)
    return History(
        "llm-serving", "NVIDIA H100 80GB HBM3", tuple(clusters or ["c"] * n), tuple(gpus),
        np.array(seconds, dtype=np.int64) * S,
        np.zeros((n, 1)), np.zeros((n, 1)), (None,) * n, ("static",) * n,
    )  # fmt: skip


def test_fault_windows_and_marked_events_are_left_out_and_counted_once_each() -> None:
    h = _history(["a"] * 6 + ["b"] * 2, [0, 10, 20, 30, 40, 50, 10, 20])
    known = np.array([True] * 7 + [False])  # b's last row: an inferred application, never learned from
    faults = [("c", "a", 10 * S, 20 * S)]
    marked = [("c", "a", 20 * S, 40 * S), ("c", "b", 0, 30 * S)]
    use, why = left_out(h, known, faults, marked)
    assert use.tolist() == [True, False, False, False, False, True, False, False]
    assert why == {"fault findings": 2, "marked anomalous": 3}  # a@20 is in both: counted as a fault's


def test_a_fault_window_leaves_out_its_own_clusters_gpu_only() -> None:
    """Two clusters each have a GPU named g150-gpu0 (imported as <node>-gpu<index>): a fault there in cluster a
    leaves out a's rows in its window, none of b's (issue 37: 38,368 of 80,871 rows of another cluster were)."""
    h = _history(["g150-gpu0"] * 4, [10, 20, 10, 20], ["a", "a", "b", "b"])
    known = np.ones(4, dtype=bool)
    use, why = left_out(h, known, [("a", "g150-gpu0", 0, 30 * S)], [("b", "g150-gpu0", 20 * S, 20 * S)])
    assert use.tolist() == [False, False, True, False]
    assert why == {"fault findings": 2, "marked anomalous": 1}
