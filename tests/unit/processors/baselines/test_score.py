"""Baselines: robust fitting, calibrated scores, masking of missing features, application-aware verdicts with
explanations, fallback to priors, hot reload of complete versions, and baseline-anomaly findings."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import chi2

from pipeline.baselines import CLASSIFIER_KEY, MANIFEST_KEY, BaselineManifest, BaselineRecord
from pipeline.codec import encode_record
from pipeline.events import METRIC_INDEX, InterpretedBatch, Verdict, Workload
from processors.baselines.fit import fit_baseline, trimmed_gaussian
from processors.baselines.model import Baseline
from processors.baselines.score import AnomalyTracker, Scorer, score_batch
from processors.baselines.store import BaselineSet, BaselineStore, decode_baselines_record
from processors.features import FEATURE_INDEX, features, infer_phase
from tests.unit.processors.history import Labelled, labelled_history

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def history() -> Labelled:
    return labelled_history(seed=1)


def _fit(h: Labelled, app: str, model: str | None, version: int = 1) -> BaselineRecord:
    rows = (h.application == app) & ((h.model == model) if model else True) & (infer_phase(h.f) == 0)
    record = fit_baseline(h.f[rows], app, model, "compute", version, 0)
    assert record is not None
    return record


def _set(*records: BaselineRecord, version: int = 1) -> BaselineSet:
    return BaselineSet(BaselineManifest(version, 0, 0, 0, tuple(r.baseline_id for r in records)), list(records))


def _concat(batches: list[InterpretedBatch]) -> InterpretedBatch:
    return InterpretedBatch.from_events([e for b in batches for e in b.events()])


def _with_app(batch: InterpretedBatch, app: str | None) -> InterpretedBatch:
    workload = None if app is None else Workload(app, source="static", confidence=1.0)
    return dataclasses.replace(batch, workload=(workload,) * len(batch))


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
    record = _fit(history, "llm-serving", H100)
    rows = (history.application == "llm-serving") & (history.model == H100) & (infer_phase(history.f) == 0)
    scores = Baseline(record).score(history.f[rows])
    assert record.n == rows.sum()
    # unusual above the training p99 (or a 1% tail under the fitted Gaussian, when that is stricter)
    assert record.unusual == pytest.approx(max(float(np.quantile(scores, 0.99)), 2.0))
    assert (scores >= record.unusual).mean() <= 0.011
    assert record.anomalous == pytest.approx(max(float(np.quantile(scores, 0.999)) * 1.5, 4.0, record.unusual * 1.5))


def test_missing_features_are_marginalized_not_zeroed(history: Labelled) -> None:
    b = Baseline(_fit(history, "llm-pretraining", H100))
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


def test_same_values_are_normal_for_one_application_and_anomalous_for_another(history: Labelled) -> None:
    baselines = _set(_fit(history, "llm-serving", H100), _fit(history, "llm-pretraining", H100))
    picked = [
        (b, i)
        for b, apps in zip(history.batches[-40:], history.batch_apps[-40:], strict=True)
        for i in np.flatnonzero(infer_phase(features(b.metrics, b.relative, b.gpu_model)) == 0).tolist()
        if apps[i] == "llm-serving" and b.gpu_model[i] == H100
    ]
    assert len(picked) >= 20
    batch = _concat([b for b, _ in picked])
    rows = [sum(len(b) for b, _ in picked[:k]) + i for k, (_, i) in enumerate(picked)]
    serving, _ = score_batch(_with_app(batch, "llm-serving"), baselines)
    pretraining, _ = score_batch(_with_app(batch, "llm-pretraining"), baselines)
    assert all(serving.verdict[i] in (Verdict.NORMAL, Verdict.UNUSUAL) for i in rows)
    assert sum(serving.verdict[i] == Verdict.NORMAL for i in rows) >= 0.9 * len(rows)
    for i in rows:
        assert pretraining.verdict[i] == Verdict.ANOMALOUS
        assert pretraining.baseline[i] == f"llm-pretraining/{H100}/compute"
        text = pretraining.explanation[i]
        assert "anomalous for LLM pre-training on H100 80GB HBM3 in compute" in text
        assert pretraining.drivers[i] and ("(p5 " in text or "(p95 " in text)
        assert len(pretraining.explanation[i]) < 300
        assert (serving.explanation[i] == "") == (serving.verdict[i] == Verdict.NORMAL)


def test_drivers_carry_observed_against_the_band(history: Labelled) -> None:
    record = _fit(history, "llm-pretraining", H100)
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


def test_explanation_reads_like_advice(history: Labelled) -> None:
    baselines = _set(_fit(history, "llm-pretraining", H100))
    batch, i = next(
        (b, i)
        for b, apps in zip(history.batches, history.batch_apps, strict=True)
        for i, app in enumerate(apps)
        if b.gpu_model[i] == H100 and app == "llm-pretraining"
    )
    metrics = batch.metrics.copy()
    metrics[i, METRIC_INDEX["power_watts"]] = 0.38 * metrics[i, METRIC_INDEX["power_limit_watts"]]
    metrics[i, METRIC_INDEX["throttle_reasons_mask"]] = 0x40
    relative = batch.relative.copy()
    relative[i, 0] = 0.38
    changed = _with_app(dataclasses.replace(batch, metrics=metrics, relative=relative), "llm-pretraining")
    scored, codes = score_batch(changed, baselines)
    text = scored.explanation[i]
    assert codes[i] >= 2
    assert text.startswith("power 38% of limit while SM active")
    assert "for LLM pre-training on H100 80GB HBM3 in compute (p5 " in text
    assert text.endswith("clocks held by thermal slowdown: check cooling")


def test_fallback_to_priors_and_cold_start(history: Labelled) -> None:
    prior = dataclasses.replace(_fit(history, "llm-serving", None), baseline_id="prior:llm-serving/compute")
    fleet_rows = infer_phase(history.f) == 0
    fleet = fit_baseline(history.f[fleet_rows], "fleet", None, "compute", 1, 0)
    assert fleet is not None and fleet.baseline_id == "prior:fleet/compute"
    baselines = _set(_fit(history, "llm-serving", H100), prior, fleet)
    batch = history.batches[0]
    scored, _ = score_batch(_with_app(batch, "llm-serving"), baselines)
    for model, used in zip(batch.gpu_model, scored.baseline, strict=True):
        assert used == (f"llm-serving/{H100}/compute" if model == H100 else "prior:llm-serving/compute") or used is None
    unknown, _ = score_batch(_with_app(batch, None), baselines)
    assert {b for b in unknown.baseline if b} == {"prior:fleet/compute"}
    cold, _ = Scorer(lambda: None).apply(batch, 0)
    assert set(cold.verdict) == {Verdict.UNSCORED} and set(cold.explanation) == {""}


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


def test_store_switches_only_to_a_complete_version(history: Labelled) -> None:
    a, b = _fit(history, "llm-serving", H100, 2), _fit(history, "llm-pretraining", H100, 2)
    manifest = BaselineManifest(2, 0, 0, 0, (a.baseline_id, b.baseline_id))
    store = BaselineStore()
    scorer = Scorer(store.current)
    decoded = [decode_baselines_record(encode_record(r)) for r in (manifest, a)]
    store.on_change(MANIFEST_KEY, decoded[0])
    store.on_change(a.baseline_id.encode(), decoded[1])
    assert store.current() is None  # b is missing
    store.on_change(b.baseline_id.encode(), dataclasses.replace(b, version=1))
    assert store.current() is None  # b is from another version
    scorer.apply(history.batches[0], 0)
    assert scorer.version == 0
    store.on_change(b.baseline_id.encode(), decode_baselines_record(encode_record(b)))
    current = store.current()
    assert current is not None and current.version == 2 and set(current.baselines) == set(manifest.ids)
    scorer.apply(history.batches[0], 0)
    assert scorer.version == 2
    with_classifier = dataclasses.replace(manifest, version=3, classifier=True)
    store.on_change(MANIFEST_KEY, with_classifier)
    assert store.current() is current  # version 3 needs its records and its classifier first
    assert CLASSIFIER_KEY not in (a.baseline_id.encode(), b.baseline_id.encode())


def _verdict_batch(ts_s: list[float], codes: list[int]) -> tuple[InterpretedBatch, np.ndarray]:
    n = len(ts_s)
    batch = InterpretedBatch(
        cluster=("c",) * n, node=("n",) * n, gpu_uuid=("GPU-1",) * n, gpu_index=(0,) * n, gpu_model=(H100,) * n,
        ts_ns=np.array([int(t * 1e9) for t in ts_s], dtype=np.int64), metrics=np.full((n, 1), np.nan),
        relative=np.full((n, 1), np.nan), workload=(Workload("llm-serving"),) * n, score=np.full(n, 9.0),
        verdict=(Verdict.ANOMALOUS,) * n, baseline=("b",) * n, explanation=("power off",) * n,
    )  # fmt: skip
    return batch, np.array(codes)


def test_baseline_anomaly_findings_fire_repeat_and_clear() -> None:
    tracker = AnomalyTracker()
    fired = []
    for t in range(200):
        code = 3 if t < 120 else 1
        batch, codes = _verdict_batch([float(t)], [code])
        fired += [(t, f.active, f.since_ns) for f in tracker.update(batch, codes, ["power off"], batch.score)]
    assert fired == [(30, True, 0), (90, True, 0), (180, False, 0)]


def test_an_inferred_application_raises_no_finding() -> None:
    tracker = AnomalyTracker()
    batch, codes = _verdict_batch([float(t) for t in range(120)], [3] * 120)
    guessed = dataclasses.replace(batch, workload=(Workload("llm-serving", source="inferred", confidence=0.9),) * 120)
    assert tracker.update(guessed, codes, ["x"] * 120, batch.score) == []
    assert [f.active for f in tracker.update(batch, codes, ["x"] * 120, batch.score)] == [True]  # named: found


def test_a_calm_sample_restarts_the_streak() -> None:
    tracker = AnomalyTracker()
    batch, codes = _verdict_batch([float(t) for t in range(25)], [3] * 25)
    assert tracker.update(batch, codes, ["x"] * 25, batch.score) == []
    batch, codes = _verdict_batch([25.0, 26.0, 27.0], [1, 3, 3])
    assert tracker.update(batch, codes, ["x"] * 3, batch.score) == []
    batch, codes = _verdict_batch([54.0, 55.0], [3, 3])
    assert tracker.update(batch, codes, ["x"] * 2, batch.score) == []
    batch, codes = _verdict_batch([56.0], [3])
    (finding,) = tracker.update(batch, codes, ["x"], batch.score)
    assert finding.active and finding.since_ns == 26 * 10**9 and finding.detector == "baseline-anomaly"


def test_features_of_the_fleet_are_relative(history: Labelled) -> None:
    batch = history.batches[0]
    f = features(batch.metrics, batch.relative, batch.gpu_model)
    assert np.nanmax(f[:, FEATURE_INDEX["power_ratio_of_limit"]]) <= 1.1
    assert np.nanmax(f[:, FEATURE_INDEX["pcie_rx_ratio_of_capacity"]]) < 1.0


def test_scores_stay_finite_far_in_the_tail() -> None:
    from processors.baselines.model import surprise

    d2 = np.array([0.0, 10.0, 1e3, 1e5, 1e8])
    s = surprise(d2, 10)
    assert np.isfinite(s).all() and (np.diff(s) > 0).all()
    # where the exact value is representable, the asymptotic branch agrees with it
    assert surprise(np.array([1400.0]), 10)[0] == pytest.approx(-chi2.logsf(1400.0, 10) / math.log(10), rel=1e-3)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"center": (0.5,)}, "inconsistent"),
        ({"unusual": float("nan")}, "nan"),
        ({"covariance": None}, "inconsistent"),  # replaced below by a singular matrix
    ],
)
def test_records_that_cannot_be_used_are_rejected_at_decoding(
    history: Labelled, change: dict[str, object], reason: str
) -> None:
    from pipeline.errors import DecodeError

    record = _fit(history, "llm-serving", H100)
    if change.get("covariance", 0) is None:
        k = len(record.features)
        change = {"covariance": tuple(np.ones((k, k)).ravel().tolist())}
    with pytest.raises(DecodeError) as err:
        decode_baselines_record(encode_record(dataclasses.replace(record, **change)))  # type: ignore[arg-type]
    assert err.value.reason == reason
    assert decode_baselines_record(encode_record(record)) == record
