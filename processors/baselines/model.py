"""A learned baseline as a model: what is normal for one (application, GPU model, phase) over the FEATURES, and how
improbable a row is under it.

A baseline (:class:`pipeline.baselines.BaselineRecord` on the wire, :class:`Baseline` compiled) is one robust
Gaussian per way of working (*mode*) plus per-feature quantiles p1/p5/p50/p95/p99 per mode. Priors pool the same over
GPU models per (application, phase) (``prior:<app>/<phase>``) and over everything per phase
(``prior:fleet/<phase>``), so a new job on a new model is judged from its first sample.

Score: how improbable a row is, ``-log10`` of the chi-square tail probability of its Mahalanobis distance to the
nearest mode over the features the row has (missing ones are marginalized out, never imputed; the precision matrix
of every missing-feature pattern is cached). Drivers: the features outside [p5, p95] of that mode, largest
standardized deviation first.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from scipy.special import gammaincc, gammaln

from pipeline.baselines import BaselineRecord
from pipeline.events import Driver
from processors.features import FEATURE_FLOOR, FEATURE_INDEX, FEATURES

QUANTILES: Final = (0.01, 0.05, 0.50, 0.95, 0.99)
_P5, _P50, _P95 = 1, 2, 3
_LN10: Final = math.log(10.0)
#: the spread of a normal distribution between its 5th and 95th percentiles, in standard deviations
_P5_P95_SIGMAS: Final = 3.29
MAX_DRIVERS: Final = 3
#: the application of the fleet-wide priors (and of rows whose workload is unknown)
FLEET: Final = "fleet"


def baseline_id(application: str, gpu_model: str | None, phase: str) -> str:
    """``app/model/phase`` for a model's baseline, ``prior:app/phase`` pooled over models."""
    return f"{application}/{gpu_model}/{phase}" if gpu_model is not None else f"prior:{application}/{phase}"


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
