"""Every record the pipeline writes fits the broker (issue 17), on the real Kafka, processor, sink and InfluxDB:
the largest node messages the simulator and the captures produce, in backlogs of 1, 100 and 2,000 messages (the
processor takes up to 500 at once, so its interpreted records must be split), on Kafka's default limits and on a
cluster with smaller ones; a catch-up from a backlog (bench/catchup.py runs the same at 1,000,000 samples); and a
dead letter the broker refuses, which must hold the source offset back and make the processor say it is stalled
instead of crashing and restarting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from bench.catchup import catch_up, verdict
from bench.collector import nvlink_node
from pipeline.codec import encode_samples
from pipeline.config import Settings
from pipeline.deadletter import headers_dict
from pipeline.events import SampleBatch
from pipeline.services.stages import wait_for
from producers.nvml import NvmlCollector
from producers.nvml.replay import ReplayNvml
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan

from .harness import consume_all, publish, running_pipeline, wait_stored

pytestmark = pytest.mark.integration


def set_limit(settings: Settings, topic: str, limit: int) -> None:
    """Set a topic's ``max.message.bytes`` on the broker (as an operator of a stricter cluster would)."""
    admin = AdminClient(settings.kafka.client_config())
    entry = ConfigEntry("max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)
    for future in admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=[entry])]
    ).values():
        future.result(30)


def largest_messages(settings: Settings, count: int) -> list[SampleBatch]:
    """``count`` node messages, alternately the largest the simulator makes (an HGX H100 node: 8 GPUs with 18
    NVLinks each, processes, 8 InfiniBand ports, faults raising XIDs) and the largest the captures make (eight
    real A10G captures behind 4 NVSwitches, 18 NVLinks each, through the NVML collector), recent timestamps."""
    fleet = Fleet(1, 8, cluster=settings.cluster, seed=31337, extras=True, faults=FaultPlan(rate_scale=200.0))
    fake = ReplayNvml(nvlink_node())
    collector = NvmlCollector(fake, settings.cluster, "capture-node")
    collector.open()
    start = time.time_ns() - count * 10**9
    out = []
    for r in range(count):
        ts = start + r * 10**9
        if r % 2 == 0:
            out.extend(fleet.tick(ts))
        else:
            samples, _ = collector.collect(ts)
            out.append(SampleBatch(settings.cluster, "capture-node", tuple(samples)))
    return out


@pytest.mark.parametrize(
    ("count", "limit"), [(1, None), (100, None), (2000, None), (2000, 262_144)], ids=["1", "100", "2000", "2000-256k"]
)
def test_the_largest_node_messages_in_backlogs_are_stored_whole(
    settings: Settings, tmp_path: Path, count: int, limit: int | None
) -> None:
    if limit is not None:  # a cluster stricter than Kafka's defaults: the processor reads this at start-up
        for topic in (settings.topics.interpreted, settings.topics.dead_letter):
            set_limit(settings, topic, limit)
    batches = largest_messages(settings, count)
    samples = sum(len(b.samples) for b in batches)
    publish(settings, [(b.kafka_key, encode_samples(b)) for b in batches])  # a backlog before the processor starts
    with running_pipeline(settings, tmp_path) as (processor, sink):
        wait_stored(sink, samples, timeout_s=300)
        stats = processor.stats()
        assert processor.alive() and sink.alive()
    assert stats["samples_ok"] == samples and stats["dead_lettered"] == 0 and stats["too_large"] == 0
    assert (stats["agent_starts"], stats["agent_crashes"], stats["stalls"]) == (1, 0, 0)
    if count == 2000:
        assert stats["messages_out"] > stats["batches"]  # takes of 500 messages went out in several records
    parts = consume_all(settings, settings.topics.interpreted, stats["messages_out"])
    assert len(parts) == stats["messages_out"]
    assert max(len(m.value() or b"") for m in parts) < (limit or 1_048_588)


def test_a_catch_up_from_a_backlog_stores_every_sample_without_a_restart(settings: Settings, tmp_path: Path) -> None:
    """bench/catchup.py at CI size: 16 x 8 GPUs with every extra, fast-forwarded before the processor starts."""
    result = catch_up(settings, tmp_path, samples=40_000, timeout_s=600)
    assert verdict(result) == [], result
    assert result["stored"] == result["published"]["samples"] >= 40_000


def _committed(settings: Settings, partition: int) -> int:
    consumer = Consumer(settings.kafka.client_config() | {"group.id": f"{settings.group_prefix}-processor"})
    try:
        (tp,) = consumer.committed([TopicPartition(settings.topics.raw, partition)], timeout=10)
        return int(tp.offset)
    finally:
        consumer.close()


def test_a_dead_letter_the_broker_refuses_holds_its_offset_and_the_processor_says_stalled(
    settings: Settings, tmp_path: Path
) -> None:
    """The dead-letter topic's limit is lowered under a running processor (it read 1 MB at start-up), so the broker
    refuses the next dead letter: the processor neither crashes nor commits past the bad message; its stats say
    stalled, with the record's size and source; once the limit is back, the letter goes out and all commits."""
    fleet = Fleet(1, 2, cluster=settings.cluster, seed=3)
    now = time.time_ns()
    good = [b for r in range(20) for b in fleet.tick(now - (30 - r) * 10**9)]
    bad = good[10]
    body = encode_samples(bad)[:-3]  # cut short: the whole message is dead-lettered (malformed)
    payloads = [(b.kafka_key, encode_samples(b)) for b in good[:10]] + [(bad.kafka_key, body)]
    payloads += [(b.kafka_key, encode_samples(b)) for b in good[11:]]
    with running_pipeline(settings, tmp_path) as (processor, sink):
        set_limit(settings, settings.topics.dead_letter, 200)
        publish(settings, payloads)
        assert wait_for(lambda: processor.stats().get("stalled"), 60), processor.stats()
        stalled = processor.stats()
        time.sleep(3)  # commits happen every second: none may pass the refused dead letter
        offsets = {i: _committed(settings, i) for i in range(3)}
        assert processor.alive() and stalled["agent_crashes"] == 0 and stalled["agent_starts"] == 1
        assert settings.topics.dead_letter in stalled["stalled_on"] and "bytes from" in stalled["stalled_on"]
        set_limit(settings, settings.topics.dead_letter, 1_048_588)
        wait_stored(sink, 2 * (len(good) - 1))
        assert wait_for(lambda: not processor.stats().get("stalled"), 60)
        final = processor.stats()
    raw_partition = _partition_of(settings, bad.kafka_key)  # one node: all its messages in one partition
    assert offsets[raw_partition] <= 10  # the bad message is offset 10 of its partition: not committed past it
    assert final["agent_crashes"] == 0 and final["stalls"] == 1 and final["dead_lettered"] == 1
    (letter,) = consume_all(settings, settings.topics.dead_letter, 1)
    assert headers_dict(letter.headers())["hermeneut-reason"] == "malformed" and letter.value() == body
    assert wait_for(lambda: _committed(settings, raw_partition) == len(good), 30)


def _partition_of(settings: Settings, key: bytes) -> int:
    return next(int(m.partition()) for m in consume_all(settings, settings.topics.raw, 20) if m.key() == key)
