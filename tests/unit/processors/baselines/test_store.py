"""Published baselines: the most specific baseline for each row (its model's, else the priors), hot reload of
complete versions only, and records that cannot be used rejected at decoding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.baselines import CLASSIFIER_KEY, MANIFEST_KEY, BaselineManifest, BaselineRecord
from pipeline.codec import encode_record
from pipeline.events import Verdict
from processors.baselines.fit import fit_baseline
from processors.baselines.score import Scorer, score_batch
from processors.baselines.store import BaselineStore, cluster_key, decode_baselines_record, merged
from processors.features import infer_phase
from tests.unit.processors.baselines.helpers import H100, first_row, fit_on, set_of, with_app
from tests.unit.processors.history import Labelled


def test_fallback_to_priors_and_cold_start(history: Labelled) -> None:
    prior = dataclasses.replace(fit_on(history, "llm-serving", None), baseline_id="prior:llm-serving/compute")
    fleet_rows = infer_phase(history.f) == 0
    fleet = fit_baseline(history.f[fleet_rows], "fleet", None, "compute", 1, 0)
    assert fleet is not None and fleet.baseline_id == "prior:fleet/compute"
    baselines = set_of(fit_on(history, "llm-serving", H100), prior, fleet)
    batch = history.batches[0]
    scored, _ = score_batch(with_app(batch, "llm-serving"), baselines)
    for model, used in zip(batch.gpu_model, scored.baseline, strict=True):
        assert used == (f"llm-serving/{H100}/compute" if model == H100 else "prior:llm-serving/compute") or used is None
    unknown, _ = score_batch(with_app(batch, None), baselines)
    assert {b for b in unknown.baseline if b} == {"prior:fleet/compute"}
    cold, _ = Scorer(lambda: None).apply(batch, 0)
    assert set(cold.verdict) == {Verdict.UNSCORED} and set(cold.explanation) == {""}


def test_store_switches_only_to_a_complete_version(history: Labelled) -> None:
    a, b = fit_on(history, "llm-serving", H100, 2), fit_on(history, "llm-pretraining", H100, 2)
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

    record = fit_on(history, "llm-serving", H100)
    if change.get("covariance", 0) is None:
        k = len(record.features)
        change = {"covariance": tuple(np.ones((k, k)).ravel().tolist())}
    with pytest.raises(DecodeError) as err:
        decode_baselines_record(encode_record(dataclasses.replace(record, **change)))  # type: ignore[arg-type]
    assert err.value.reason == reason
    assert decode_baselines_record(encode_record(record)) == record


def _of(record: BaselineRecord, cluster: str, **change: object) -> BaselineRecord:
    return dataclasses.replace(record, clusters=(cluster,), **change)  # type: ignore[arg-type]


def test_training_one_cluster_keeps_every_other_clusters_baselines(history: Labelled) -> None:
    serving, pretraining = fit_on(history, "llm-serving", H100), fit_on(history, "llm-pretraining", H100)
    a1 = merged([_of(serving, "A"), _of(pretraining, "A")], "A", {}, 1)
    assert list(a1) == [cluster_key(serving.baseline_id, "A"), cluster_key(pretraining.baseline_id, "A")]
    # B learns the same (application, model, phase) from its own rows: a record of its own, A's untouched
    b_serving = _of(fit_on(history, "llm-serving", H100, 2), "B", n=7, trained_ns=5)
    v2 = merged([b_serving], "B", a1, 2)
    assert set(v2) == {*a1, cluster_key(serving.baseline_id, "B")}
    for key, record in a1.items():
        assert v2[key] == dataclasses.replace(record, version=2)
    # A again, without pretraining now: A's dropped id goes, B's stays as it was
    v3 = merged([_of(fit_on(history, "llm-serving", H100, 3), "A")], "A", v2, 3)
    assert set(v3) == {cluster_key(serving.baseline_id, "A"), cluster_key(serving.baseline_id, "B")}
    assert v3[cluster_key(serving.baseline_id, "B")] == dataclasses.replace(b_serving, version=3)
    # the whole fleet's training replaces everything, keyed by id as before
    assert merged([serving], None, v3, 4) == {serving.baseline_id: serving}


def test_a_row_is_judged_by_its_own_clusters_baseline(history: Labelled) -> None:
    serving = fit_on(history, "llm-serving", H100)
    # B's baseline of the same id learned from another application's rows: it judges serving rows differently
    other = dataclasses.replace(fit_on(history, "llm-pretraining", H100), baseline_id=serving.baseline_id)
    a, b = _of(serving, "A", n=10), _of(other, "B", n=20)
    both = set_of(a, b)
    batch, _row = first_row(history, "llm-serving", H100)
    batch = with_app(batch, "llm-serving")
    h100 = np.array([m == H100 for m in batch.gpu_model])
    for cluster, alone in (("A", a), ("B", b), ("C", b)):  # C has none of its own: the one from more rows
        here = dataclasses.replace(batch, cluster=(cluster,) * len(batch))
        got, _ = score_batch(here, both)
        expected, _ = score_batch(here, set_of(alone))
        assert np.array_equal(np.asarray(got.score)[h100], np.asarray(expected.score)[h100], equal_nan=True), cluster
    by_a, by_b = (np.asarray(score_batch(batch, set_of(r))[0].score)[h100] for r in (a, b))
    assert not np.allclose(by_a, by_b, equal_nan=True)  # so the cluster's choice is what the test sees
