"""Published baselines: the most specific baseline for each row (its model's, else the priors), hot reload of
complete versions only, and records that cannot be used rejected at decoding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.baselines import CLASSIFIER_KEY, MANIFEST_KEY, BaselineManifest
from pipeline.codec import encode_record
from pipeline.events import Verdict
from processors.baselines.fit import fit_baseline
from processors.baselines.score import Scorer, score_batch
from processors.baselines.store import BaselineStore, decode_baselines_record
from processors.features import infer_phase
from tests.unit.processors.baselines.helpers import H100, fit_on, set_of, with_app
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
