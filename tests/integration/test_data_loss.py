"""The data-loss inputs of issue 14 as regressions through the real pipeline (Kafka, processor, sink, InfluxDB),
each asserting counts: every good sample stored, every bad item dead-lettered with its reason, nothing else, and
the processor's agent never restarted.

- a sample with ``ts_ns >= 2**63`` in the middle of a burst of 300 messages (it used to overflow and lose the take);
- events whose ``kind`` is a map or a list among 1,200 messages (an unhashable kind used to raise TypeError);
- a message just under the raw topic's limit with one bad GPU (its dead letter, carrying the whole message, used to
  be too large to send: the agent crashed, the offset was committed, 3,553 good samples stored uncounted);
- a canonical field and its alias in one sample (``power_watts`` and ``power_milliwatts``): ``duplicate_field``,
  where the alias used to win silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgpack
import pytest

from pipeline.codec import encode_samples, sample_columns, sample_rows
from pipeline.config import Settings
from pipeline.deadletter import headers_dict
from pipeline.events import SampleBatch
from pipeline.publisher import Publisher
from pipeline.sizing import read_limits, record_size
from producers.simulator import Fleet

from .harness import consume_all, publish, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration


def _burst(settings: Settings, messages: int, gpus: int = 2, seed: int = 1) -> list[SampleBatch]:
    fleet = Fleet(messages // 10, gpus, cluster=settings.cluster, seed=seed)
    start = time.time_ns() - 20 * 10**9
    return [b for r in range(10) for b in fleet.tick(start + r * 10**9)][:messages]


def _broken(batch: SampleBatch, edit: object, form: Callable[[SampleBatch], dict[str, Any]] = sample_columns) -> bytes:
    body = form(batch)
    edit(body)  # type: ignore[operator]
    return msgpack.packb(body)


def _run(settings: Settings, tmp_path: Path, payloads: list[tuple[bytes, bytes]], stored: int, letters: int) -> tuple[
    dict[str, object], list[dict[str, str]]
]:  # fmt: skip
    with running_pipeline(settings, tmp_path) as (processor, sink):
        publish(settings, payloads)
        wait_stored(sink, stored, timeout_s=180)
        dead = consume_all(settings, settings.topics.dead_letter, letters)
        stats = processor.stats()
        assert processor.alive() and sink.alive()
    assert (stats["agent_starts"], stats["agent_crashes"]) == (1, 0)
    assert stats["samples_ok"] == stored and stats["dead_lettered"] == letters == len(dead)
    return stats, [headers_dict(m.headers()) for m in dead]


def test_a_timestamp_beyond_int64_in_a_burst_costs_only_its_sample(settings: Settings, tmp_path: Path) -> None:
    burst = _burst(settings, 300)

    def overflow(body: dict[str, object]) -> None:
        body["ts_ns"][1] = 2**63 + 5  # type: ignore[index]

    payloads = [(b.kafka_key, encode_samples(b)) for b in burst]
    payloads[150] = (burst[150].kafka_key, _broken(burst[150], overflow))
    _stats, letters = _run(settings, tmp_path, payloads, 300 * 2 - 1, 1)
    ((reason, gpu),) = [(h["hermeneut-reason"], h["hermeneut-gpu"]) for h in letters]
    assert (reason, gpu) == ("out_of_range", burst[150].samples[1].gpu_uuid)


def test_an_event_kind_that_is_a_map_or_a_list_costs_only_that_event(settings: Settings, tmp_path: Path) -> None:
    burst = _burst(settings, 1200)
    payloads = [(b.kafka_key, encode_samples(b)) for b in burst]
    for position, kind in ((300, {"xid": 79}), (900, ["xid"])):
        batch = burst[position]

        def with_event(body: dict[str, object], kind: object = kind, batch: SampleBatch = batch) -> None:
            sample = batch.samples[0]
            body["events"] = [[sample.gpu_uuid, 0, sample.ts_ns, kind, 79, ""]]

        payloads[position] = (batch.kafka_key, _broken(batch, with_event))
    _stats, letters = _run(settings, tmp_path, payloads, 1200 * 2, 2)
    assert sorted((h["hermeneut-reason"], h["hermeneut-part"]) for h in letters) == [("unknown_field", "event")] * 2


def test_a_message_just_under_the_limit_with_one_bad_gpu_is_accounted_for(settings: Settings, tmp_path: Path) -> None:
    """Thousands of GPU samples in one node message just under the raw topic's limit, one of them NaN: the dead
    letter is bounded (truncated, with the original's size and hash), the others are all stored and counted."""
    limits = read_limits(settings.kafka.client_config(), [settings.topics.raw, settings.topics.dead_letter])
    # as large as the broker takes (hermeneut's own producers keep a margin; another client, kcat say, need not)
    budget = limits.limit(settings.topics.raw) - record_size(b"c/big-node", 0) - 64
    fleet = Fleet(16, 64, cluster=settings.cluster, seed=4)
    pool = [s for b in fleet.tick(time.time_ns() - 5 * 10**9) for s in b.samples]
    many = [replace(pool[i % len(pool)], node="big-node", gpu_uuid=f"GPU-big-{i}", gpu_index=i) for i in range(8000)]

    def size(n: int) -> int:
        return len(encode_samples(SampleBatch(settings.cluster, "big-node", tuple(many[:n]))))

    low, high = 1, len(many)  # the most samples that fit: a message just under the limit
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if size(mid) <= budget else (low, mid - 1)
    samples = many[:low]
    bad = samples[len(samples) // 2]
    samples[len(samples) // 2] = replace(bad, metrics=bad.metrics | {"power_watts": float("nan")})
    batch = SampleBatch(settings.cluster, "big-node", tuple(samples))
    payload = encode_samples(batch)
    assert budget - 4000 < len(payload) <= budget < 2**20
    pub = Publisher(settings.kafka.client_config(), extra={"message.max.bytes": 2**21, "compression.type": "none"})
    pub.publish(settings.topics.raw, batch.kafka_key, payload)
    assert pub.close(30) == 0
    _stats, (letter,) = _run(settings, tmp_path, [], len(samples) - 1, 1)
    assert (letter["hermeneut-reason"], letter["hermeneut-gpu"]) == ("nan", bad.gpu_uuid)
    assert letter["hermeneut-payload"] == "truncated" and letter["hermeneut-size"] == str(len(payload))
    assert len(stored_points(settings)) == len(samples) - 1


def test_a_field_sent_twice_canonical_and_alias_is_a_duplicate_field_dead_letter(
    settings: Settings, tmp_path: Path
) -> None:
    (batch,) = _burst(settings, 10)[:1]

    def twice(body: dict[str, object]) -> None:
        metrics = body["samples"][0]["m"]  # type: ignore[index]
        metrics["power_watts"], metrics["power_milliwatts"] = 310.0, 650_000.0

    # a sample sent row-wise (any producer's form): the column-wise form names a field once for every sample
    _stats, (letter,) = _run(settings, tmp_path, [(batch.kafka_key, _broken(batch, twice, sample_rows))], 1, 1)
    assert (letter["hermeneut-reason"], letter["hermeneut-gpu"]) == ("duplicate_field", batch.samples[0].gpu_uuid)
    (row,) = stored_points(settings)
    assert row["gpu"] == batch.samples[1].gpu_uuid  # the other GPU of the message, stored as sent
