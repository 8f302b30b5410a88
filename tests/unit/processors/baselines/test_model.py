"""A compiled baseline: missing features are marginalized (never zeroed), drivers are read against the band of the
mode a row is closest to, and scores stay finite far in the tail."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chi2

from processors.baselines.model import Baseline
from processors.features import FEATURE_INDEX
from tests.unit.processors.baselines.helpers import H100, fit_on
from tests.unit.processors.history import Labelled


def test_missing_features_are_marginalized_not_zeroed(history: Labelled) -> None:
    b = Baseline(fit_on(history, "llm-pretraining", H100))
    row = history.f[(history.application == "llm-pretraining") & (history.model == H100)][:1].copy()
    j = FEATURE_INDEX["power_ratio_of_limit"]
    missing, zero = row.copy(), row.copy()
    missing[0, j], zero[0, j] = np.nan, 0.0
    cols = [i for i, f in enumerate(b.record.features) if f != "power_ratio_of_limit"]
    d2 = min(
        (d := row[0, b.idx[cols]] - center[cols]) @ np.linalg.inv(cov[np.ix_(cols, cols)]) @ d
        for center, cov in zip(b.centers, b.covs, strict=True)
    )
    expected = -chi2.logsf(d2, len(cols)) / math.log(10)
    assert b.score(missing)[0] == pytest.approx(expected)
    assert b.score(zero)[0] > b.record.anomalous  # a zero would have been an anomaly
    assert np.isnan(b.score(np.full_like(row, np.nan))[0])


def test_drivers_carry_observed_against_the_band(history: Labelled) -> None:
    record = fit_on(history, "llm-pretraining", H100)
    b = Baseline(record)
    row = history.f[(history.application == "llm-pretraining") & (history.model == H100)][:1].copy()
    row[0, FEATURE_INDEX["power_ratio_of_limit"]] = 0.38
    (drivers,) = b.drivers(row)
    first = drivers[0]
    j = record.features.index("power_ratio_of_limit")
    # the band of the mode the row is closest to (the bulk of pre-training here, not its data-loading mode)
    mode = int(b.nearest(row)[0])
    q = np.array(record.mode_quantiles).reshape(record.modes, 5, -1)[mode]
    assert record.modes >= 2 and mode == 0
    assert (first.feature, first.observed) == ("power_ratio_of_limit", 0.38)
    assert (first.expected, first.low, first.high) == (q[2, j], q[1, j], q[3, j])
    assert first.observed < first.low
    whole = np.array(record.quantiles).reshape(5, -1)
    assert whole[1, j] < 0.38  # over the whole baseline 0.38 is inside [p5, p95]: no driver would be named


def test_scores_stay_finite_far_in_the_tail() -> None:
    from processors.baselines.model import surprise

    d2 = np.array([0.0, 10.0, 1e3, 1e5, 1e8])
    s = surprise(d2, 10)
    assert np.isfinite(s).all() and (np.diff(s) > 0).all()
    # where the exact value is representable, the asymptotic branch agrees with it
    assert surprise(np.array([1400.0]), 10)[0] == pytest.approx(-chi2.logsf(1400.0, 10) / math.log(10), rel=1e-3)
