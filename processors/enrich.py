"""The enrichment stage: what runs on each GPU, in which phase, with relative values filled from the catalogue.

Per row of a batch:
- relative values a missing limit left empty are filled from the GPU catalogue (features.fill_relative), and the
  feature matrix is computed from them, once: it travels on the batch (``features``) to the stages after this one;
- the workload comes from the context topic (a :class:`TopicMirror` of GpuContext, keyed per GPU, injected
  as ``context_of``); a context whose workload is None says nothing runs: application ``idle``. A context
  applies to exactly the rows of its time range, from its own ``ts_ns`` to the next record of its GPU (a
  later context, or a tombstone, dated by when it was published), whatever reaches the processor first: the
  mirror holds only the latest record per GPU, and a processor behind its input (catching up on a backlog, a
  replay, an import of history) would otherwise label the samples of the job that ran then with the job that
  runs now. A :class:`ContextTimeline` keeps every record per GPU that rows still to come may need (fed by the
  mirror for every record it reads, and by ``context_of`` per batch) and each row gets the one current at the
  row's time (the oldest it knows when the row is older than all). The other half of the race, samples read
  before the mirror has read a context published ahead of them, is closed by the processor: before it
  enriches a batch, the mirror catches up with everything the context topic held when the batch was taken
  (:meth:`pipeline.mirror.TopicMirror.catch_up`). A context whose application InfluxDB could not store as a tag
  (pipeline/identity.py's rule) is read with application ``unknown`` (confidence 0), its job and the rest as sent,
  and logged (:func:`context_record`): applied as sent, it cost every sample of its GPU at the sink, one
  ``bad_identity`` dead letter each, for as long as it held; skipped, it left the GPU labelled with the workload it
  replaced. A record that does not decode at all clears its GPU's context from when it was published (the
  mirror's ``invalid_clears``);
- a GPU with no context gets the application the classifier infers from its rolling window of features
  (``source="inferred"`` and the probability as ``confidence``; ``unknown`` below the classifier's
  threshold); before any classifier is published the workload stays None;
- the phase is inferred from the telemetry (features.infer_phase) unless one was already reported.

Emits no findings.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.codec import decode_record
from pipeline.events import PHASES, Finding, GpuContext, InterpretedBatch, Workload, gpu_key
from pipeline.identity import identity_problem
from processors.baselines.store import BaselineSet
from processors.classify import MIN_SAMPLES, UNKNOWN, WindowBuffer, arrival_ranks, window_inputs
from processors.features import features, fill_relative, infer_phase
from processors.state import GpuSlots

_IDLE = Workload("idle", source="context", confidence=1.0)
#: records kept per GPU at most: a bound on memory for a GPU whose rows never come (more job changes than this
#: ahead of its rows, and the rows are labelled with the oldest kept)
TIMELINE_KEEP: Final = 4096

log = logging.getLogger(__name__)


def context_record(payload: bytes) -> GpuContext:
    """A context record off the context topic (raises InvalidEvent when it does not decode). An application the
    sink could not store (as the sink judges it: optional, so an empty one passes) is read as ``unknown``: the GPU's
    job and time range stay as sent, and what runs there is not claimed."""
    context = decode_record(GpuContext, payload)
    workload = context.workload
    if workload is None:
        return context
    problem = identity_problem(workload.application, "application", optional=True)
    if problem is None:
        return context
    log.warning(
        "context of %s/%s/%s: %s; read as %s", context.cluster, context.node, context.gpu_uuid, problem, UNKNOWN
    )
    return dataclasses.replace(context, workload=dataclasses.replace(workload, application=UNKNOWN, confidence=0.0))


@dataclass(frozen=True, slots=True)
class _Entry:
    """From ``ts_ns`` on, ``context`` (None: a tombstone, nobody knows what runs)."""

    ts_ns: int
    context: GpuContext | None


class ContextTimeline:
    """The records seen per GPU key, oldest first, so that a row is labelled with the context of its own time.

    ``see`` is the context mirror's ``on_record`` (its reader thread, with each record's publish time) as well as
    the enrichment stage's. Records are kept while rows still to come may need them: once rows up to time t are
    labelled, the records before the one current at t are dropped (a GPU's rows arrive in time order)."""

    def __init__(self, keep: int = TIMELINE_KEEP) -> None:
        self.keep = keep
        self._seen: dict[bytes, list[_Entry]] = {}
        self._lock = threading.Lock()

    def see(self, key: bytes, context: GpuContext | None, at_ns: int | None = None) -> None:
        """Record a context for ``key``. None is a tombstone: with ``at_ns`` (when it was published) nothing is
        known from then on; without, the GPU's records are forgotten."""
        with self._lock:
            if context is None:
                if at_ns is None:
                    self._seen.pop(key, None)
                    return
                entry = _Entry(at_ns, None)
            else:
                entry = _Entry(context.ts_ns, context)
            seen = self._seen.setdefault(key, [])
            if seen and seen[-1] == entry:
                return
            # a record re-published with the time of one already seen replaces it (the latest word on that time)
            seen[:] = [e for e in seen if e.ts_ns != entry.ts_ns]
            seen.append(entry)
            seen.sort(key=lambda e: e.ts_ns)
            del seen[: -self.keep]

    def at(self, key: bytes, ts_ns: np.ndarray) -> list[GpuContext | None]:
        """The context current at each time for ``key`` (None when none was ever seen, or after a tombstone);
        the records older than the one current at the newest of ``ts_ns`` are dropped."""
        with self._lock:
            seen = self._seen.get(key)
            if not seen:
                return [None] * len(ts_ns)
            if len(seen) == 1 or int(ts_ns.min()) >= seen[-1].ts_ns:
                del seen[:-1]
                return [seen[-1].context] * len(ts_ns)
            starts = np.fromiter((e.ts_ns for e in seen), dtype=np.int64, count=len(seen))
            idx = np.maximum(np.searchsorted(starts, ts_ns, side="right") - 1, 0)
            out = [seen[i].context for i in idx.tolist()]
            del seen[: int(idx.max())]
            return out


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
            context = self._context_of(key)
            if context is not None:  # a deletion reaches the timeline dated, from the mirror
                self.timeline.see(key, context)
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
