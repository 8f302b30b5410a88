"""Fitting baselines: one baseline from its training rows, and a whole version from labelled history (pure, shared
by ``hermeneut baselines train``, which reads the rows from InfluxDB, and the benchmarks, from the simulator).

One baseline: a Gaussian fitted robustly per mode (start at the median, then repeatedly refit on the rows within the
97.5% chi-square contour of the current fit, so the outliers the baseline exists to find do not widen it; a floor
per feature keeps a feature that never moved from making every wobble an anomaly). A phase can hold several ways of
working (evaluation passes inside "compute", an inference server between bursts): rows the bulk does not explain,
when they are at least 2% of the training rows, get a robust Gaussian of their own (up to three modes). The
thresholds are calibrated on the training rows (unusual above the 99th percentile of their scores, anomalous above
1.5 x the 99.9th), so "unusual" means the same for every baseline.

A version (:func:`fit_version`): per (application, GPU model, phase) with at least ``min_samples`` rows a baseline
of its own; per (application, phase) a prior pooled over GPU models; per phase a fleet-wide prior; and the
application classifier on rolling windows of each GPU's rows. ``keep`` adds rows operators said are not anomalous to
the baseline that judged them (its thresholds are widened to cover them).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.stats import chi2

from pipeline.baselines import BaselineRecord, ClassifierRecord
from pipeline.events import PHASES
from processors.baselines.model import FLEET, QUANTILES, Baseline, baseline_id, surprise
from processors.classify import fit_classifier, history_windows, window_inputs
from processors.features import FEATURE_FLOOR, FEATURES

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class FitParams:
    """How baselines are fitted; the defaults are what docs/baselines.md measured."""

    #: rows farther than this chi-square quantile from the current fit do not shape the next one
    cutoff: float = 0.975
    iterations: int = 5
    unusual_quantile: float = 0.99
    anomalous_quantile: float = 0.999
    margin: float = 1.5
    #: a feature enters a baseline when at least this share of its training rows has it
    min_presence: float = 0.9
    #: rows used for the covariance fit (a seeded subsample above it); quantiles and thresholds use all rows
    max_fit_rows: int = 20_000
    #: lowest thresholds, whatever the training scores say: a 1% / 0.01% tail under the fitted Gaussian
    min_unusual: float = 2.0
    min_anomalous: float = 4.0
    #: a phase can have sub-modes (evaluation inside "compute", bursts between requests): rows the modes so far
    #: do not explain (score above ``mode_split``) get a mode of their own when they are at least
    #: ``min_mode_share`` of the rows, up to ``max_modes``
    max_modes: int = 3
    mode_split: float = 3.0
    min_mode_share: float = 0.02


def trimmed_gaussian(x: np.ndarray, floor: np.ndarray, cutoff: float, iterations: int) -> tuple[np.ndarray, np.ndarray]:
    """Center and covariance of ``x`` (rows complete), fitted on the rows that look like the bulk of the data.

    Starts from the per-feature median and MAD (robust up to half the rows being outliers), then alternates
    "keep the rows whose distance is inside the ``cutoff`` quantile of a chi-square" and "refit on them", at
    least half the rows kept (MCD's reweighting step). The covariance of the kept rows is corrected for the
    truncation, so it estimates the spread of the bulk, not of its trimmed core. ``floor`` (per feature,
    feature units) is added to the variances so a constant feature keeps a usable, invertible spread.
    """
    n, k = x.shape
    ridge = np.diag(floor**2)
    center = np.median(x, axis=0)
    mad = np.median(np.abs(x - center), axis=0) * 1.4826
    cov = np.diag(np.maximum(mad, floor) ** 2)
    limit = float(chi2.ppf(cutoff, k))
    # E[d2 | d2 <= limit] / k for a Gaussian: how much truncation shrinks the covariance
    shrink = float(chi2.cdf(limit, k + 2)) / cutoff
    for _ in range(iterations):
        d = x - center
        d2 = np.einsum("ij,jk,ik->i", d, np.linalg.inv(cov), d)
        keep = d2 <= limit
        if keep.sum() < max(k + 1, n // 2):
            keep = np.zeros(n, dtype=bool)
            keep[np.argpartition(d2, n // 2)[: n // 2 + 1]] = True
        center = x[keep].mean(axis=0)
        cov = np.cov(x[keep], rowvar=False).reshape(k, k) / shrink + ridge
    return center, cov


def fit_baseline(
    x: np.ndarray,
    application: str,
    gpu_model: str | None,
    phase: str,
    version: int,
    trained_ns: int,
    params: FitParams | None = None,
    keep: np.ndarray | None = None,
    baseline: str | None = None,
) -> BaselineRecord | None:
    """Fit one baseline on FEATURES rows ``x``; None when no feature is present often enough.

    ``keep`` holds FEATURES rows an operator said are not anomalous: they join the training rows and the
    thresholds are widened until every one of them scores below "unusual".
    """
    params = params or FitParams()
    present = ~np.isnan(x)
    share = present.mean(axis=0) if len(x) else np.zeros(len(FEATURES))
    cols = np.flatnonzero(share >= params.min_presence)
    if not len(cols):
        return None
    keep = np.empty((0, len(FEATURES))) if keep is None else keep
    train = np.vstack([x, keep])[:, cols]
    train = train[~np.isnan(train).any(axis=1)]
    if len(train) <= len(cols):
        return None
    fit_rows = train
    if len(train) > params.max_fit_rows:
        fit_rows = train[np.random.default_rng(0).choice(len(train), params.max_fit_rows, replace=False)]
    centers, covs = fit_modes(fit_rows, FEATURE_FLOOR[cols], params)
    record = BaselineRecord(
        baseline_id=baseline or baseline_id(application, gpu_model, phase),
        version=version,
        application=application,
        gpu_model=gpu_model,
        phase=phase,
        features=tuple(FEATURES[c].name for c in cols),
        center=tuple(np.concatenate(centers).tolist()),
        covariance=tuple(np.concatenate([c.ravel() for c in covs]).tolist()),
        quantiles=tuple(np.quantile(train, QUANTILES, axis=0).ravel().tolist()),
        unusual=math.inf,
        anomalous=math.inf,
        n=len(train),
        trained_ns=trained_ns,
        modes=len(centers),
    )
    if len(centers) > 1:
        # drivers compare a row with the mode it is closest to: quantiles per mode (the bulk's where a mode
        # holds too few rows to have its own)
        nearest = Baseline(record).nearest(train_full := np.vstack([x, keep]))
        overall = np.quantile(train, QUANTILES, axis=0)
        per_mode = []
        for m in range(len(centers)):
            mine = train_full[nearest == m][:, cols]
            mine = mine[~np.isnan(mine).any(axis=1)]
            per_mode.append(np.quantile(mine, QUANTILES, axis=0) if len(mine) >= 20 else overall)
        record = dataclasses.replace(record, mode_quantiles=tuple(np.concatenate(per_mode).ravel().tolist()))
    compiled = Baseline(record)
    scores = compiled.score(np.vstack([x, keep]))
    scores = scores[~np.isnan(scores)]
    unusual = max(float(np.quantile(scores, params.unusual_quantile)), params.min_unusual)
    anomalous = max(float(np.quantile(scores, params.anomalous_quantile)) * params.margin, params.min_anomalous)
    covered = 0
    if len(keep):
        kept_scores = compiled.score(keep)
        kept_scores = kept_scores[~np.isnan(kept_scores)]
        worst = float(kept_scores.max()) if len(kept_scores) else 0.0
        if worst >= unusual:
            # the operator said these are fine: "unusual" must start above them
            unusual = worst * 1.05 + 0.1
            covered = len(kept_scores)
            log.warning("%s: thresholds widened to cover %d not-anomalous feedback events", record.baseline_id, covered)
    anomalous = max(anomalous, unusual * params.margin)
    return dataclasses.replace(record, unusual=unusual, anomalous=anomalous, feedback_covered=covered)


def fit_modes(x: np.ndarray, floor: np.ndarray, params: FitParams) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Robust Gaussians for the modes of ``x``: the bulk first, then (repeatedly) the rows it does not explain,
    when they are common enough to be a way of working rather than outliers (see FitParams)."""
    k = x.shape[1]
    centers: list[np.ndarray] = []
    covs: list[np.ndarray] = []
    rest = x
    while len(centers) < params.max_modes and len(rest) > 5 * k:
        center, cov = trimmed_gaussian(rest, floor, params.cutoff, params.iterations)
        centers.append(center)
        covs.append(cov)
        d = rest - center
        unexplained = surprise(np.einsum("ij,jk,ik->i", d, np.linalg.inv(cov), d), k) > params.mode_split
        if unexplained.sum() < params.min_mode_share * len(x):
            break
        rest = rest[unexplained]
    return centers, covs


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
    #: the cluster tags the rows came from
    clusters: frozenset[str] = frozenset()


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
    gpus: dict[str, set[tuple[int, int]]] = {}
    clusters: dict[str, set[str]] = {}
    inputs: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for i, part in enumerate(parts):
        for p in np.unique(part.phase).tolist():
            here = part.phase == p
            f = part.f[here]
            seen = {(i, int(g)) for g in np.unique(part.gpu[here]).tolist()}
            for app, model in ((part.application, part.gpu_model), (part.application, None), (FLEET, None)):
                bid = baseline_id(app, model, PHASES[p])
                rows.setdefault(bid, []).append(f)
                meta[bid] = (app, model, PHASES[p])
                gpus.setdefault(bid, set()).update(seen)
                clusters.setdefault(bid, set()).update(part.clusters)
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
            out.records.append(replace(record, gpus=len(gpus[bid]), clusters=tuple(sorted(clusters[bid]))))
    if labels:
        out.classifier = fit_classifier(
            np.vstack(inputs), np.concatenate(labels).astype(str), version, window, min_confidence
        )
    return out
