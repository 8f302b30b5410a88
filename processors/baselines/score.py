"""Learned baselines: fitting (pure, used by the training job), scoring with explanations (the :class:`Scorer`
stage), hot reload of published versions (:class:`BaselineStore`) and ``baseline-anomaly`` findings.

A baseline describes what is normal for one (application, GPU model, phase) over the relative FEATURES: a
Gaussian fitted robustly (start at the median, then repeatedly refit on the rows within the 97.5% chi-square
contour of the current fit, so the outliers the baseline exists to find do not widen it; a floor per feature
keeps a feature that never moved from making every wobble an anomaly) plus per-feature quantiles
p1/p5/p50/p95/p99 for the explanation. Priors pool the same over GPU models per (application, phase)
(``prior:<app>/<phase>``) and over everything per phase (``prior:fleet/<phase>``), so a new job on a new
model is judged from its first sample.

A phase can hold several ways of working (evaluation passes inside "compute", an inference server between
bursts): rows the bulk does not explain, when they are at least 2% of the training rows, get a robust Gaussian
of their own (up to three modes); a row is judged against the mode closest to it.

Score: how improbable a row is under the baseline, ``-log10`` of the chi-square tail probability of its
Mahalanobis distance (to the nearest mode) over the features the row has (missing ones are marginalized out,
never imputed). The
thresholds are calibrated on the training rows of each baseline (unusual above the 99th percentile of their
scores, anomalous above 1.5 x the 99.9th), so "unusual" means the same for every baseline. Rows are grouped
by baseline and by missing-feature pattern, and each group is one matrix product with a cached precision.

Emits per row: score, verdict, baseline id, drivers (features outside [p5, p95], largest standardized
deviation first) and, for rows that are not normal, a one-line explanation naming the application, GPU model
and phase. Findings ``baseline-anomaly``: active once a GPU has been anomalous for 30 s, repeated every 60 s,
cleared once it has not been anomalous for 60 s; only for workloads a context source named (against an
inferred application's baseline, rows keep their verdict but raise no finding: in the evaluation most such
findings on healthy GPUs came from a wrong guess of the application, not from the GPU).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Final

import numpy as np
from scipy.special import gammaincc, gammaln
from scipy.stats import chi2

from pipeline.baselines import (
    CLASSIFIER_KEY,
    MANIFEST_KEY,
    BaselineManifest,
    BaselineRecord,
    ClassifierRecord,
)
from pipeline.codec import decode_record
from pipeline.errors import DecodeError
from pipeline.events import (
    METRIC_INDEX,
    PHASES,
    Driver,
    Finding,
    InterpretedBatch,
    Severity,
    Verdict,
    Workload,
)
from pipeline.vocab import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from processors.classify import Classifier
from processors.features import FEATURE_FLOOR, FEATURE_INDEX, FEATURES, features, infer_phase

log = logging.getLogger(__name__)

QUANTILES: Final = (0.01, 0.05, 0.50, 0.95, 0.99)
_P5, _P50, _P95 = 1, 2, 3
_LN10: Final = math.log(10.0)
#: the spread of a normal distribution between its 5th and 95th percentiles, in standard deviations
_P5_P95_SIGMAS: Final = 3.29
MAX_DRIVERS: Final = 3
FLEET: Final = "fleet"

_VERDICTS: Final = (Verdict.UNSCORED, Verdict.NORMAL, Verdict.UNUSUAL, Verdict.ANOMALOUS)
_UNSCORED, _NORMAL, _UNUSUAL, _ANOMALOUS = range(4)
_NONE: Final = np.int64(-1)  # "no such time" in the tracker's timestamp arrays
_NEVER: Final = np.iinfo(np.int64).max

APPLICATION_LABELS: Final[dict[str, str]] = {
    "llm-pretraining": "LLM pre-training",
    "llm-finetuning": "LLM fine-tuning",
    "llm-serving": "LLM serving",
    "bert-training": "BERT training",
    "resnet-training": "ResNet training",
    "stable-diffusion-inference": "Stable Diffusion inference",
    "rendering": "rendering",
    "hashing": "hashing",
    "idle": "an idle GPU",
}

# NVML clocks-event reasons that hold clocks down, and what an operator should do about them
_THROTTLE_HINTS: Final = (
    (HW_THERMAL | SW_THERMAL, "clocks held by thermal slowdown: check cooling"),
    (HW_SLOWDOWN, "clocks held by HW slowdown: check cooling and power delivery"),
    (HW_POWER_BRAKE, "clocks held by the power brake: check the PSU/board"),
    (SW_POWER_CAP, "clocks held by the power cap"),
)


# --- ids -----------------------------------------------------------------------------------------------------


def baseline_id(application: str, gpu_model: str | None, phase: str) -> str:
    """``app/model/phase`` for a model's baseline, ``prior:app/phase`` pooled over models."""
    return f"{application}/{gpu_model}/{phase}" if gpu_model is not None else f"prior:{application}/{phase}"


