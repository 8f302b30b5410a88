"""The enrichment stage: what runs on each GPU, in which phase, with relative values filled from the catalogue.

Per row of a batch:
- relative values a missing limit left empty are filled from the GPU catalogue (features.fill_relative), and the
  feature matrix is computed from them, once: it travels on the batch (``features``) to the stages after this one;
- the workload comes from the context topic (a :class:`TopicMirror` of GpuContext, keyed per GPU, injected
  as ``context_of``); a context whose workload is None says nothing runs: application ``idle``. A context
  applies from its own ``ts_ns`` on: the mirror holds only the latest record per GPU, and a processor behind
  its input (catching up on a backlog after a restart, a replay, a fast-forwarded simulation) would otherwise
  label the samples of the job that ran then with the job that runs now. A :class:`ContextTimeline` keeps the
  last few contexts per GPU (fed by the mirror for every record it reads, and by ``context_of`` per batch)
  and each row gets the one current at the row's time (the oldest it knows when the row is older than all);
- a GPU with no context gets the application the classifier infers from its rolling window of features
  (``source="inferred"`` and the probability as ``confidence``; ``unknown`` below the classifier's
  threshold); before any classifier is published the workload stays None;
- the phase is inferred from the telemetry (features.infer_phase) unless one was already reported.

Emits no findings.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Final

import numpy as np

from pipeline.events import PHASES, Finding, GpuContext, InterpretedBatch, Workload, gpu_key
from processors.baselines.store import BaselineSet
from processors.classify import MIN_SAMPLES, WindowBuffer, arrival_ranks, window_inputs
from processors.features import features, fill_relative, infer_phase
from processors.state import GpuSlots

_IDLE = Workload("idle", source="context", confidence=1.0)
#: contexts kept per GPU: a processor more job changes than this behind its input labels with the oldest kept
TIMELINE_KEEP: Final = 32


class ContextTimeline:
    """The contexts seen per GPU key, oldest first, so that a row is labelled with the context of its own time.

    ``see`` is the context mirror's ``on_change`` (its reader thread) as well as the enrichment stage's."""

    def __init__(self, keep: int = TIMELINE_KEEP) -> None:
        self.keep = keep
        self._seen: dict[bytes, list[GpuContext]] = {}
        self._lock = threading.Lock()

    def see(self, key: bytes, context: GpuContext | None) -> None:
        """Record a context for ``key``; None (a deleted record, no context any more) forgets the GPU's."""
        with self._lock:
            if context is None:
                self._seen.pop(key, None)
                return
            seen = self._seen.setdefault(key, [])
            if seen and seen[-1] == context:
                return
            # a record re-published with the time of one already seen replaces it (the latest word on that time)
            seen[:] = [c for c in seen if c.ts_ns != context.ts_ns]
            seen.append(context)
            seen.sort(key=lambda c: c.ts_ns)
            del seen[: -self.keep]

    def at(self, key: bytes, ts_ns: np.ndarray) -> list[GpuContext | None]:
        """The context current at each time for ``key`` (None when none was ever seen)."""
        with self._lock:
            seen = list(self._seen.get(key, ()))
        if not seen:
            return [None] * len(ts_ns)
        if len(seen) == 1 or int(ts_ns.min()) >= seen[-1].ts_ns:
            return [seen[-1]] * len(ts_ns)
        starts = np.array([c.ts_ns for c in seen], dtype=np.int64)
        idx = np.maximum(np.searchsorted(starts, ts_ns, side="right") - 1, 0)
        return [seen[i] for i in idx.tolist()]


class Enricher:
    """Stage 1 of interpretation (see module docstring)."""

    def __init__(
        self,
        context_of: Callable[[bytes], GpuContext | None],
        baselines: Callable[[], BaselineSet | None],
        timeline: ContextTimeline | None = None,
        slots: GpuSlots | None = None,
    ) -> None:
        self._context_of = context_of
        self._baselines = baselines
        self._buffer: WindowBuffer | None = None
        self.timeline = timeline if timeline is not None else ContextTimeline()
        self.slots = slots if slots is not None else GpuSlots()

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        n = len(batch)
        if not n:
            return batch, []
        relative = fill_relative(batch.metrics, batch.relative, batch.gpu_model)
        f = features(batch.metrics, relative, batch.gpu_model)
        keys = [gpu_key(c, nd, u) for c, nd, u in zip(batch.cluster, batch.node, batch.gpu_uuid, strict=True)]
        contexts = self._contexts(keys, batch.ts_ns)
        workload: list[Workload | None] = [
            None if c is None else (c.workload if c.workload is not None else _IDLE) for c in contexts
        ]
        missing = np.flatnonzero(np.fromiter((c is None for c in contexts), dtype=bool, count=n))
        if len(missing):
            self._infer(missing, batch, f, workload)
        phase = batch.phase
        if None in phase:
            inferred = infer_phase(f)
            phase = tuple(p if p is not None else PHASES[i] for p, i in zip(phase, inferred.tolist(), strict=True))
        enriched = dataclasses.replace(batch, relative=relative, features=f, workload=tuple(workload), phase=phase)
        return enriched, []

    def _contexts(self, keys: list[bytes], ts_ns: np.ndarray) -> list[GpuContext | None]:
        """Per row, the context current at the row's time (see module docstring)."""
        rows: dict[bytes, list[int]] = {}
        for i, key in enumerate(keys):
            rows.setdefault(key, []).append(i)
        out: list[GpuContext | None] = [None] * len(keys)
        for key, mine in rows.items():
            self.timeline.see(key, self._context_of(key))
            for i, context in zip(mine, self.timeline.at(key, ts_ns[mine]), strict=True):
                out[i] = context
        return out

    def _infer(self, rows: np.ndarray, b: InterpretedBatch, f: np.ndarray, workload: list[Workload | None]) -> None:
        """Classify each of ``rows`` from its GPU's window as of that row: a batch holding many rounds of a GPU
        (a processor catching up, a replay) is taken round by round, so rows before a job change are not labelled
        with the job after it."""
        current = self._baselines()
        classifier = current.classifier if current is not None else None
        if classifier is None:
            return
        window = classifier.record.window
        if self._buffer is None or self._buffer.window != window:
            self._buffer = WindowBuffer(window, slots=self.slots)
        slots = self.slots.rows(b)[rows]
        rank = arrival_ranks(slots)  # rows are in arrival order
        for k in range(int(rank.max()) + 1):
            level = np.flatnonzero(rank == k)
            self._buffer.update(slots[level], f[rows[level]])
            windows, counts = self._buffer.windows(slots[level])
            names, confidence = classifier.predict(window_inputs(windows))
            for i, name, p, count in zip(level.tolist(), names, confidence.tolist(), counts.tolist(), strict=True):
                workload[int(rows[i])] = (
                    Workload(name, source="inferred", confidence=round(float(p), 3)) if count >= MIN_SAMPLES else None
                )

    def tick(self, now_ns: int) -> list[Finding]:
        return []
