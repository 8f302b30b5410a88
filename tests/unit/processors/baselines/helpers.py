"""What the baseline tests share: baselines fitted on the labelled fleet history, and batches labelled with an
application."""

from __future__ import annotations

import dataclasses

from pipeline.baselines import BaselineManifest, BaselineRecord
from pipeline.events import InterpretedBatch, Workload
from processors.baselines.fit import fit_baseline
from processors.baselines.store import BaselineSet
from processors.features import infer_phase
from tests.unit.processors.history import Labelled

H100 = "NVIDIA H100 80GB HBM3"


def fit_on(h: Labelled, app: str, model: str | None, version: int = 1) -> BaselineRecord:
    rows = (h.application == app) & ((h.model == model) if model else True) & (infer_phase(h.f) == 0)
    record = fit_baseline(h.f[rows], app, model, "compute", version, 0)
    assert record is not None
    return record


def set_of(*records: BaselineRecord, version: int = 1) -> BaselineSet:
    return BaselineSet(BaselineManifest(version, 0, 0, 0, tuple(r.baseline_id for r in records)), list(records))


def concat(batches: list[InterpretedBatch]) -> InterpretedBatch:
    return InterpretedBatch.from_events([e for b in batches for e in b.events()])


def with_app(batch: InterpretedBatch, app: str | None) -> InterpretedBatch:
    workload = None if app is None else Workload(app, source="static", confidence=1.0)
    return dataclasses.replace(batch, workload=(workload,) * len(batch))


def first_row(h: Labelled, app: str, model: str) -> tuple[InterpretedBatch, int]:
    """The first row of the history where ``app`` runs on a ``model``: its batch, and its index there."""
    return next(
        (b, i)
        for b, apps in zip(h.batches, h.batch_apps, strict=True)
        for i, a in enumerate(apps)
        if b.gpu_model[i] == model and a == app
    )
