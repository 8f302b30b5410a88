"""Bad input on real servers: every bad event lands in the dead-letter topic with its reason, every good one
in InfluxDB, and nothing crashes."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import msgpack
import pytest

from pipeline.codec import encode_samples, sample_rows
from pipeline.config import Settings
from pipeline.deadletter import headers_dict
from pipeline.events import GpuSample, SampleBatch
from producers.simulator import Fleet

from .harness import consume_all, publish, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration


def _with(sample: GpuSample, **changes: object) -> GpuSample:
    metrics = dict(sample.metrics)
    for k, v in changes.items():
        if k != "ts_ns":
            metrics[k] = v  # type: ignore[assignment]
    ts = changes.get("ts_ns", sample.ts_ns)
    return dataclasses.replace(sample, metrics=metrics, ts_ns=ts)  # type: ignore[arg-type]


def test_bad_events_are_dead_lettered_and_good_ones_stored(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet(nodes=4, gpus_per_node=2, cluster=settings.cluster, seed=11)
    now_ms = time.time_ns() // 1_000_000
    rounds = [fleet.tick((now_ms - 10_000 + r * 1000) * 1_000_000) for r in range(3)]
    good = [b for r in rounds for b in r]
    template = good[0]
    s0 = template.samples[0]

    def one(sample: GpuSample) -> tuple[bytes, bytes]:
        batch = SampleBatch(sample.cluster, "bad-node", (sample,))
        return batch.kafka_key, encode_samples(batch)

    encoded_good = encode_samples(template)
    wrong_type = sample_rows(SampleBatch(s0.cluster, "bad-node", (s0,)))  # another producer's row-wise form
    wrong_type["samples"][0]["m"]["power_watts"] = "310 W"
    future_version = msgpack.unpackb(encoded_good)
    future_version["v"] = 99
    bad: list[tuple[tuple[bytes | None, bytes], str]] = [
        ((b"x", b"\x00\x01not msgpack at all"), "malformed"),
        ((b"x", encoded_good[: len(encoded_good) // 2]), "malformed"),
        ((b"x", msgpack.packb([1, 2, 3])), "malformed"),
        ((b"x", msgpack.packb(wrong_type)), "wrong_type"),
        ((template.kafka_key, msgpack.packb(future_version)), "unknown_schema_version"),
        (one(_with(s0, power_watts=float("nan"))), "nan"),
        (one(_with(s0, ts_ns=(now_ms + 86_400_000) * 1_000_000)), "future_timestamp"),
        (one(_with(s0, ts_ns=(now_ms - 400 * 86_400_000) * 1_000_000)), "ancient_timestamp"),
        (one(_with(s0, temperature_gpu_celsius=-5.0)), "negative"),
        (one(_with(s0, utilization_gpu_percent=250.0)), "out_of_range"),
        (one(_with(s0, power_watts=float("inf"))), "out_of_range"),
        (one(_with(s0, memory_used_bytes=s0.metrics["memory_total_bytes"] * 2)), "inconsistent"),
        (one(_with(s0, bogus_metric_celsius=1.0)), "unknown_field"),
    ]
    # one bad GPU inside an otherwise good node message: the other GPU must still be stored
    mixed = SampleBatch(
        settings.cluster,
        "mixed-node",
        (
            dataclasses.replace(s0, node="mixed-node", gpu_uuid="GPU-mixed-good"),
            dataclasses.replace(_with(s0, sm_clock_mhz=-1.0), node="mixed-node", gpu_uuid="GPU-mixed-bad"),
        ),
    )
    bad.append(((mixed.kafka_key, encode_samples(mixed)), "negative"))

    payloads = [(b.kafka_key, encode_samples(b)) for b in good[:4]]
    payloads += [p for p, _ in bad]
    payloads += [(b.kafka_key, encode_samples(b)) for b in good[4:]]

    with running_pipeline(settings, tmp_path) as (processor, sink):
        publish(settings, payloads)
        expected_good = sum(len(b.samples) for b in good) + 1
        wait_stored(sink, expected_good)
        letters = consume_all(settings, settings.topics.dead_letter, len(bad))
        assert processor.alive() and sink.alive()

    assert len(letters) == len(bad)
    by_value: dict[bytes, list[dict[str, str]]] = {}
    for letter in letters:
        by_value.setdefault(letter.value() or b"", []).append(headers_dict(letter.headers()))
    for (_key, value), reason in bad:
        headers = by_value[value].pop(0)
        assert headers["hermeneut-reason"].startswith(reason), (reason, headers)
        assert headers["hermeneut-detail"], headers
        assert headers["hermeneut-source"].startswith(settings.topics.raw)
    mixed_letter = [h for v, hs in by_value.items() for h in hs]
    assert not mixed_letter, f"unexpected extra dead letters: {mixed_letter}"

    rows = stored_points(settings)
    stored = {(r["gpu"], r["_time"]) for r in rows}
    assert len(rows) == expected_good
    assert {r["gpu"] for r in rows} == {s.gpu_uuid for b in good for s in b.samples} | {"GPU-mixed-good"}
    assert len(stored) == expected_good
