"""The enrichment stage: what runs on each GPU, in which phase, with relative values filled from the catalogue.

Per row of a batch:
- relative values a missing limit left empty are filled from the GPU catalogue (features.fill_relative);
- the workload comes from the context topic (a :class:`TopicMirror` of GpuContext, keyed per GPU, injected
  as ``context_of``); a context whose workload is None says nothing runs: application ``idle``;
- a GPU with no context gets the application the classifier infers from its rolling window of features
  (``source="inferred"`` and the probability as ``confidence``; ``unknown`` below the classifier's
  threshold); before any classifier is published the workload stays None;
- the phase is inferred from the telemetry (features.infer_phase) unless one was already reported.

Emits no findings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pipeline.events import PHASES, Finding, GpuContext, InterpretedBatch, Workload, gpu_key
from processors.baselines import BaselineSet
from processors.classify import MIN_SAMPLES, WindowBuffer, window_inputs
from processors.features import features, fill_relative, infer_phase

_IDLE = Workload("idle", source="context", confidence=1.0)


class Enricher:
    """Stage 1 of interpretation (see module docstring)."""

    def __init__(
        self,
        context_of: Callable[[bytes], GpuContext | None],
        baselines: Callable[[], BaselineSet | None],
    ) -> None:
        self._context_of = context_of
        self._baselines = baselines
        self._buffer: WindowBuffer | None = None

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        n = len(batch)
        if not n:
            return batch, []
        relative = fill_relative(batch.metrics, batch.relative, batch.gpu_model)
        f = features(batch.metrics, relative, batch.gpu_model)
        keys = [gpu_key(c, nd, u) for c, nd, u in zip(batch.cluster, batch.node, batch.gpu_uuid, strict=True)]
        contexts = [self._context_of(k) for k in keys]
        workload: list[Workload | None] = [
            None if c is None else (c.workload if c.workload is not None else _IDLE) for c in contexts
        ]
        missing = np.flatnonzero(np.fromiter((c is None for c in contexts), dtype=bool, count=n))
        if len(missing):
            self._infer(missing, keys, f, workload)
        phase = batch.phase
        if None in phase:
            inferred = infer_phase(f)
            phase = tuple(p if p is not None else PHASES[i] for p, i in zip(phase, inferred.tolist(), strict=True))
        return dataclasses.replace(batch, relative=relative, workload=tuple(workload), phase=phase), []

    def _infer(self, rows: np.ndarray, keys: list[bytes], f: np.ndarray, workload: list[Workload | None]) -> None:
        """Classify the GPUs of ``rows`` from their windows (after adding these rows to them)."""
        current = self._baselines()
        classifier = current.classifier if current is not None else None
        if classifier is None:
            return
        window = classifier.record.window
        if self._buffer is None or self._buffer.window != window:
            self._buffer = WindowBuffer(window)
        row_keys = [keys[r] for r in rows.tolist()]
        slots = self._buffer.slots(row_keys)
        self._buffer.update(slots, f[rows])
        distinct, back = np.unique(slots, return_inverse=True)
        windows, counts = self._buffer.windows(distinct)
        names, confidence = classifier.predict(window_inputs(windows))
        inferred = [
            Workload(name, source="inferred", confidence=round(float(p), 3)) if count >= MIN_SAMPLES else None
            for name, p, count in zip(names, confidence.tolist(), counts.tolist(), strict=True)
        ]
        for r, g in zip(rows.tolist(), back.tolist(), strict=True):
            workload[r] = inferred[g]

    def tick(self, now_ns: int) -> list[Finding]:
        return []
