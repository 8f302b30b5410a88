"""Fit a whole baselines version from labelled feature rows: pure, shared by ``hermeneut baselines train`` (rows
read from InfluxDB) and the benchmarks (rows from the simulator).

Per (application, GPU model, phase) with at least ``min_samples`` rows a baseline of its own; per
(application, phase) a prior pooled over GPU models; per phase a fleet-wide prior; and the application
classifier on rolling windows of each GPU's rows. ``keep`` adds rows operators said are not anomalous to the
baseline that judged them (its thresholds are widened to cover them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from pipeline.baselines import BaselineRecord, ClassifierRecord
from pipeline.events import PHASES
from processors.baselines.score import FLEET, FitParams, baseline_id, fit_baseline
from processors.classify import fit_classifier, history_windows, window_inputs
from processors.features import FEATURES


@dataclass(frozen=True, slots=True, eq=False)
class LabelledRows:
    """FEATURES rows of one (application, GPU model) whose application is known: phase index, a GPU code and
    the time of every row (the classifier cuts windows per GPU in time order)."""

    application: str
    gpu_model: str
    f: np.ndarray
    phase: np.ndarray
    gpu: np.ndarray
    ts_ns: np.ndarray


@dataclass
class Fitted:
    records: list[BaselineRecord] = field(default_factory=list)
    classifier: ClassifierRecord | None = None
    #: baseline id -> rows, for the ids that had too few
    skipped: dict[str, int] = field(default_factory=dict)


def fit_version(
    parts: Iterable[LabelledRows],
    version: int,
    trained_ns: int,
    min_samples: int,
    window: int,
    min_confidence: float,
    keep: dict[str, list[np.ndarray]] | None = None,
    params: FitParams | None = None,
) -> Fitted:
    """Every baseline and the classifier of one version (see module docstring)."""
    rows: dict[str, list[np.ndarray]] = {}
    meta: dict[str, tuple[str, str | None, str]] = {}
    inputs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for part in parts:
        for p in np.unique(part.phase).tolist():
            f = part.f[part.phase == p]
            for app, model in ((part.application, part.gpu_model), (part.application, None), (FLEET, None)):
                bid = baseline_id(app, model, PHASES[p])
                rows.setdefault(bid, []).append(f)
                meta[bid] = (app, model, PHASES[p])
        windows, _ = history_windows(part.f, part.gpu, part.ts_ns, window, max(1, window // 3))
        if len(windows):
            inputs.append(window_inputs(windows))
            labels.append(np.full(len(windows), part.application, dtype=object))
    out = Fitted()
    empty = np.empty((0, len(FEATURES)))
    for bid, chunks in sorted(rows.items()):
        x = np.vstack(chunks)
        if len(x) < min_samples:
            out.skipped[bid] = len(x)
            continue
        app, model, phase = meta[bid]
        kept = np.vstack((keep or {}).get(bid, [empty]))
        record = fit_baseline(
            x, app, model, phase, version, trained_ns, params, keep=kept if len(kept) else None, baseline=bid
        )
        if record is None:
            out.skipped[bid] = len(x)
        else:
            out.records.append(record)
    if labels:
        out.classifier = fit_classifier(
            np.vstack(inputs), np.concatenate(labels).astype(str), version, window, min_confidence
        )
    return out
