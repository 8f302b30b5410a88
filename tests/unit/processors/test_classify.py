"""The application classifier: rolling windows kept per GPU, fitted on labelled history, judged on a fleet it
never saw, shipped as arrays through the record codec."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.baselines import ClassifierRecord
from pipeline.codec import decode_record, encode_record
from pipeline.events import APPLICATIONS
from processors.classify import (
    INPUTS,
    UNKNOWN,
    Classifier,
    WindowBuffer,
    fit_classifier,
    history_windows,
    window_inputs,
)

from .history import labelled_history

WINDOW = 30


@pytest.fixture(scope="module")
def record() -> ClassifierRecord:
    h = labelled_history(seed=1, rounds=150)
    windows, ends = history_windows(h.f, h.gpu, h.ts_ns, WINDOW, 10)
    fitted = fit_classifier(window_inputs(windows), h.application[ends], 1, WINDOW, 0.6)
    assert fitted is not None
    return fitted


def test_classifier_names_the_application_of_gpus_it_never_saw(record: ClassifierRecord) -> None:
    other = labelled_history(seed=42, nodes=25, rounds=60)
    windows, ends = history_windows(other.f, other.gpu, other.ts_ns, WINDOW, 15)
    names, confidence = Classifier(record).predict(window_inputs(windows))
    accuracy = float(np.mean(np.array(names) == other.application[ends]))
    assert accuracy >= 0.9, accuracy
    assert record.holdout_accuracy >= 0.9
    assert set(record.classes) == set(APPLICATIONS) - {"unknown"}  # every application runs in this fleet
    assert confidence.min() > 0


def test_below_the_confidence_threshold_the_answer_is_unknown(record: ClassifierRecord) -> None:
    rng = np.random.default_rng(0)
    noise = window_inputs(rng.uniform(0, 100, size=(20, WINDOW, len(INPUTS) // 5)))
    names, confidence = Classifier(record).predict(noise)
    assert [n == UNKNOWN for n in names] == (confidence < record.min_confidence).tolist()
    never_sure = Classifier(dataclasses.replace(record, min_confidence=1.01))
    assert set(never_sure.predict(noise)[0]) == {UNKNOWN}


def test_record_survives_the_wire(record: ClassifierRecord) -> None:
    decoded = decode_record(ClassifierRecord, encode_record(record))
    h = labelled_history(seed=5, nodes=5, rounds=40)
    windows, _ = history_windows(h.f, h.gpu, h.ts_ns, WINDOW, 10)
    inputs = window_inputs(windows)
    a, pa = Classifier(record).predict(inputs)
    b, pb = Classifier(decoded).predict(inputs)
    assert a == b and np.allclose(pa, pb)


def test_window_buffer_keeps_the_last_samples_of_each_gpu_in_order() -> None:
    a, b = ("c", "n", "GPU-a"), ("c", "n", "GPU-b")
    buf = WindowBuffer(window=3, features=1)
    slots = buf.slots([a, b, a])
    assert slots.tolist() == [0, 1, 0]
    buf.update(slots, np.array([[1.0], [10.0], [2.0]]))
    buf.update(buf.slots([a] * 4), np.array([[3.0], [4.0], [5.0], [6.0]]))  # more rows than the window
    windows, counts = buf.windows(buf.slots([a, b]))
    assert counts.tolist() == [3, 1]
    assert sorted(windows[0, :, 0].tolist()) == [4.0, 5.0, 6.0]
    assert windows[1, 0, 0] == 10.0 and np.isnan(windows[1, 1:, 0]).all()


def test_window_buffer_grows_past_its_first_size() -> None:
    buf = WindowBuffer(window=2, features=2)
    keys = [("c", f"node-{i // 8}", f"GPU-{i}") for i in range(200)]
    slots = buf.slots(keys)
    buf.update(slots, np.arange(400, dtype=float).reshape(200, 2))
    windows, counts = buf.windows(slots)
    assert counts.tolist() == [1] * 200 and windows[199, 0].tolist() == [398.0, 399.0]


def test_absent_features_are_a_signal_not_a_zero() -> None:
    windows = np.full((1, 4, len(INPUTS) // 5), np.nan)
    windows[0, :, 0] = [10.0, 20.0, 30.0, 40.0]
    inputs = window_inputs(windows)[0]
    k = len(INPUTS) // 5
    assert inputs[0] == 25.0 and inputs[4 * k] == 1.0  # mean and presence of feature 0
    assert np.isnan(inputs[1]) and inputs[4 * k + 1] == 0.0  # feature 1: never reported


def test_a_classifier_record_that_cannot_be_used_is_rejected(record: ClassifierRecord) -> None:
    from pipeline.errors import DecodeError
    from processors.baselines.store import decode_baselines_record

    broken = dataclasses.replace(record, coef=record.coef[:-1])
    with pytest.raises(DecodeError, match="classes x"):
        decode_baselines_record(encode_record(broken))
    assert decode_baselines_record(encode_record(record)) == record
