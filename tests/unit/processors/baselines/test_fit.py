"""Fitting a baseline: robust to the outliers it exists to find, a mode of its own for a second way of working,
thresholds calibrated on the training rows, and widened to cover what operators said is not anomalous."""

from __future__ import annotations

import numpy as np
import pytest

from processors.baselines.fit import fit_baseline, trimmed_gaussian
from processors.baselines.model import Baseline
from processors.features import FEATURE_INDEX, infer_phase
from tests.unit.processors.baselines.helpers import H100, fit_on
from tests.unit.processors.history import Labelled


def test_trimmed_fit_is_not_pulled_by_the_outliers_it_should_find() -> None:
    rng = np.random.default_rng(0)
    clean = rng.normal(0.5, 0.05, size=(900, 2))
    x = np.vstack([clean, rng.normal(0.95, 0.01, size=(100, 2))])  # 10% contamination
    center, cov = trimmed_gaussian(x, np.array([0.001, 0.001]), 0.975, 5)
    assert np.abs(center - 0.5).max() < 0.01
    assert np.abs(x.mean(axis=0) - 0.5).min() > 0.04  # what a plain mean would have said
    assert np.sqrt(np.diag(cov)) == pytest.approx([0.05, 0.05], rel=0.1)


def test_a_second_way_of_working_gets_a_mode_of_its_own() -> None:
    rng = np.random.default_rng(1)
    cols = [FEATURE_INDEX["utilization_gpu_percent"], FEATURE_INDEX["power_ratio_of_limit"]]
    x = np.full((2000, len(FEATURE_INDEX)), np.nan)
    x[:, cols] = np.column_stack([rng.normal(97, 2, 2000), rng.normal(0.8, 0.03, 2000)])
    x[:100, cols] = np.column_stack([rng.normal(88, 2, 100), rng.normal(0.5, 0.03, 100)])  # 5%: evaluation passes
    record = fit_baseline(x, "bert-training", H100, "compute", 1, 0)
    assert record is not None and record.modes == 2
    centers = np.array(record.center).reshape(2, 2)
    assert centers[0] == pytest.approx([97, 0.8], rel=0.02) and centers[1] == pytest.approx([88, 0.5], rel=0.03)
    probe = np.full((2, len(FEATURE_INDEX)), np.nan)
    probe[:, cols] = [[88.0, 0.5], [92.0, 0.3]]  # an evaluation pass; half the power of either mode
    scores = Baseline(record).score(probe)
    assert scores[0] < record.unusual and scores[1] > record.anomalous
    one_mode = fit_baseline(x[100:], "bert-training", H100, "compute", 1, 0)
    assert one_mode is not None and one_mode.modes == 1  # rare outliers do not make a mode


def test_thresholds_are_calibrated_on_the_training_rows(history: Labelled) -> None:
    record = fit_on(history, "llm-serving", H100)
    rows = (history.application == "llm-serving") & (history.model == H100) & (infer_phase(history.f) == 0)
    scores = Baseline(record).score(history.f[rows])
    assert record.n == rows.sum()
    # unusual above the training p99 (or a 1% tail under the fitted Gaussian, when that is stricter)
    assert record.unusual == pytest.approx(max(float(np.quantile(scores, 0.99)), 2.0))
    # a 1% tail, to within one row (the quantile of n rows falls between two of them)
    assert (scores >= record.unusual).mean() <= 0.01 + 1 / len(scores)
    assert record.anomalous == pytest.approx(max(float(np.quantile(scores, 0.999)) * 1.5, 4.0, record.unusual * 1.5))


def test_feedback_widens_thresholds_to_cover_the_event(history: Labelled) -> None:
    rows = (history.application == "llm-pretraining") & (history.model == H100) & (infer_phase(history.f) == 0)
    x = history.f[rows]
    odd = x[:1].copy()
    odd[0, FEATURE_INDEX["power_ratio_of_limit"]] = 0.05
    plain = fit_baseline(x, "llm-pretraining", H100, "compute", 1, 0)
    kept = fit_baseline(x, "llm-pretraining", H100, "compute", 2, 0, keep=odd)
    assert plain is not None and kept is not None
    assert Baseline(plain).score(odd)[0] >= plain.anomalous
    assert Baseline(kept).score(odd)[0] < kept.unusual
    assert kept.feedback_covered == 1
