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
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal, TypeVar

import numpy as np
from numpy.typing import DTypeLike

from pipeline.events import InterpretedBatch

#: how the stages name a GPU: (cluster, node, gpu_uuid)
GpuKey = tuple[str, str, str]
#: what a state's rows stand for
Per = Literal["gpu", "node"]
S = TypeVar("S")
_FILL: Final = "fill"


def column(fill: Any, *shape: int, dtype: DTypeLike | None = None) -> Any:
    """A field of a state dataclass holding one row per slot: ``fill`` in a new row, each row of ``shape`` (the
    dtype is ``fill`` 's unless given)."""
    kind = np.dtype(dtype) if dtype is not None else np.asarray(fill).dtype
    return dataclasses.field(default_factory=lambda: np.full((0, *shape), fill, dtype=kind), metadata={_FILL: fill})


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


@dataclasses.dataclass(eq=False)
class _Nodes:
    #: per slot: the id of the GPU's node
    node_of: np.ndarray = column(-1, dtype=np.int64)


class GpuSlots:
    """GPU -> slot and node -> node id, with the state of every stage attached (see module docstring)."""

    def __init__(self, capacity: int = 64) -> None:
        self._slot: dict[GpuKey, int] = {}
        self._keys: list[GpuKey] = []
        self._index: list[int] = []
        self._model: list[str] = []
        self._node_id: dict[tuple[str, str], int] = {}
        self._rows: dict[Per, int] = {"gpu": capacity, "node": capacity}
        self._attached: list[tuple[weakref.ref[Any], Per]] = []
        self._last: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], np.ndarray] | None = None
        self._nodes = self.attach(_Nodes())

    def __len__(self) -> int:
        """GPUs seen."""
        return len(self._keys)

    @property
    def nodes(self) -> int:
        """Nodes seen."""
        return len(self._node_id)

    @property
    def node_of(self) -> np.ndarray:
        """Per slot, its node's id (one row per allocated slot; -1 past the GPUs seen)."""
        return self._nodes.node_of

    def key(self, slot: int) -> GpuKey:
        return self._keys[slot]

    def index(self, slot: int) -> int:
        """The GPU's index on its node, as first seen (-1 if it came with none)."""
        return self._index[slot]

    def model(self, slot: int) -> str:
        """The GPU's model, as first seen ("" if it came with none: a GPU known only from its events)."""
        return self._model[slot]

    def find(self, key: GpuKey) -> int | None:
        """The slot of a GPU seen before, else None."""
        return self._slot.get(key)

    def slot(self, key: GpuKey, index: int = -1, model: str = "") -> int:
        """The slot of one GPU, added with its index and model if it is new."""
        found = self._slot.get(key)
        if found is None:
            found = self._slot[key] = len(self._slot)
            self._add(key, index, model)
        return found

    def slots(self, keys: Iterable[GpuKey]) -> np.ndarray:
        """The slot of every key, in order; a GPU seen for the first time gets the next one."""
        return self._lookup(list(keys), (), ())

    def rows(self, batch: InterpretedBatch) -> np.ndarray:
        """The slot of every row of a batch (read-only; the same array again for the same batch's key columns)."""
        last = self._last
        if last is not None and last[0] is batch.gpu_uuid and last[1] is batch.node and last[2] is batch.cluster:
            return last[3]
        keys = list(zip(batch.cluster, batch.node, batch.gpu_uuid, strict=True))
        out = self._lookup(keys, batch.gpu_index, batch.gpu_model)
        out.flags.writeable = False
        self._last = (batch.gpu_uuid, batch.node, batch.cluster, out)
        return out

    def attach(self, state: S, per: Per = "gpu") -> S:
        """Allocate the :func:`column` fields of ``state`` (a row per GPU, or per node) and keep them growing with
        the table; returns ``state``. The table holds it weakly: a stage that lets its state go lets it go."""
        self._attached.append((weakref.ref(state), per))
        grow(state, self._rows[per])
        return state

    def _lookup(self, keys: list[GpuKey], index: Sequence[int], model: Sequence[str]) -> np.ndarray:
        table = self._slot
        before = len(table)
        out = np.fromiter((table.setdefault(k, len(table)) for k in keys), dtype=np.int64, count=len(keys))
        if len(table) > before:
            fresh = np.flatnonzero(out >= before)
            _, first = np.unique(out[fresh], return_index=True)  # new slots in order, each with its first row
            for row in fresh[first].tolist():
                self._add(keys[row], index[row] if index else -1, model[row] if model else "")
        return out

    def _add(self, key: GpuKey, index: int, model: str) -> None:
        """Record the GPU that just got the next slot (and its node, if that is new)."""
        slot = len(self._keys)
        self._keys.append(key)
        self._index.append(index)
        self._model.append(model)
        node = self._node_id.setdefault(key[:2], len(self._node_id))
        self._grow("gpu", slot + 1)
        self._grow("node", node + 1)
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
