"""Two clusters, each with its own Kafka: a site's raw samples replicated into the central Kafka by MirrorMaker 2
(from the same Maven Central release as the broker), arrive unchanged, in order, with their cluster tag, and are
interpreted exactly as the site's own would be."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Message

from pipeline.codec import decode_samples
from pipeline.config import Settings
from pipeline.events import node_key
from pipeline.services import kafka, mirrormaker
from pipeline.topics import ensure_topics, topic_specs
from processors.app import interpreter_from
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet
from sinks.influxdb.lines import InfoTracker, batch_lines

from .conftest import KafkaServer
from .harness import publish_batches

pytestmark = pytest.mark.integration

SITE = "dc1"


@pytest.fixture
def site(defaults: Settings, tmp_path: Path) -> Iterator[kafka.KafkaProcess]:
    """The site's own broker (the session's broker plays the central one)."""
    proc = kafka.start(defaults.services.cache_dir, defaults.kafka.version, tmp_path / "site-kafka")
    yield proc
    proc.stop()


def _read_all(bootstrap: str, topic: str, expected: int, timeout_s: float) -> list[Message]:
    """Every record of ``topic`` from the beginning, once ``expected`` have arrived (or time ran out)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(out) < expected:
            if not consumer.assignment() and topic in consumer.list_topics(timeout=5).topics:
                consumer.subscribe([topic])
            out += [m for m in consumer.consume(500, 1.0) if m.error() is None]
    finally:
        consumer.close()
    return out


def _interpreted(messages: list[Message], fleet: Fleet, now_ns: int) -> list[str]:
    """What the processor and the sink make of these raw messages: the line protocol, per partition in order."""
    topologies = {t.kafka_key: t for t in fleet.topologies(now_ns)}
    interpreter = interpreter_from(Settings(), lambda _k: None, lambda c, n: topologies.get(node_key(c, n)),
                                   lambda: None)  # fmt: skip
    by_partition: dict[int, list[Message]] = defaultdict(list)
    for m in messages:
        by_partition[int(m.partition() or 0)].append(m)
    lines: list[str] = []
    tracker = InfoTracker()
    for part, msgs in sorted(by_partition.items()):
        raw = [RawMessage(m.key(), m.value() or b"", "t", part) for m in sorted(msgs, key=lambda m: m.offset() or 0)]
        for _, batch in process_raw(raw, now_ns, Settings().validation).forward:
            lines += batch_lines([interpreter.apply(batch, now_ns)[0]], tracker)
    return lines


def test_a_sites_samples_mirrored_centrally_are_interpreted_as_at_the_site(
    settings: Settings, kafka_server: KafkaServer, site: kafka.KafkaProcess, defaults: Settings, tmp_path: Path
) -> None:
    site_kafka = settings.kafka.model_copy(update={"bootstrap_servers": site.bootstrap_servers})
    site_settings = settings.model_copy(update={"cluster": SITE, "kafka": site_kafka})
    ensure_topics(site_settings.kafka.client_config(), topic_specs(site_settings))
    central = ("central", kafka_server.bootstrap_servers)
    config = mirrormaker.properties({SITE: site.bootstrap_servers}, central, re.escape(settings.topics.raw))
    mm2 = mirrormaker.start(defaults.services.cache_dir, defaults.kafka.version, tmp_path / "mm2", config)
    try:
        fleet = Fleet(nodes=3, gpus_per_node=4, cluster=SITE, seed=4)
        now_ms = time.time_ns() // 1_000_000
        batches = [b for r in range(20) for b in fleet.tick((now_ms - 30_000 + r * 1000) * 1_000_000)]
        publish_batches(site_settings, batches)
        direct = _read_all(site.bootstrap_servers, settings.topics.raw, len(batches), 60)
        mirrored = _read_all(kafka_server.bootstrap_servers, f"{SITE}.{settings.topics.raw}", len(batches), 180)
        assert mm2.alive(), mm2.log_path.read_text()[-2000:]
    finally:
        mm2.stop()
    assert len(direct) == len(mirrored) == len(batches)

    def per_partition(ms: list[Message]) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
        out: dict[int, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
        for m in sorted(ms, key=lambda m: (m.partition(), m.offset())):
            out[int(m.partition() or 0)].append((m.key(), m.value()))
        return out

    # the same records, in the same partitions, in the same order: keys (cluster/node) and the cluster tag kept
    assert per_partition(mirrored) == per_partition(direct)
    assert {decode_samples(m.value() or b"")[0].cluster for m in mirrored} == {SITE}
    now_ns = time.time_ns()
    lines = _interpreted(mirrored, fleet, now_ns)
    assert lines == _interpreted(direct, fleet, now_ns)
    assert sum(line.startswith(f"gpu,cluster={SITE},") for line in lines) == 20 * fleet.size
