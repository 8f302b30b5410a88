from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

from pipeline.codec import decode_interpreted, decode_samples, encode_interpreted, encode_samples
from pipeline.errors import DecodeError
from pipeline.events import (
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    SampleBatch,
    Verdict,
    Workload,
    metric_matrix,
)


def _sample(**metrics: float) -> GpuSample:
    return GpuSample("c", "n1", "GPU-1", 0, "NVIDIA H100 80GB HBM3", 1_700_000_000_123_456_789, dict(metrics))


def test_samples_round_trip_exactly() -> None:
    batch = SampleBatch("c", "n1", (_sample(power_watts=312.25, memory_used_bytes=2**40 - 1), _sample()))
    decoded, rejected = decode_samples(encode_samples(batch))
    assert rejected == []
    assert decoded == batch
    assert decoded.samples[0].metrics["memory_used_bytes"] == 2**40 - 1  # int64 stays exact


def test_interpreted_round_trip() -> None:
    event = InterpretedEvent(
        _sample(power_watts=100.0),
        {"power_ratio_of_limit": 0.5},
        Workload("llm-training", "job-7", "ana", "slurm", 1.0),
        0.3,
        Verdict.NORMAL,
        "llm-training/H100/compute",
        "ok",
    )
    batch = InterpretedBatch.from_events([event])
    assert decode_interpreted(encode_interpreted(batch)).events() == [event]


def test_interpreted_columns_are_matched_by_name() -> None:
    """A sender with other (older/newer) columns still decodes: known columns by name, unknown ones dropped."""
    batch = InterpretedBatch.from_events([InterpretedEvent(_sample(power_watts=7.0, fan_speed_percent=3.0))])
    raw = msgpack.unpackb(encode_interpreted(batch))
    names = raw["fields"]
    m = np.frombuffer(raw["m"], dtype="<f8").reshape(1, len(names))
    keep = [i for i, n in enumerate(names) if n != "fan_speed_percent"][::-1]
    raw["fields"] = [names[i] for i in keep] + ["a_future_field"]
    raw["m"] = np.append(m[:, keep], [[1.0]], axis=1).tobytes()
    (event,) = decode_interpreted(msgpack.packb(raw)).events()
    assert event.sample.metrics == {"power_watts": 7.0}


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "malformed"),
        (b"\xc1", "malformed"),
        (msgpack.packb("a string"), "malformed"),
        (msgpack.packb({"cluster": "c", "node": "n", "samples": []}), "malformed"),
        (msgpack.packb({"v": 2, "cluster": "c", "node": "n", "samples": []}), "unknown_schema_version"),
        (msgpack.packb({"v": 1, "cluster": "", "node": "n", "samples": []}), "wrong_type"),
        (msgpack.packb({"v": 1, "cluster": "c", "node": "n", "samples": {}}), "wrong_type"),
    ],
)
def test_broken_envelopes_raise(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_samples(payload)
    assert info.value.reason == reason


def test_truncated_message_is_malformed() -> None:
    payload = encode_samples(SampleBatch("c", "n1", (_sample(power_watts=1.0),)))
    for cut in (1, len(payload) // 2, len(payload) - 1):
        with pytest.raises(DecodeError, match="malformed"):
            decode_samples(payload[:cut])


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: s["m"].update(power_watts="310"), "wrong_type"),
        (lambda s: s["m"].update(power_watts=True), "wrong_type"),
        (lambda s: s["m"].update(made_up_field=1.0), "unknown_field"),
        (lambda s: s.update(ts_ns=1.5), "wrong_type"),
        (lambda s: s.update(uuid=None), "wrong_type"),
        (lambda s: s.update(index=-1), "wrong_type"),
        (lambda s: s.update(m=[1, 2]), "wrong_type"),
    ],
)
def test_one_bad_sample_does_not_cost_the_others(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    batch = SampleBatch("c", "n1", (_sample(power_watts=1.0), _sample(power_watts=2.0)))
    raw = msgpack.unpackb(encode_samples(batch))
    mutate(raw["samples"][1])
    decoded, rejected = decode_samples(msgpack.packb(raw))
    assert [s.metrics["power_watts"] for s in decoded.samples] == [1.0]
    assert [(r.reason, r.position) for r in rejected] == [(reason, 1)]


def test_unit_aliases_are_accepted_names() -> None:
    decoded, rejected = decode_samples(encode_samples(SampleBatch("c", "n", (_sample(memory_used_mib=1024.0),))))
    assert not rejected and decoded.samples[0].metrics == {"memory_used_mib": 1024.0}


def test_metric_matrix_shape_and_absent_fields() -> None:
    m = metric_matrix([_sample(power_watts=5.0)])
    assert m.shape[0] == 1 and math.isnan(m[0, 0])
    assert metric_matrix([]).shape[0] == 0
