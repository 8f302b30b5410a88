"""Helpers for integration tests: run the real stages as processes, publish, read back Kafka and InfluxDB."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Message

from hermeneut.stages import start_stage
from pipeline.codec import encode_samples
from pipeline.config import Settings
from pipeline.events import SampleBatch
from pipeline.publisher import Publisher
from pipeline.services.stages import Stage, wait_for
from producers.agent import NodeAgent
from producers.simulator import Fleet
from producers.simulator.source import SimulatorSource
from sinks.query.store import flux_rows


def publish(settings: Settings, payloads: list[tuple[bytes | None, bytes]]) -> None:
    """Publish raw payloads to the raw topic and wait until every one is acknowledged by the broker."""
    pub = Publisher(settings.kafka.client_config())
    for key, value in payloads:
        pub.publish(settings.topics.raw, key, value)
    assert pub.close(30) == 0
    assert pub.stats.delivered == len(payloads), pub.stats


def publish_batches(settings: Settings, batches: list[SampleBatch]) -> None:
    publish(settings, [(b.kafka_key, encode_samples(b)) for b in batches])


def _tail(stage: Stage) -> str:
    return f"--- {stage.name} log ---\n" + "\n".join(stage.log.read_text(errors="replace").splitlines()[-30:])


@contextmanager
def running_pipeline(settings: Settings, run_dir: Path) -> Iterator[tuple[Stage, Stage]]:
    """Processor and sink as real child processes; waits until both joined their groups; stops them after."""
    stages = (start_stage("process", settings, run_dir), start_stage("sink", settings, run_dir))
    try:
        ready = wait_for(lambda: all(s.stats().get("assigned") for s in stages), 90)
        assert ready, "stages did not get partitions:\n" + "\n".join(_tail(s) for s in stages)
        yield stages
    finally:
        for stage in stages:
            stage.stop()


@contextmanager
def simulating(settings: Settings, fleet: Fleet, history_s: float) -> Iterator[None]:
    """The fleet published to the raw topic by a node agent in a thread: ``history_s`` fast-forwarded, then live
    at 1 s until the block ends."""
    stop = threading.Event()
    agent = NodeAgent(SimulatorSource.of(fleet), Publisher(settings.kafka.client_config()), settings.topics, 1.0)
    sim = threading.Thread(target=agent.run, args=(stop,), kwargs={"fast_forward_s": history_s}, daemon=True)
    sim.start()
    try:
        yield
    finally:
        stop.set()
        sim.join(30)


def wait_stored(sink: Stage, expected: int, timeout_s: float = 90) -> dict[str, Any]:
    """Wait until the sink reports ``expected`` points written (it may not exceed it); returns its stats."""
    wait_for(lambda: sink.stats().get("points_written", 0) >= expected, timeout_s)
    time.sleep(0.5)  # anything extra would show up now
    stats = sink.stats()
    assert stats.get("points_written") == expected, f"{stats}\n{_tail(sink)}"
    return stats


def wait_settled(stage: Stage, stat: str, quiet_s: float = 3.0, timeout_s: float = 60) -> int:
    """Wait until the stage's counter ``stat`` stopped moving for ``quiet_s`` (say, every finding stored); its value."""
    seen = [-1]

    def settled() -> bool:
        now = int(stage.stats().get(stat, 0))
        done, seen[0] = now == seen[0], now
        return done

    assert wait_for(settled, timeout_s, interval_s=quiet_s), stage.stats()
    return seen[0]


def stored_points(settings: Settings, measurement: str = "gpu") -> list[dict[str, Any]]:
    """Every point of this test's cluster, one dict per (GPU, time) with all its fields."""
    [rows] = flux_rows(
        settings,
        f'from(bucket: "{settings.influxdb.bucket}") |> range(start: 0) '
        f'|> filter(fn: (r) => r._measurement == "{measurement}" and r.cluster == "{settings.cluster}") '
        '|> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value") '
        "|> group()",
    )
    return rows


def consume_all(settings: Settings, topic: str, expected: int, timeout_s: float = 60) -> list[Message]:
    """Read ``topic`` from the beginning until ``expected`` records arrived (or time ran out)."""
    consumer = Consumer(
        settings.kafka.client_config()
        | {"group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and len(out) < expected:
            out.extend(m for m in consumer.consume(500, timeout=0.5) if m.error() is None)
        out.extend(m for m in consumer.consume(500, timeout=1.0) if m.error() is None)  # nothing more expected
    finally:
        consumer.close()
    return out
