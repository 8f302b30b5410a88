"""One node of H100s driven through the Detectors stage, as the detector tests use it: a healthy busy reading,
the shapes that rewrite it into a fault's signature, and the findings that come out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pynvml

from pipeline.config import DetectorSettings
from pipeline.events import (
    PHASES,
    Finding,
    GpuEvent,
    GpuProcess,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    Workload,
    metric_matrix,
    relative_values,
)
from processors.detectors.stage import Detectors
from processors.features import features, infer_phase
from tests.fakes.readings import H100, busy_h100

S = 1_000_000_000
T0 = 1_700_000_000 * S
MODEL = H100
HW_THERMAL = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
SW_POWER_CAP = pynvml.nvmlClocksThrottleReasonSwPowerCap


Shape = Callable[[int, int, dict[str, float]], dict[str, float] | None]


Job = Callable[[int, int], Workload | None]


def pretraining(_t: int, _gpu: int) -> Workload:
    return Workload("llm-pretraining", job_id="job-7", source="simulator", confidence=1.0, job_gpus=8)


def run(
    seconds: int,
    shape: Shape | None = None,
    job: Job = pretraining,
    gpus: int = 8,
    events: Callable[[int], list[GpuEvent]] | None = None,
    rounds_per_batch: int = 1,
    detectors: Detectors | None = None,
    start: int = 0,
    seed: int = 0,
    processes: Callable[[int, int], tuple[GpuProcess, ...] | None] | None = None,
    interval: int = 1,
    model: str = MODEL,
) -> tuple[Detectors, list[Finding], list[InterpretedBatch]]:
    """Feed ``seconds`` of one node (``gpus`` GPUs of ``model``, a round every ``interval`` s) through the detectors.

    ``shape(t, gpu, metrics)`` rewrites a healthy reading (None: the GPU sends no sample that round);
    ``processes(t, gpu)`` gives the GPU's process list (default: not reported).
    """
    det = detectors or Detectors(DetectorSettings())
    rng = np.random.default_rng(seed)
    found: list[Finding] = []
    out: list[InterpretedBatch] = []
    pending: list[InterpretedEvent] = []
    pending_events: list[GpuEvent] = []
    for t in range(start, start + seconds, interval):
        ts = T0 + t * S
        for gpu in range(gpus):
            metrics = busy_h100(rng)
            if shape is not None:
                shaped = shape(t, gpu, metrics)
                if shaped is None:
                    continue
                metrics = shaped
            procs = processes(t, gpu) if processes is not None else None
            sample = GpuSample("c1", "node-1", f"GPU-{gpu}", gpu, model, ts, metrics, processes=procs)
            pending.append(InterpretedEvent(sample, workload=job(t, gpu)))
        pending_events.extend(events(t) if events else [])
        if ((t - start) // interval + 1) % rounds_per_batch == 0 or t + interval >= start + seconds:
            batch = batch_of(pending, tuple(pending_events))
            batch, findings = det.apply(batch, ts)
            found.extend(findings)
            found.extend(det.tick(ts))
            out.append(batch)
            pending, pending_events = [], []
    return det, found, out


def batch_of(events: list[InterpretedEvent], gpu_events: tuple[GpuEvent, ...]) -> InterpretedBatch:
    """The rows as the enrichment stage hands them to the detectors: relative values and the inferred phase."""
    b = InterpretedBatch.from_events(events, gpu_events)
    b = replace(b, relative=relative_values(metric_matrix([e.sample for e in events])))
    if not len(b):
        return b
    phases = infer_phase(features(b.metrics, b.relative, b.gpu_model))
    return replace(b, phase=tuple(PHASES[p] for p in phases.tolist()))


def starts(found: list[Finding], detector: str | None = None) -> list[Finding]:
    return [f for f in found if f.active and f.ts_ns == f.since_ns and (detector is None or f.detector == detector)]


def kinds(found: list[Finding]) -> set[tuple[str, str | None]]:
    return {(f.detector, f.gpu_uuid) for f in starts(found)}
