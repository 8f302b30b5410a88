"""The node agent against the real broker: Kafka stops and comes back while it runs (long enough to fill the
producer's buffer), and every sample arrives exactly once; ``hermeneut collect`` scrapes a dcgm-exporter over
HTTP and drains on SIGTERM."""

from __future__ import annotations

import http.server
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermeneut.stages import start_stage
from pipeline.codec import decode_record, decode_samples
from pipeline.config import KafkaSettings, ServiceSettings, Settings, TopicSettings
from pipeline.publisher import Publisher
from pipeline.services.stages import wait_for
from pipeline.topics import ensure_topics, topic_specs
from pipeline.topology import NodeTopology
from producers.agent import NodeAgent
from producers.simulator import Fleet
from producers.simulator.source import SimulatorSource

from .conftest import KafkaServer
from .harness import consume_all

pytestmark = pytest.mark.integration

DCGM_SAMPLE = Path(__file__).resolve().parent.parent / "testdata" / "dcgm-exporter" / "a100-mig-node.txt"


@pytest.fixture
def kafka_settings(kafka_server: KafkaServer, defaults: Settings, tmp_path: Path) -> Settings:
    """Own topics on the shared broker; no InfluxDB (the producer side only)."""
    tag = uuid.uuid4().hex[:8]
    s = Settings(
        cluster=f"test-{tag}",
        group_prefix=f"test-{tag}",
        kafka=KafkaSettings(bootstrap_servers=kafka_server.bootstrap_servers, session_timeout_s=6.0),
        topics=TopicSettings.with_prefix(f"t{tag}", partitions=3),
        services=ServiceSettings(cache_dir=defaults.services.cache_dir, state_dir=tmp_path / "state"),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return s


def _samples(settings: Settings, messages: int) -> list[tuple[str, int]]:
    records = consume_all(settings, settings.topics.raw, messages, timeout_s=60)
    keys = []
    for record in records:
        batch, rejected = decode_samples(record.value())
        assert rejected == []
        keys += [(s.gpu_uuid, s.ts_ns) for s in batch.samples]
    return keys


def test_every_sample_arrives_once_across_a_kafka_restart(
    kafka_settings: Settings, kafka_server: KafkaServer, tmp_path: Path
) -> None:
    settings = kafka_settings
    fleet = Fleet(nodes=1, gpus_per_node=4, cluster=settings.cluster, seed=3)
    # as the agent's: never give up on a message; a buffer of 20 messages (2 s of rounds) so that it fills up
    # while the broker is away, and the agent has to wait for room
    publisher = Publisher(
        settings.kafka.client_config(),
        buffer_messages=20,
        delivery_timeout_ms=0,
        extra={"reconnect.backoff.max.ms": 1000},
    )
    source = SimulatorSource.of(fleet, samples_only=True)  # one simulated node, through the same path as NVML
    agent = NodeAgent(source, publisher, settings.topics, 0.1, stats_file=tmp_path / "agent.json")
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,))
    runner.start()
    try:
        assert wait_for(lambda: publisher.stats.delivered >= 10, 30), publisher.stats
        kafka_server.stop()
        # the agent keeps sampling into its buffer while the broker is away (messages beyond those delivered; the
        # broker's shutdown can take seconds under load, so the rounds during it count too), until it is full...
        kept_sampling = wait_for(lambda: agent.report.messages - publisher.stats.delivered >= 10, 60)
        filled = wait_for(lambda: publisher.stats.in_flight >= 20, 60)
        # ...and then waits for room instead of dropping rounds
        time.sleep(1.5)
        in_flight_while_down = publisher.stats.in_flight
        kafka_server.start()
        back_at = agent.report.messages
        assert wait_for(lambda: publisher.stats.delivered > back_at + 5, 60), publisher.stats
    finally:
        stop.set()
        runner.join(60)
    report = agent.report
    assert kept_sampling, "the agent stopped sampling while Kafka was down"
    assert filled and in_flight_while_down == 20, "the buffer did not fill while Kafka was down"
    assert report.skipped_rounds > 0 and publisher.stats.blocked_s > 1, "the full buffer did not hold the agent back"
    assert publisher.stats.failed == 0 and report.undelivered == 0 and report.unqueued_samples == 0
    assert publisher.stats.delivered == report.messages
    keys = _samples(settings, report.messages)
    assert len(keys) == report.samples == report.rounds * 4
    assert len(set(keys)) == len(keys), "a sample arrived twice"


@pytest.fixture
def exporter() -> Iterator[str]:
    """A real HTTP server answering /metrics with the dcgm-exporter sample, like the exporter on port 9400."""
    body = DCGM_SAMPLE.read_bytes()

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.end_headers()
            self.wfile.write(body if self.path == "/metrics" else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()


def test_collect_scrapes_a_dcgm_exporter_and_drains_on_sigterm(
    kafka_settings: Settings, exporter: str, tmp_path: Path
) -> None:
    settings = kafka_settings
    stage = start_stage("collect", settings, tmp_path, "--source", "dcgm-exporter", "--url", exporter,
                        "--interval", "0.2", "--node", "ignored-hostname-label-wins")  # fmt: skip
    try:
        assert wait_for(lambda: stage.stats().get("delivered", 0) >= 10, 60), stage.log.read_text()[-2000:]
    finally:
        stage.proc.send_signal(signal.SIGTERM)
        code = stage.proc.wait(60)
    assert code == 0, stage.log.read_text()[-2000:]
    stats = stage.stats()
    assert stats["published"] == stats["delivered"] == stats["messages"] + stats["topologies"]
    assert stats["topologies"] == 1 and stats["failed"] == 0 and stats["undelivered"] == 0
    assert stats["unmapped_series"] == 5 * stats["rounds"]
    keys = _samples(settings, stats["messages"])
    assert len(keys) == len(set(keys)) == 3 * stats["messages"]
    (topology_record,) = consume_all(settings, settings.topics.topology, 1, timeout_s=30)
    topology = decode_record(NodeTopology, topology_record.value())
    assert topology.node == "ub20-a100-k8s" and len(topology.gpus) == 3
    assert topology_record.key() == b"%s/ub20-a100-k8s" % settings.cluster.encode()
