"""Episodes: open findings per row and detector, readable as arrays, listed in the order they opened, and the
findings their starts, repeats and clears send."""

from __future__ import annotations

import numpy as np

from pipeline.events import GpuSample, InterpretedBatch, InterpretedEvent, Severity, Workload
from processors.episodes import Description, Episodes
from processors.state import GpuSlots

WHERE = ("c", "n", "GPU-1", "H100")


def test_open_send_repeat_close() -> None:
    slots = GpuSlots()
    slots.slots([("c", "n", "GPU-0"), ("c", "n", "GPU-1")])
    episodes = Episodes(slots, ("thermal", "leak"))
    assert not episodes and episodes.active(np.array([0, 1]), "leak").tolist() == [False, False]
    episodes.open(1, "leak", 100, {"slope": 0.5})
    episodes.open(0, "thermal", 150)
    assert episodes.active(np.array([0, 1]), "leak").tolist() == [False, True] and episodes.is_open(0, "thermal")
    assert [(row, name) for row, name, _ in episodes.listed()] == [(1, "leak"), (0, "thermal")]
    said = Description(Severity.WARNING, "leaking", "tell the owner", {"slope": 0.5})
    wl = Workload("llm-serving")
    found = episodes.send(1, "leak", True, 160, WHERE, said, wl, 1)
    assert (found.detector, found.active, found.ts_ns, found.since_ns, found.summary) == (
        "leak",
        True,
        160,
        100,
        "leaking",
    )
    assert (found.gpu_uuid, found.workload, found.gpu_index, found.evidence) == ("GPU-1", wl, 1, {"slope": 0.5})
    assert episodes.last_sent(np.array([1]), "leak").tolist() == [160] and episodes.get(1, "leak").last_sent_ns == 160
    assert episodes.get(1, "leak").detail == {"slope": 0.5}
    cleared = episodes.send(1, "leak", False, 200, WHERE, said._replace(summary="cleared: leaking"))
    episodes.close(1, "leak")
    assert not cleared.active and cleared.since_ns == 100 and cleared.gpu_index is None
    assert not episodes.is_open(1, "leak") and [name for _, name, _ in episodes.listed()] == ["thermal"]


def test_episodes_per_node_grow_with_the_nodes() -> None:
    slots = GpuSlots(capacity=1)
    episodes = Episodes(slots, ("power-capping",), per="node")
    slots.slots([("c", f"n{i}", "GPU-0") for i in range(5)])
    episodes.open(4, "power-capping", 7)
    assert episodes.active(np.arange(5), "power-capping").tolist() == [False] * 4 + [True]


def _round(seconds: int, *gpus: int) -> InterpretedBatch:
    return InterpretedBatch.from_events(
        [InterpretedEvent(GpuSample("c", "n", f"GPU-{i}", i, "H100", 10**18 + seconds * 10**9, {})) for i in gpus]
    )


def test_the_episodes_of_a_freed_lane_go_unsent_and_its_slots_start_clean() -> None:
    """An import (a lane behind live) leaves episodes open on its GPU and its node; once its lane is freed, the GPU
    of the next import that gets the slot and node id has none (a repeat or clear of the old one would be a finding
    about data never seen), and live's stay."""
    wall = [0.0]
    slots = GpuSlots(idle_s=600.0, clock=lambda: wall[0])
    gpus, nodes = Episodes(slots, ("leak",)), Episodes(slots, ("power-capping",), per="node")
    assert slots.rows(_round(10_000, 0)).tolist() == [0]  # live
    assert slots.rows(_round(0, 0)).tolist() == [1]  # the first import
    gpus.open(0, "leak", 10_000)
    gpus.open(1, "leak", 5)
    nodes.open(1, "power-capping", 5)
    for t in range(10_001, 10_071):  # live goes on for 700 s: the import is done
        wall[0] += 10.0
        slots.rows(_round(t, 0))
    assert slots.freed == 1
    assert slots.rows(_round(50, 0)).tolist() == [1] and slots.node_of[1] == 1  # the next import: slot and node reused
    assert [(row, name) for row, name, _ in gpus.listed()] == [(0, "leak")] and not nodes
    assert gpus.active(np.array([0, 1]), "leak").tolist() == [True, False]
    assert not nodes.is_open(1, "power-capping")