# --- fitting (training job) ----------------------------------------------------------------------------------


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


def surprise(d2: np.ndarray, k: int) -> np.ndarray:
    """``-log10`` of the chi-square(k) tail probability of squared distances: the calibrated score.

    Far in the tail the probability underflows; there the leading term of the upper incomplete gamma function's
    asymptotic series gives its logarithm directly, so a score is always finite (InfluxDB stores no infinity).
    """
    with np.errstate(divide="ignore"):
        # the ufunc itself: scipy.stats' chi2.logsf costs ~0.3 ms of argument checking per call
        log_sf = np.log(gammaincc(k / 2.0, d2 / 2.0))
    far = ~np.isfinite(log_sf)
    if far.any():
        s, x = k / 2.0, np.maximum(d2[far], 1e-9) / 2.0
        log_sf[far] = (s - 1) * np.log(x) - x - gammaln(s) + np.log1p((s - 1) / x)
    return np.asarray(-log_sf / _LN10)


# --- a compiled baseline -------------------------------------------------------------------------------------


class Baseline:
    """A BaselineRecord as arrays, with the precision matrices of every missing-feature pattern cached."""

    def __init__(self, record: BaselineRecord) -> None:
        k = len(record.features)
        known = [i for i, f in enumerate(record.features) if f in FEATURE_INDEX]
        self.record = record
        # a feature this processor does not know (a newer trainer) is marginalized out
        self.idx = np.array([FEATURE_INDEX[record.features[i]] for i in known], dtype=np.int64)
        m = record.modes
        self.centers = np.array(record.center).reshape(m, k)[:, known]
        self.covs = np.array(record.covariance).reshape(m, k, k)[np.ix_(range(m), known, known)]
        q = record.mode_quantiles or record.quantiles * m
        # per mode: p1, p5, p50, p95, p99 of each feature
        self.q = np.array(q).reshape(m, len(QUANTILES), k)[:, :, known]
        self.floor = FEATURE_FLOOR[self.idx]
        self.spread = np.maximum((self.q[:, _P95] - self.q[:, _P5]) / _P5_P95_SIGMAS, self.floor)
        self._bits = 1 << np.arange(len(known), dtype=np.int64)
        self._precision: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def id(self) -> str:
        return self.record.baseline_id

    def precision(self, pattern: int) -> tuple[np.ndarray, np.ndarray]:
        """(columns present, per mode the precision of their marginal covariance) for a presence bit pattern."""
        cached = self._precision.get(pattern)
        if cached is None:
            cols = np.flatnonzero(pattern & self._bits)
            cached = (cols, np.linalg.inv(self.covs[:, cols[:, None], cols]))
            self._precision[pattern] = cached
        return cached

    def _nearest(self, f: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: squared distance to the nearest mode, that mode, and how many features it was over."""
        xb = f[:, self.idx]
        present = ~np.isnan(xb)
        pattern = present.astype(np.int64) @ self._bits
        d2 = np.full(len(f), np.nan)
        mode = np.zeros(len(f), dtype=np.int64)
        k = np.zeros(len(f), dtype=np.int64)
        # one missing-feature pattern for every row is the common case: skip the grouping
        patterns = [int(pattern[0])] if (pattern == pattern[0]).all() else np.unique(pattern).tolist()
        for p in patterns:
            if p == 0:
                continue
            rows = np.flatnonzero(pattern == p) if len(patterns) > 1 else np.arange(len(f))
            cols, precisions = self.precision(p)
            sub = xb[np.ix_(rows, cols)]
            per_mode = np.stack(
                [
                    np.einsum("ij,jk,ik->i", d, precision, d)
                    for d, precision in (
                        (sub - center, precision)
                        for center, precision in zip(self.centers[:, cols], precisions, strict=True)
                    )
                ]
            )
            # the mode a row is closest to explains it: its distance to that mode is the row's distance
            mode[rows] = per_mode.argmin(axis=0)
            d2[rows] = per_mode.min(axis=0)
            k[rows] = len(cols)
        return d2, mode, k

    def nearest(self, f: np.ndarray) -> np.ndarray:
        """The mode each FEATURES row is closest to."""
        return self._nearest(f)[1]

    def score(self, f: np.ndarray) -> np.ndarray:
        """Calibrated score per FEATURES row (NaN when the row has none of this baseline's features)."""
        d2, _, k = self._nearest(f)
        if len(k) and (k == k[0]).all() and k[0] > 0:
            return surprise(d2, int(k[0]))
        out = np.full(len(f), np.nan)
        for dims in np.unique(k[k > 0]).tolist():
            rows = k == dims
            out[rows] = surprise(d2[rows], dims)
        return out

    def drivers(self, f: np.ndarray) -> list[tuple[Driver, ...]]:
        """Per row: the features outside [p5, p95] of the mode the row is closest to, largest standardized
        deviation first (at most three)."""
        xb = f[:, self.idx]
        mode = self.nearest(f)
        q, spread = self.q[mode], self.spread[mode]
        with np.errstate(invalid="ignore"):
            outside = (xb < q[:, _P5]) | (xb > q[:, _P95])
        z = np.where(outside, np.abs(xb - q[:, _P50]) / spread, -1.0)
        order = np.argsort(-z, axis=1)[:, :MAX_DRIVERS]
        out = []
        for row, cols in enumerate(order.tolist()):
            out.append(
                tuple(
                    Driver(
                        FEATURES[self.idx[c]].name,
                        float(xb[row, c]),
                        float(q[row, _P50, c]),
                        float(q[row, _P5, c]),
                        float(q[row, _P95, c]),
                    )
                    for c in cols
                    if z[row, c] >= 0
                )
            )
        return out


# --- a published version -------------------------------------------------------------------------------------


class BaselineSet:
    """Every baseline of one published version, and the classifier, resolved per (application, model, phase)."""

    def __init__(
        self,
        manifest: BaselineManifest,
        records: list[BaselineRecord],
        classifier: ClassifierRecord | None = None,
    ) -> None:
        self.manifest = manifest
        self.version = manifest.version
        self.baselines = {r.baseline_id: Baseline(r) for r in records}
        self.classifier = Classifier(classifier) if classifier is not None else None
        self._resolved: dict[tuple[str, str, str], Baseline | None] = {}

    def resolve(self, application: str, gpu_model: str, phase: str) -> Baseline | None:
        """The most specific baseline there is: the model's own, else the application's prior, else the fleet's."""
        key = (application, gpu_model, phase)
        if key not in self._resolved:
            found = None
            for candidate in (
                baseline_id(application, gpu_model, phase),
                baseline_id(application, None, phase),
                baseline_id(FLEET, None, phase),
            ):
                found = self.baselines.get(candidate)
                if found is not None:
                    break
            self._resolved[key] = found
        return self._resolved[key]


def decode_baselines_record(payload: bytes) -> BaselineRecord | ClassifierRecord | BaselineManifest:
    """Any record of the baselines topic, checked so that using it cannot fail; DecodeError when it is none of
    them or does not hold together (the mirror then skips and counts it)."""
    try:
        record = decode_record(BaselineRecord, payload)
    except DecodeError as exc:
        if not exc.detail.startswith("expected a"):
            raise
    else:
        _check_baseline(record)
        return record
    try:
        classifier = decode_record(ClassifierRecord, payload)
    except DecodeError as exc:
        if not exc.detail.startswith("expected a"):
            raise
    else:
        _check_classifier(classifier)
        return classifier
    return decode_record(BaselineManifest, payload)


def _check_baseline(r: BaselineRecord) -> None:
    k, m = len(r.features), r.modes
    sizes = (len(r.center), len(r.covariance), len(r.quantiles), len(r.mode_quantiles) or m * len(QUANTILES) * k)
    if k == 0 or m < 1 or sizes != (m * k, m * k * k, len(QUANTILES) * k, m * len(QUANTILES) * k):
        raise DecodeError("inconsistent", f"{r.baseline_id}: {k} features but arrays of sizes {sizes}")
    values = np.array([*r.center, *r.covariance, *r.quantiles, *r.mode_quantiles, r.unusual, r.anomalous])
    if not np.isfinite(values).all():
        raise DecodeError("nan", f"{r.baseline_id}: non-finite values")
    try:
        np.linalg.cholesky(np.array(r.covariance).reshape(m, k, k))
    except np.linalg.LinAlgError as exc:
        raise DecodeError("inconsistent", f"{r.baseline_id}: covariance is not positive definite") from exc


def _check_classifier(r: ClassifierRecord) -> None:
    c, n = len(r.classes), len(r.inputs)
    sizes = (len(r.mean), len(r.scale), len(r.coef), len(r.intercept))
    if c < 2 or sizes != (n, n, c * n, c):
        raise DecodeError("inconsistent", f"classifier: {c} classes x {n} inputs but arrays of sizes {sizes}")
    values = np.array([*r.mean, *r.scale, *r.coef, *r.intercept])
    if not np.isfinite(values).all() or min(r.scale) <= 0 or r.window < 1:
        raise DecodeError("inconsistent", "classifier: non-finite values, a non-positive scale or window")


class BaselineStore:
    """The latest complete version on the baselines topic, fed by a TopicMirror's ``on_change``.

    A version becomes current only once its manifest and every record it names (at that version) are here;
    readers take :meth:`current` between batches, so a swap never happens inside one.
    """

    def __init__(self) -> None:
        self._records: dict[bytes, BaselineRecord | ClassifierRecord | BaselineManifest] = {}
        self._current: BaselineSet | None = None

    def on_change(self, key: bytes, value: BaselineRecord | ClassifierRecord | BaselineManifest | None) -> None:
        if value is None:
            self._records.pop(key, None)
        else:
            self._records[key] = value
        self._maybe_switch()

    def _maybe_switch(self) -> None:
        manifest = self._records.get(MANIFEST_KEY)
        if not isinstance(manifest, BaselineManifest):
            return
        if self._current is not None and manifest.version <= self._current.version:
            return
        records = [self._records.get(i.encode()) for i in manifest.ids]
        if not all(isinstance(r, BaselineRecord) and r.version == manifest.version for r in records):
            return
        classifier = self._records.get(CLASSIFIER_KEY)
        if manifest.classifier and not (
            isinstance(classifier, ClassifierRecord) and classifier.version == manifest.version
        ):
            return
        self._current = BaselineSet(
            manifest,
            [r for r in records if isinstance(r, BaselineRecord)],
            classifier if manifest.classifier and isinstance(classifier, ClassifierRecord) else None,
        )
        log.info("baselines version %d ready: %d baselines", manifest.version, len(manifest.ids))

    def current(self) -> BaselineSet | None:
        return self._current


# --- explanation ---------------------------------------------------------------------------------------------


def _pct(feature: str, value: float) -> str:
    spec = FEATURES[FEATURE_INDEX[feature]]
    percent = value if spec.unit == "percent" else value * 100
    return f"{percent:.1f}%" if 0 < abs(percent) < 1 else f"{percent:.0f}%"


def _phrase(feature: str, value: float, memory_total_bytes: float) -> str:
    spec = FEATURES[FEATURE_INDEX[feature]]
    shown = _pct(feature, value)
    if feature == "power_ratio_of_limit":
        return f"power {shown} of limit"
    if feature == "memory_used_ratio":
        of = f"{memory_total_bytes / 2**30:.0f} GB" if memory_total_bytes == memory_total_bytes else "total"  # noqa: PLR0124
        return f"memory {shown} of {of}"
    if feature == "sm_clock_ratio_of_max":
        return f"SM clock {shown} of max"
    if feature == "temperature_ratio_of_slowdown":
        return f"temperature {shown} of slowdown"
    if spec.unit == "ratio":
        return f"{spec.label} {shown} of link capacity"
    return f"{spec.label} {shown}"


def short_model(gpu_model: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``: what people call the board."""
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "GeForce ", "Tesla "):
        if gpu_model.startswith(prefix):
            return gpu_model[len(prefix) :]
    return gpu_model


def _judged_against(b: Baseline, workload: Workload | None, gpu_model: str) -> str:
    app = b.record.application
    if app == FLEET:
        what = "this fleet"
    else:
        what = APPLICATION_LABELS.get(app, app)
        if workload is not None and workload.source == "inferred":
            what += f" (inferred, {workload.confidence:.0%})"
    on = f"on {short_model(gpu_model)}" if b.record.gpu_model is not None else "on any GPU model"
    return f"{what} {on} in {b.record.phase}"


def explain(
    verdict: Verdict,
    drivers: tuple[Driver, ...],
    f_row: np.ndarray,
    b: Baseline,
    workload: Workload | None,
    gpu_model: str,
    memory_total_bytes: float,
    throttle_mask: float,
) -> str:
    """One line a person can act on: what is off, against which baseline, and a hint when the GPU says why."""
    against = _judged_against(b, workload, gpu_model)
    if not drivers:
        return f"unusual combination of values: {verdict.value} for {against}"
    parts = []
    for d in drivers[:2]:
        bound = f"p5 {_pct(d.feature, d.low)}" if d.observed < d.low else f"p95 {_pct(d.feature, d.high)}"
        parts.append((_phrase(d.feature, d.observed, memory_total_bytes), bound))
    named = {d.feature for d in drivers}
    context = ""
    for feature in ("sm_active_percent", "utilization_gpu_percent"):
        value = f_row[FEATURE_INDEX[feature]]
        if feature in named:
            break
        if value == value:  # noqa: PLR0124 (present)
            context = f" while {_phrase(feature, float(value), memory_total_bytes)}"
            break
    text = f"{parts[0][0]}{context}: {verdict.value} for {against} ({parts[0][1]})"
    if len(parts) > 1:
        text += f"; {parts[1][0]} ({parts[1][1]})"
    if throttle_mask == throttle_mask:  # noqa: PLR0124
        mask = int(throttle_mask)
        for bits, hint in _THROTTLE_HINTS:
            if mask & bits:
                text += f"; {hint}"
                break
    return text


# --- the stage -----------------------------------------------------------------------------------------------


class AnomalyTracker:
    """Per GPU: how long it has been anomalous (or not), as arrays indexed by a slot per GPU, updated per batch
    with vector operations; emits ``baseline-anomaly`` findings (see module docstring)."""

    def __init__(self, after_s: float = 30.0, repeat_s: float = 60.0, clear_s: float = 60.0) -> None:
        self.after_ns, self.repeat_ns, self.clear_ns = (int(s * 1e9) for s in (after_s, repeat_s, clear_s))
        self._slots: dict[tuple[str, str, str], int] = {}
        size = 1024
        self.anomalous_since = np.full(size, _NONE)  # start of the current anomalous streak
        self.calm_since = np.full(size, _NONE)  # start of the current streak of not-anomalous rows
        self.active_since = np.full(size, _NONE)  # since_ns of the active finding
        self.last_sent = np.full(size, _NONE)

    def _slot_of(self, batch: InterpretedBatch) -> np.ndarray:
        slots = self._slots
        keys = zip(batch.cluster, batch.node, batch.gpu_uuid, strict=True)
        out = np.fromiter((slots.setdefault(k, len(slots)) for k in keys), dtype=np.int64, count=len(batch))
        if len(slots) > len(self.anomalous_since):
            grow = 2 * len(slots)
            for name in ("anomalous_since", "calm_since", "active_since", "last_sent"):
                old = getattr(self, name)
                new = np.full(grow, _NONE)
                new[: len(old)] = old
                setattr(self, name, new)
        return out

    def update(
        self, batch: InterpretedBatch, verdict: np.ndarray, explanation: list[str], scores: np.ndarray
    ) -> list[Finding]:
        scored = verdict != _UNSCORED
        if not scored.any():
            return []
        rows = np.flatnonzero(scored)
        slot = self._slot_of(batch)[rows]
        ts = batch.ts_ns[rows].astype(np.int64)
        # an anomaly against an inferred application's baseline is as likely a wrong guess as a sick GPU: the row
        # keeps its verdict, but only a workload a context source named raises a finding (counted as calm)
        named = np.fromiter(
            (w is not None and w.source != "inferred" for w in (batch.workload[r] for r in rows.tolist())),
            dtype=bool,
            count=len(rows),
        )
        bad = (verdict[rows] == _ANOMALOUS) & named
        size = len(self.anomalous_since)
        last_calm, last_bad = np.full(size, _NONE), np.full(size, _NONE)
        np.maximum.at(last_calm, slot[~bad], ts[~bad])
        np.maximum.at(last_bad, slot[bad], ts[bad])
        first_bad_after, first_calm_after = np.full(size, _NEVER), np.full(size, _NEVER)
        m = bad & (ts > last_calm[slot])
        np.minimum.at(first_bad_after, slot[m], ts[m])
        m = ~bad & (ts > last_bad[slot])
        np.minimum.at(first_calm_after, slot[m], ts[m])
        seen = np.unique(slot)
        latest = np.maximum(last_calm[seen], last_bad[seen])
        ends_bad = last_bad[seen] > last_calm[seen]
        had_calm, had_bad = last_calm[seen] != _NONE, last_bad[seen] != _NONE
        # a streak survives a batch only if the batch ends in it; it restarts after the last row that broke it
        since = self.anomalous_since[seen]
        since = np.where(ends_bad, np.where(had_calm | (since == _NONE), first_bad_after[seen], since), _NONE)
        calm = self.calm_since[seen]
        calm = np.where(~ends_bad, np.where(had_bad | (calm == _NONE), first_calm_after[seen], calm), _NONE)
        self.anomalous_since[seen], self.calm_since[seen] = since, calm
        active = self.active_since[seen] != _NONE
        start = ~active & (since != _NONE) & (latest - since >= self.after_ns)
        repeat = active & (since != _NONE) & (latest - self.last_sent[seen] >= self.repeat_ns)
        clear = active & (calm != _NONE) & (latest - calm >= self.clear_ns)
        findings: list[Finding] = []
        if not (start.any() or repeat.any() or clear.any()):
            return findings
        # the row that speaks for each GPU: its latest scored row
        last_row = np.full(size, -1, dtype=np.int64)
        np.maximum.at(last_row, slot, np.arange(len(rows)))
        for j in np.flatnonzero(start | repeat | clear).tolist():
            s, now = int(seen[j]), int(latest[j])
            row = int(rows[last_row[s]])
            if start[j]:
                self.active_since[s] = since[j]
            is_active = bool(start[j] or repeat[j])
            findings.append(self._finding(batch, row, is_active, int(self.active_since[s]), now, explanation, scores))
            self.last_sent[s] = now
            if clear[j]:
                self.active_since[s] = _NONE
        return findings

    @staticmethod
    def _finding(
        batch: InterpretedBatch,
        row: int,
        active: bool,
        since: int,
        now: int,
        explanation: list[str],
        scores: np.ndarray,
    ) -> Finding:
        what = explanation[row] if active and explanation[row] else "behaviour back within its baseline"
        evidence = {"score": float(scores[row])} if scores[row] == scores[row] else {}
        for d in batch.drivers[row] if active else ():
            evidence[d.feature] = d.observed
        return Finding(
            detector="baseline-anomaly",
            severity=Severity.WARNING,
            active=active,
            cluster=batch.cluster[row],
            node=batch.node[row],
            gpu_uuid=batch.gpu_uuid[row],
            gpu_model=batch.gpu_model[row],
            ts_ns=now,
            since_ns=since,
            summary=what,
            action="compare with the baseline band; mark the event with `hermeneut feedback` if this is expected",
            evidence=evidence,
            workload=batch.workload[row],
            gpu_index=batch.gpu_index[row],
        )


def _codes(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    names, inverse = np.unique(np.asarray(values, dtype=object), return_inverse=True)
    return names, inverse.astype(np.int64)


class Scorer:
    """The scoring stage: judges every row against the baseline that fits it best (see module docstring).

    ``current`` returns the baselines to use (a :class:`BaselineStore`'s ``current``); it is read once per
    batch and on every tick, so a new version applies from the next batch on, never inside one. Without
    baselines rows stay ``unscored``.
    """

    def __init__(
        self,
        current: Callable[[], BaselineSet | None],
        tracker: AnomalyTracker | None = None,
    ) -> None:
        self._current = current
        self._set: BaselineSet | None = None
        self.tracker = tracker or AnomalyTracker()

    @property
    def version(self) -> int:
        return self._set.version if self._set is not None else 0

    def _refresh(self) -> None:
        latest = self._current()
        if latest is not self._set:
            log.info("scorer: switched to baselines version %d", latest.version if latest else 0)
            self._set = latest

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        self._refresh()
        if self._set is None or not len(batch):
            return batch, []
        scored, verdict = score_batch(batch, self._set)
        findings = self.tracker.update(scored, verdict, list(scored.explanation), scored.score)
        return scored, findings

    def tick(self, now_ns: int) -> list[Finding]:
        # also between batches: a new version is taken up (and logged) without waiting for data
        self._refresh()
        return []


def score_batch(batch: InterpretedBatch, baselines: BaselineSet) -> tuple[InterpretedBatch, np.ndarray]:
    """Score, verdict, baseline, drivers and explanation for every row of a batch (pure); also the verdicts as
    codes (0 unscored, 1 normal, 2 unusual, 3 anomalous)."""
    n = len(batch)
    f = features(batch.metrics, batch.relative, batch.gpu_model)
    phases = [p if p is not None else "" for p in batch.phase]
    if "" in phases:
        inferred = infer_phase(f)
        phases = [p or PHASES[inferred[i]] for i, p in enumerate(phases)]
    apps = [w.application if w is not None else FLEET for w in batch.workload]
    app_names, app_code = _codes(apps)
    model_names, model_code = _codes(list(batch.gpu_model))
    phase_names, phase_code = _codes(phases)
    key = (app_code * len(model_names) + model_code) * len(phase_names) + phase_code
    groups, group_of = np.unique(key, return_inverse=True)
    score = np.full(n, np.nan)
    verdict = np.zeros(n, dtype=np.int64)
    chosen: list[Baseline | None] = []
    for g, k in enumerate(groups.tolist()):
        a, rest = divmod(k, len(model_names) * len(phase_names))
        mdl, ph = divmod(rest, len(phase_names))
        b = baselines.resolve(str(app_names[a]), str(model_names[mdl]), str(phase_names[ph]))
        chosen.append(b)
        if b is None:
            continue
        rows = np.flatnonzero(group_of == g)
        s = b.score(f[rows])
        score[rows] = s
        r = b.record
        verdict[rows] = np.where(
            np.isnan(s), _UNSCORED, np.where(s >= r.anomalous, _ANOMALOUS, np.where(s >= r.unusual, _UNUSUAL, _NORMAL))
        )
    ids = np.array([None if b is None else b.id for b in chosen], dtype=object)[group_of]
    ids[verdict == _UNSCORED] = None
    baseline_col = ids.tolist()
    drivers: list[tuple[Driver, ...]] = list(batch.drivers) if batch.drivers else [()] * n
    explanation = list(batch.explanation)
    off = np.flatnonzero(verdict >= _UNUSUAL)
    if len(off):
        memory_total = batch.metrics[:, METRIC_INDEX["memory_total_bytes"]]
        throttle = batch.metrics[:, METRIC_INDEX["throttle_reasons_mask"]]
        for g in np.unique(group_of[off]).tolist():
            b = chosen[g]
            assert b is not None
            rows = off[group_of[off] == g]
            for row, ds in zip(rows.tolist(), b.drivers(f[rows]), strict=True):
                drivers[row] = ds
                explanation[row] = explain(
                    _VERDICTS[verdict[row]],
                    ds,
                    f[row],
                    b,
                    batch.workload[row],
                    batch.gpu_model[row],
                    float(memory_total[row]),
                    float(throttle[row]),
                )
    scored = dataclasses.replace(
        batch,
        score=score,
        verdict=tuple(_VERDICTS[v] for v in verdict.tolist()),
        baseline=tuple(baseline_col),
        explanation=tuple(explanation),
        phase=tuple(phases),
        drivers=tuple(drivers),
    )
    return scored, verdict
