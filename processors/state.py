"""The per-GPU state store: one slot table (GPU -> row index) for every stage that keeps state per GPU.

Stateful stages (the detectors, the baselines' anomaly tracker, the classifier's window buffer) keep what they know
about each GPU in numpy arrays with one row per *slot*, so that a batch updates all its GPUs with vector operations.
:class:`GpuSlots` is the one table that hands slots out: a GPU, keyed ``(cluster, node, gpu_uuid)``, gets the next
slot the first time it is seen (rows of a batch in order), and its node the next node id. The state itself is
declared next to the rule that uses it, as a dataclass whose array fields are :func:`column` s (the fill value of a
new row, the shape of one row); :meth:`GpuSlots.attach` allocates them and grows them, all together, when GPUs (or
nodes) outgrow the rows allocated::

    @dataclass(eq=False)
    class Streaks:
        since: np.ndarray = column(-1, dtype=np.int64)
        window: np.ndarray = column(np.nan, 30, 13)

    streaks = slots.attach(Streaks())

The stages of one interpreter share one table (processors.app.interpreter_from), so slot ``i`` is the same GPU in
every stage and a batch's rows are looked up once: :meth:`GpuSlots.rows` keeps its answer for the batch it was last
asked about (recognised by its key columns, which the stages pass on unchanged). A stage built alone makes its own.

**History and live never share a clock.** A long-lived processor may read a node's live rounds and, interleaved on
the same partition, history of the same node: an import of older data, a second import of the same range. Judged
against the state of the live rows (or of the first import), history that goes back in time fakes what the state
was built to see: a GPU whose newest row is hours older than its node's looks "silent for 40755 s while the node's
other GPUs keep reporting", an error counter read back lower and then higher again looks like a new uncorrectable
error. So the table keys a slot by event time too: every node has *lanes*, each a stream of rounds that move
forward in time, with its own clock (the newest time of any row it took). A row goes to the lane of its node it
continues: the lane its node's previous round went to if the row is within ``behind_s`` of that lane's clock (either
way), else the lane whose clock is nearest among those it is not more than ``behind_s`` behind; a row further
behind every lane of its node starts a lane of its own, with fresh state. Slots are per (GPU, lane) and node ids
per (node, lane), so every stage's state, the detectors' node clock included, only ever compares rows of one
event-time window: a silence is evidence only when the node's other GPUs report in the same window. A history lane
starts from nothing, so an import judged twice is judged alike. :meth:`GpuSlots.key` names the GPU without its lane:
a finding of a history lane is about the same GPU, dated at its own time.

**A lane that is done is freed.** Every import of older data (every import of a range again) opens lanes; kept,
they would grow the state with every import. With ``idle_s`` set, a lane that took no row for ``idle_s`` of the
table's own clock while another lane of its node is ahead of it in event time is freed. The table's clock is wall
time while data flows: a pause between two batches counts at most :data:`QUIET_S`, so an outage (Kafka down, the
processor stopped in a debugger) ages no lane, and an import that stalls with everything else resumes its lane.
An import that stalls alone while live data flows for ``idle_s`` is taken for done, and its rest starts a lane
from nothing, as an interrupted import resumed later does. When a lane is freed, its slots and node id are handed
out again, every attached state's rows of them are filled anew, and the stages that keep more per slot than
attached columns are told (:meth:`GpuSlots.on_free`). The lane
ahead in event time of every other of its node (the live one) is never freed, nor the only lane of a node: a node
that goes silent keeps its state, and its silence stays evidence. A freed lane's number is never reused: a later
import starts a new lane, from nothing, as it would have anyway. The processor frees lanes idle for
``detectors.lane_idle_s`` (pipeline/config.py).

What a freed lane still had open goes **without a message**: every stage's forget (the open episodes of
processors.episodes, the XIDs of a storm's window, a job's peer group and its pace) drops the lane's share silently.
A lane is freed only once no row came to it for ``idle_s`` while another lane of its node is ahead: an import that
finished long ago. What it found was sent dated at its own time and is history; a clear sent now would say the fault
ended, which no row showed, and a repeat would say it still holds. Silence is evidence of nothing (the alert manager
marks an alert whose finding stopped repeating stale and keeps it open), so nothing is said.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, TypeVar

import numpy as np
from numpy.typing import DTypeLike

from pipeline.events import InterpretedBatch

#: how the stages name a GPU: (cluster, node, gpu_uuid)
GpuKey = tuple[str, str, str]
#: a node: (cluster, node)
NodeKey = tuple[str, str]
#: how far (s) a row may be behind its lane's clock and still be that lane's: a GPU event dated just before its
#: round, a node's sources a little apart, a retried message; further behind, it is history with a lane of its own
#: (a shorter range read again joins its lane, where no time and no counter goes back: nothing is faked)
BEHIND_S: Final = 30.0
#: the most (s) a pause between two batches adds to the table's clock, by which lanes are idle: a longer pause is
#: an outage, no lane's doing (where the fleet samples less often than this, lanes are freed later, never sooner)
QUIET_S: Final = 30.0
#: what a state's rows stand for
Per = Literal["gpu", "node"]
S = TypeVar("S")
_FILL: Final = "fill"


def column(fill: Any, *shape: int, dtype: DTypeLike | None = None) -> Any:
    """A field of a state dataclass holding one row per slot: ``fill`` in a new row, each row of ``shape`` (the
    dtype is ``fill`` 's unless given)."""
    kind = np.dtype(dtype) if dtype is not None else np.asarray(fill).dtype
    return dataclasses.field(default_factory=lambda: np.full((0, *shape), fill, dtype=kind), metadata={_FILL: fill})


def refill(state: Any, rows: np.ndarray) -> None:
    """Fill ``rows`` of every :func:`column` of ``state`` as new rows are filled (their slots freed)."""
    for f in dataclasses.fields(state):
        if _FILL in f.metadata:
            getattr(state, f.name)[rows] = f.metadata[_FILL]


def grow(state: Any, rows: int) -> None:
    """Grow every :func:`column` of ``state`` to ``rows`` rows, the new ones filled; the rows there stay as they
    are. The table calls it for the states attached to it; a state sized otherwise (a job's workers) calls it."""
    for f in dataclasses.fields(state):
        if _FILL not in f.metadata:
            continue
        old: np.ndarray = getattr(state, f.name)
        if len(old) < rows:
            new = np.full((rows, *old.shape[1:]), f.metadata[_FILL], dtype=old.dtype)
            new[: len(old)] = old
            setattr(state, f.name, new)


def take(state: Any, rows: np.ndarray) -> None:
    """Keep only ``rows`` (indices or a mask) of every :func:`column` of ``state``, in that order: a state sized
    otherwise (a job's workers) that loses some of them."""
    for f in dataclasses.fields(state):
        if _FILL in f.metadata:
            setattr(state, f.name, getattr(state, f.name)[rows])


@dataclasses.dataclass(eq=False)
class _Nodes:
    #: per slot: the id of the GPU's node (its node's lane)
    node_of: np.ndarray = column(-1, dtype=np.int64)


@dataclasses.dataclass(eq=False)
class _Clocks:
    #: per node id (a node's lane): the newest time of a row the lane took
    clock: np.ndarray = column(-1, dtype=np.int64)
    #: per node id: whether its node has other lanes (rows of such a node are placed one round at a time)
    shared: np.ndarray = column(False)
    #: per node id: when (the table's clock, s) the lane last took a row
    used: np.ndarray = column(-np.inf)


class GpuSlots:
    """GPU -> slot and node -> node id, with the state of every stage attached (see module docstring)."""

    def __init__(
        self,
        capacity: int = 64,
        behind_s: float = BEHIND_S,
        idle_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``idle_s``: free lanes that are done (module docstring; None: never), by ``clock`` (seconds)."""
        self._slot: dict[GpuKey | tuple[str, str, str, int], int] = {}
        self._keys: list[GpuKey] = []
        self._lane: list[int] = []
        self._behind_ns = int(behind_s * 1e9)
        #: per node: the clock of each of its lanes, and the lane its latest round went to
        self._lanes: dict[NodeKey, _Lanes] = {}
        #: the lanes of the GPU events of the batch :meth:`rows` was last asked about, by (cluster, node, ts_ns)
        self._placed: dict[tuple[str, str, int], int] = {}
        self._index: list[int] = []
        self._model: list[str] = []
        self._node_id: dict[tuple[str, str, int], int] = {}
        self._rows: dict[Per, int] = {"gpu": capacity, "node": capacity}
        self._attached: list[tuple[weakref.ref[Any], Per]] = []
        self._last: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], np.ndarray] | None = None
        self._idle_s, self._clock = idle_s, clock
        #: the table's clock (s; module docstring), and the wall time it last moved on
        self._work, self._seen = 0.0, clock()
        self._swept = 0.0
        #: slots and node ids of freed lanes, handed out again lowest first; node ids handed out so far
        self._free_slots: list[int] = []
        self._free_nodes: list[int] = []
        self._node_ids = 0
        self._forget: list[weakref.WeakMethod[Callable[[np.ndarray, np.ndarray], None]]] = []
        #: lanes freed so far
        self.freed = 0
        self._nodes = self.attach(_Nodes())
        self._clocks = self.attach(_Clocks(), per="node")

    def __len__(self) -> int:
        """Slots handed out, freed ones included: the rows in use of a state attached per GPU are below it."""
        return len(self._keys)

    @property
    def in_use(self) -> int:
        """Slots held by a GPU: GPUs seen, once per lane not freed."""
        return len(self._slot)

    @property
    def nodes(self) -> int:
        """Node ids held: nodes seen, once per lane not freed."""
        return len(self._node_id)

    @property
    def node_of(self) -> np.ndarray:
        """Per slot, its node's id (one row per allocated slot; -1 past the GPUs seen)."""
        return self._nodes.node_of

    def key(self, slot: int) -> GpuKey:
        """The GPU of a slot, whatever its lane."""
        return self._keys[slot]

    def lanes_of(self, node: NodeKey) -> int:
        """How many lanes a node has, freed ones not counted (0: not seen)."""
        lanes = self._lanes.get(node)
        return 0 if lanes is None else len(lanes.ids)

    def lane(self, slot: int) -> int:
        """The lane of a slot: 0 for the first stream of its node's rows, then one per history further behind."""
        return self._lane[slot]

    def index(self, slot: int) -> int:
        """The GPU's index on its node, as first seen (-1 if it came with none)."""
        return self._index[slot]

    def model(self, slot: int) -> str:
        """The GPU's model, as first seen ("" if it came with none: a GPU known only from its events)."""
        return self._model[slot]

    def find(self, key: GpuKey, lane: int = 0) -> int | None:
        """The slot of a GPU seen before in ``lane``, else None."""
        return self._slot.get(_full(key, lane))

    def slot(self, key: GpuKey, index: int = -1, model: str = "", ts_ns: int | None = None) -> int:
        """The slot of one GPU, added with its index and model if it is new: in the lane a row at ``ts_ns``
        belongs to (None: the lane its node's latest round went to)."""
        if ts_ns is None:
            lane = self._lane_now(key[:2])
        else:
            placed = self._placed.get((*key[:2], ts_ns))
            lane = self._lanes_of([key[:2]], np.array([ts_ns]))[0] if placed is None else placed
        full = _full(key, int(lane))
        found = self._slot.get(full)
        if found is None:
            found = self._slot[full] = self._new_slot()
            self._add(found, key, int(lane), index, model)
        return found

    def slots(self, keys: Iterable[GpuKey]) -> np.ndarray:
        """The slot of every key, in order, in the lane its node's latest round went to; a GPU seen for the first
        time gets the next one."""
        keys = list(keys)
        lanes = np.fromiter((self._lane_now(k[:2]) for k in keys), dtype=np.int64, count=len(keys))
        return self._lookup(keys, lanes, (), ())

    def rows(self, batch: InterpretedBatch) -> np.ndarray:
        """The slot of every row of a batch, each in the lane its time belongs to (read-only; the same array again
        for the same batch's key columns)."""
        last = self._last
        if last is not None and last[0] is batch.gpu_uuid and last[1] is batch.node and last[2] is batch.cluster:
            return last[3]
        now = self._clock()
        self._work += min(max(now - self._seen, 0.0), QUIET_S)
        self._seen = now
        if self._idle_s is not None and self._work - self._swept >= self._idle_s / 4:
            self._sweep(self._work)
        keys = list(zip(batch.cluster, batch.node, batch.gpu_uuid, strict=True))
        out = self._continuing(keys, batch.ts_ns) if not batch.gpu_events else None
        if out is None:
            out = self._placed_rows(batch, keys)
        out.flags.writeable = False
        self._last = (batch.gpu_uuid, batch.node, batch.cluster, out)
        return out

    def _continuing(self, keys: list[GpuKey], ts: np.ndarray) -> np.ndarray | None:
        """The slots of a batch whose every row continues its GPU's only lane (live data: one dict lookup per row
        and a vector comparison), the clocks moved on; None if any row does not (a GPU not seen yet, a node with
        several lanes, a row further behind than ``behind_s``)."""
        table = self._slot
        slots = np.fromiter((table.get(k, -1) for k in keys), dtype=np.int64, count=len(keys))
        if (slots < 0).any():
            return None
        node = self._nodes.node_of[slots]
        clocks = self._clocks
        if clocks.shared[node].any() or (ts < clocks.clock[node] - self._behind_ns).any():
            return None
        np.maximum.at(clocks.clock, node, ts)
        clocks.used[node] = self._work
        self._placed = {}
        return slots

    def _placed_rows(self, batch: InterpretedBatch, keys: list[GpuKey]) -> np.ndarray:
        """The slots of a batch's rows, each placed in its lane round by round (:meth:`_lanes_of`)."""
        # the batch's GPU events are placed with its rows (an event dated between two rounds is their lane's), and
        # :meth:`slot` finds them there
        events = [((e.cluster, e.node), e.ts_ns) for e in batch.gpu_events]
        ts = np.concatenate([batch.ts_ns, np.array([t for _, t in events], dtype=np.int64)])
        lanes = self._lanes_of([k[:2] for k in keys] + [node for node, _ in events], ts)
        placed = lanes[len(keys) :].tolist()
        self._placed = {(*node, t): lane for (node, t), lane in zip(events, placed, strict=True)}
        return self._lookup(keys, lanes[: len(keys)], batch.gpu_index, batch.gpu_model)

    def _lane_now(self, node: NodeKey) -> int:
        lanes = self._lanes.get(node)
        return 0 if lanes is None else lanes.last

    def _lanes_of(self, nodes: list[NodeKey], ts: np.ndarray) -> np.ndarray:
        """The lane of every row (its node, its time; see the module docstring), placed round by round, oldest
        first; the lanes' clocks moved on."""
        out = np.zeros(len(nodes), dtype=np.int64)
        if not nodes:
            return out
        ids: dict[NodeKey, int] = {}
        of = np.fromiter((ids.setdefault(k, len(ids)) for k in nodes), dtype=np.int64, count=len(nodes))
        order = np.argsort(of, kind="stable")
        bounds = np.flatnonzero(np.r_[True, of[order][1:] != of[order][:-1], True]).tolist()
        for node, a, b in zip(ids, bounds[:-1], bounds[1:], strict=True):
            rows = order[a:b]
            rounds, which = np.unique(ts[rows], return_inverse=True)
            out[rows] = np.array([self._place(node, int(r)) for r in rounds.tolist()], dtype=np.int64)[which]
        return out

    def _place(self, node: NodeKey, ts_ns: int) -> int:
        """The lane of a round of ``node`` at ``ts_ns`` (see the module docstring); its clock moves on. A new lane
        gets its node id at once (its clock lives there)."""
        lanes = self._lanes.get(node)
        if lanes is None:  # its first lane may have been opened already, by a GPU's slot asked for without a time
            first = self._node_id.get((*node, 0))
            lanes = self._lanes[node] = _Lanes({} if first is None else {0: first}, 0, 1 if first is not None else 0)
        behind = self._behind_ns
        now = {lane: int(self._clocks.clock[i]) for lane, i in lanes.ids.items()}
        if lanes.last in now and abs(ts_ns - now[lanes.last]) <= behind:
            lane = lanes.last
        else:
            near = [(abs(ts_ns - c), lane) for lane, c in now.items() if ts_ns >= c - behind]
            lane = min(near)[1] if near else lanes.next
        if lane not in lanes.ids:
            lanes.ids[lane] = self._node((*node, lane))
            lanes.next = lane + 1
            self._clocks.shared[list(lanes.ids.values())] = len(lanes.ids) > 1
        i = lanes.ids[lane]
        self._clocks.clock[i] = max(int(self._clocks.clock[i]), ts_ns)
        self._clocks.used[i] = self._work
        lanes.last = lane
        return lane

    def on_free(self, forget: Callable[[np.ndarray, np.ndarray], None]) -> None:
        """Have ``forget(slots, node_ids)`` (a bound method; held weakly) called when a lane is freed, before the
        slots and node id are handed out again: for what a stage keeps per slot or node besides attached columns
        (those the table fills anew itself)."""
        self._forget.append(weakref.WeakMethod(forget))

    def _sweep(self, now: float) -> None:
        """Free every lane that is done: idle for ``idle_s`` and behind another lane of its node (module
        docstring)."""
        self._swept = now
        assert self._idle_s is not None
        clock, used = self._clocks.clock, self._clocks.used
        for node, lanes in self._lanes.items():
            if len(lanes.ids) < 2:
                continue
            ahead = max(int(clock[i]) for i in lanes.ids.values())
            done = [
                lane
                for lane, i in lanes.ids.items()
                if int(clock[i]) < ahead - self._behind_ns and now - float(used[i]) >= self._idle_s
            ]
            for lane in done:
                self._free(node, lanes, lane)

    def _free(self, node: NodeKey, lanes: _Lanes, lane: int) -> None:
        i = lanes.ids.pop(lane)
        gpus = np.flatnonzero(self._nodes.node_of[: len(self._keys)] == i)
        ids = np.array([i], dtype=np.int64)
        for hook in self._forget:
            forget = hook()
            if forget is not None:
                forget(gpus, ids)
        for slot in gpus.tolist():
            del self._slot[_full(self._keys[slot], lane)]
            self._lane[slot] = -1
            heapq.heappush(self._free_slots, slot)
        del self._node_id[(*node, lane)]
        heapq.heappush(self._free_nodes, i)
        for ref, per in self._attached:
            state = ref()
            if state is not None:
                refill(state, gpus if per == "gpu" else ids)
        if lanes.last == lane:
            lanes.last = max(lanes.ids, key=lambda k: int(self._clocks.clock[lanes.ids[k]]))
        self._clocks.shared[list(lanes.ids.values())] = len(lanes.ids) > 1
        self._last, self._placed = None, {}
        self.freed += 1

    def _node(self, key: tuple[str, str, int]) -> int:
        """The id of a node's lane, the next one if it is new."""
        found = self._node_id.get(key)
        if found is None:
            if self._free_nodes:
                found = heapq.heappop(self._free_nodes)
            else:
                found, self._node_ids = self._node_ids, self._node_ids + 1
            self._node_id[key] = found
            self._grow("node", found + 1)
        return found

    def attach(self, state: S, per: Per = "gpu") -> S:
        """Allocate the :func:`column` fields of ``state`` (a row per GPU, or per node) and keep them growing with
        the table; returns ``state``. The table holds it weakly: a stage that lets its state go lets it go."""
        self._attached.append((weakref.ref(state), per))
        grow(state, self._rows[per])
        return state

    def _lookup(self, keys: list[GpuKey], lanes: np.ndarray, index: Sequence[int], model: Sequence[str]) -> np.ndarray:
        table = self._slot
        full = [_full(k, lane) for k, lane in zip(keys, lanes.tolist(), strict=True)] if lanes.any() else keys
        out = np.fromiter((table.get(k, -1) for k in full), dtype=np.int64, count=len(keys))
        for row in np.flatnonzero(out < 0).tolist():  # GPUs new to their lane, in the order of their first rows
            found = table.get(full[row])
            if found is None:
                found = table[full[row]] = self._new_slot()
                gpu_index, gpu_model = index[row] if len(index) else -1, model[row] if model else ""
                self._add(found, keys[row], int(lanes[row]), gpu_index, gpu_model)
            out[row] = found
        return out

    def _new_slot(self) -> int:
        """A freed slot (lowest first), else the next one."""
        return heapq.heappop(self._free_slots) if self._free_slots else len(self._keys)

    def _add(self, slot: int, key: GpuKey, lane: int, index: int, model: str) -> None:
        """Record the GPU (in ``lane``) that just got ``slot`` (and its node's lane, if that is new)."""
        if slot == len(self._keys):
            self._keys.append(key)
            self._lane.append(lane)
            self._index.append(index)
            self._model.append(model)
        else:  # a freed slot handed out again
            self._keys[slot], self._lane[slot], self._index[slot], self._model[slot] = key, lane, index, model
        node = self._node((*key[:2], lane))
        self._grow("gpu", slot + 1)
        self._nodes.node_of[slot] = node

    def _grow(self, per: Per, needed: int) -> None:
        if needed <= self._rows[per]:
            return
        while self._rows[per] < needed:
            self._rows[per] *= 2
        alive = [(ref, p) for ref, p in self._attached if ref() is not None]
        self._attached = alive
        for ref, p in alive:
            state = ref()
            if p == per and state is not None:
                grow(state, self._rows[per])


@dataclasses.dataclass
class _Lanes:
    """A node's lanes: the node id of each lane not freed (where its clock is), the lane its latest round went to,
    and the number the next new lane gets (freed numbers are not reused)."""

    ids: dict[int, int] = dataclasses.field(default_factory=dict)
    last: int = 0
    next: int = 0


def _full(key: GpuKey, lane: int) -> GpuKey | tuple[str, str, str, int]:
    """A slot's key in the table: the GPU's in its node's first lane (the only one of live data), with the lane
    after it in the others."""
    return key if lane == 0 else (*key, lane)
