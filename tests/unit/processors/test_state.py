"""The per-GPU state store: one slot per GPU in the order GPUs are first seen, state columns grown together, a batch's
rows looked up once."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from dataclasses import dataclass

import numpy as np

from pipeline.events import GpuSample, InterpretedBatch, InterpretedEvent
from processors.state import GpuSlots, column


@dataclass(eq=False)
class _Seen:
    since: np.ndarray = column(-1, dtype=np.int64)
    ring: np.ndarray = column(np.nan, 3)


@dataclass(eq=False)
class _PerGpu:
    count: np.ndarray = column(0, dtype=np.int64)


@dataclass(eq=False)
class _PerNode:
    latest: np.ndarray = column(0.0)


def _batch(*gpus: tuple[str, str, int]) -> InterpretedBatch:
    return InterpretedBatch.from_events(
        [InterpretedEvent(GpuSample("c", node, f"GPU-{i}", i, model, 10**18, {})) for node, model, i in gpus]
    )


def test_gpus_get_slots_in_the_order_first_seen_and_nodes_their_ids() -> None:
    slots = GpuSlots()
    assert slots.rows(_batch(("n1", "H100", 0), ("n2", "A10G", 1), ("n1", "H100", 0))).tolist() == [0, 1, 0]
    assert slots.rows(_batch(("n2", "A10G", 3), ("n2", "A10G", 1))).tolist() == [2, 1]
    assert slots.slot(("c", "n3", "GPU-9"), 9) == 3 and slots.find(("c", "n3", "GPU-8")) is None
    assert len(slots) == 4 and slots.nodes == 3
    assert slots.node_of[:4].tolist() == [0, 1, 1, 2]
    assert [slots.key(s) for s in range(4)][1:3] == [("c", "n2", "GPU-1"), ("c", "n2", "GPU-3")]
    assert (slots.index(2), slots.model(2), slots.index(3), slots.model(3)) == (3, "A10G", 9, "")


def test_attached_state_is_allocated_filled_and_grows_with_the_table() -> None:
    slots = GpuSlots(capacity=2)
    seen = slots.attach(_Seen())
    nodes = slots.attach(_PerNode(), per="node")
    assert seen.since.tolist() == [-1, -1] and seen.ring.shape == (2, 3)
    slots.slots([("c", "n0", "GPU-0")])
    seen.since[0], seen.ring[0] = 7, [1.0, 2.0, 3.0]
    nodes.latest[0] = 5.0
    keys = [("c", f"n{i // 4}", f"GPU-{i}") for i in range(40)]
    assert slots.slots(keys).tolist() == list(range(40))
    assert len(seen.since) >= 40 and seen.ring.shape[1:] == (3,) and len(nodes.latest) >= 10
    assert seen.since[0] == 7 and seen.ring[0].tolist() == [1.0, 2.0, 3.0] and nodes.latest[0] == 5.0
    assert (seen.since[1:40] == -1).all() and np.isnan(seen.ring[1:40]).all() and (nodes.latest[1:10] == 0).all()


def test_a_state_let_go_is_not_kept_alive_by_the_table() -> None:
    slots = GpuSlots(capacity=1)
    state = slots.attach(_Seen())
    gone = weakref.ref(state)
    del state
    gc.collect()
    assert gone() is None
    assert slots.slots([("c", "n", f"GPU-{i}") for i in range(5)]).tolist() == [0, 1, 2, 3, 4]


def test_a_batch_is_looked_up_once_by_every_stage() -> None:
    slots = GpuSlots()
    batch = _batch(("n1", "H100", 0), ("n1", "H100", 1))
    first = slots.rows(batch)
    assert slots.rows(dataclasses.replace(batch, explanation=("a", "b"))) is first  # a stage's output: same GPUs
    assert not first.flags.writeable
    other = _batch(("n1", "H100", 1), ("n1", "H100", 0))
    assert slots.rows(other).tolist() == [1, 0]


def _at(node: str, seconds: int, *gpus: int) -> InterpretedBatch:
    return InterpretedBatch.from_events(
        [InterpretedEvent(GpuSample("c", node, f"GPU-{i}", i, "H100", 10**18 + seconds * 10**9, {})) for i in gpus]
    )


def test_history_behind_a_nodes_clock_gets_slots_and_a_node_id_of_its_own() -> None:
    """Live rounds of n1 at t=10000 s; its history from t=0 to 100 (an import), again from t=0 (the same range
    imported again), interleaved with live rounds: three lanes, each with its own slots and node id; the key names
    the GPU."""
    slots = GpuSlots(behind_s=30)
    assert slots.rows(_at("n1", 10_000, 0, 1)).tolist() == [0, 1]
    assert slots.rows(_at("n1", 10_001, 0, 1)).tolist() == [0, 1]  # live goes on
    assert slots.rows(_at("n1", 0, 0, 1)).tolist() == [2, 3]  # history: far behind live
    assert slots.rows(_at("n1", 10_002, 1, 0)).tolist() == [1, 0]  # live again, between two history messages
    assert slots.rows(_at("n1", 100, 0, 1)).tolist() == [2, 3]  # the history goes on where it was
    assert slots.rows(_at("n1", 9_990, 0)).tolist() == [0]  # 12 s late: the live stream's
    assert slots.rows(_at("n1", 0, 0, 1)).tolist() == [4, 5]  # the same range again, behind both
    assert slots.rows(_at("n1", 2, 0)).tolist() == [4]  # continues its own lane, not the first import's
    assert [slots.lane(s) for s in range(6)] == [0, 0, 1, 1, 2, 2] and slots.lanes_of(("c", "n1")) == 3
    assert slots.key(4) == slots.key(2) == slots.key(0) == ("c", "n1", "GPU-0")
    assert slots.node_of[:6].tolist() == [0, 0, 1, 1, 2, 2] and slots.nodes == 3
    assert slots.find(("c", "n1", "GPU-1"), 2) == 5 and slots.find(("c", "n1", "GPU-1")) == 1


def test_a_gpu_event_goes_to_the_lane_of_its_time() -> None:
    slots = GpuSlots(behind_s=30)
    slots.rows(_at("n1", 10_000, 0))
    slots.rows(_at("n1", 0, 0))
    assert slots.slot(("c", "n1", "GPU-0"), 0, "", 10**18 + 5 * 10**9) == 1  # an XID of the history
    assert slots.slot(("c", "n1", "GPU-0"), 0, "", 10**18 + 10_003 * 10**9) == 0  # one live
    assert slots.slot(("c", "n1", "GPU-7"), 7) == 2 and slots.lane(2) == 0  # no time: the node's latest round's lane
    assert slots.rows(_at("n1", 10_004, 7)).tolist() == [2]


def test_an_outage_ages_no_lane_and_an_import_that_stalls_with_everything_resumes_its_lane() -> None:
    """Issue 37: an import stalled over ``idle_s`` had its lane freed mid-way, its rest starting from nothing. The
    table's clock moves only while batches come (a pause counts at most ``QUIET_S``): 20 minutes of no data at all
    (Kafka down) free nothing and the import goes on in its lane; the same import silent while live reports for 700 s
    is taken for done (a stall of the import alone, as the module docstring says)."""
    wall = [0.0]
    slots = GpuSlots(behind_s=30, idle_s=600.0, clock=lambda: wall[0])
    state = slots.attach(_PerGpu())
    for t in range(100):
        wall[0] += 1.0
        slots.rows(_at("n1", 100_000 + t, 0))
        state.count[slots.rows(_at("n1", t, 0))] += 1  # the import, in lane 1
    wall[0] += 1200.0  # the outage: nothing comes
    for t in range(100, 200):
        wall[0] += 1.0
        slots.rows(_at("n1", 100_000 + t, 0))
        assert slots.rows(_at("n1", t, 0)).tolist() == [1]  # the import's rest: its lane, its state
        state.count[1] += 1
    assert slots.freed == 0 and state.count[1] == 200
    for t in range(200, 900):  # the import stalls alone: live reports on
        wall[0] += 1.0
        slots.rows(_at("n1", 100_000 + t, 0))
    assert slots.freed == 1 and slots.lanes_of(("c", "n1")) == 1


def test_lanes_that_are_done_are_freed_and_the_live_lane_never() -> None:
    """A live node reports every round while the same range of its history is imported 50 times (each import 100
    rounds, then idle): with ``idle_s`` the table holds at most the live lane and two imports' lanes, every attached
    state stays that size, and the live GPUs keep their slots and their state (a count of their rows) throughout;
    without it every import adds a lane for good."""
    wall = [0.0]
    kept, bounded = GpuSlots(behind_s=30), GpuSlots(behind_s=30, idle_s=600.0, clock=lambda: wall[0])
    rows = {id(t): t.attach(_PerGpu()) for t in (kept, bounded)}
    live_t = 100_000
    for _ in range(50):
        for t in range(100):
            wall[0] += 1.0
            live_t += 1
            for table in (kept, bounded):
                live = table.rows(_at("n1", live_t, 0, 1))
                assert live.tolist() == [0, 1]  # the live lane is never freed: its slots stay
                rows[id(table)].count[live] += 1
                table.rows(_at("n1", t, 0, 1))  # the import of the same range, behind live
        for _ in range(700):  # idle: the import is done, live goes on
            wall[0] += 1.0
            live_t += 1
            for table in (kept, bounded):
                live = table.rows(_at("n1", live_t, 0, 1))
                rows[id(table)].count[live] += 1
    grown = kept.lanes_of(("c", "n1"))
    assert grown > 30 and kept.in_use == 2 * grown
    assert bounded.lanes_of(("c", "n1")) <= 3 and bounded.in_use <= 6 and len(bounded) <= 6 and bounded.nodes <= 3
    assert bounded.freed >= 48 and len(rows[id(bounded)].count) <= 64  # the attached state did not grow
    assert rows[id(bounded)].count[[0, 1]].tolist() == rows[id(kept)].count[[0, 1]].tolist() == [50 * 800] * 2
