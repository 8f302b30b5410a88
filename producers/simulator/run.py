"""Publish a simulated fleet to the raw topic in real time (one round per sampling interval)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.codec import CONTENT_TYPE, encode_samples
from pipeline.publisher import Publisher
from pipeline.stats import write_stats
from producers.simulator.fleet import Fleet

log = logging.getLogger(__name__)


@dataclass
class SimulationReport:
    rounds: int = 0
    samples: int = 0
    messages: int = 0
    late_rounds: int = 0

    def write(self, path: Path | None, publisher: Publisher) -> None:
        s = publisher.stats
        write_stats(path, self.__dict__ | {"delivered": s.delivered, "failed": s.failed, "in_flight": s.in_flight})


def publish_round(fleet: Fleet, publisher: Publisher, topic: str, ts_ns: int) -> int:
    """Sample every GPU once and publish one message per node; returns the number of samples."""
    headers = [("content-type", CONTENT_TYPE)]
    count = 0
    for batch in fleet.tick(ts_ns):
        publisher.publish(topic, batch.kafka_key, encode_samples(batch), headers)
        count += len(batch.samples)
    return count


def run_simulation(
    fleet: Fleet,
    publisher: Publisher,
    topic: str,
    interval_s: float,
    stop: threading.Event,
    duration_s: float | None = None,
    stats_file: Path | None = None,
) -> SimulationReport:
    """Publish rounds every ``interval_s`` until ``stop`` is set or ``duration_s`` passed; then flush."""
    report = SimulationReport()
    start = time.monotonic()
    next_round = start
    while not stop.is_set() and (duration_s is None or time.monotonic() - start < duration_s):
        report.samples += publish_round(fleet, publisher, topic, time.time_ns())
        report.messages += len(fleet.nodes)
        report.rounds += 1
        next_round += interval_s
        wait = next_round - time.monotonic()
        if wait < 0:
            report.late_rounds += 1
            next_round = time.monotonic()
        publisher.poll(0)
        stop.wait(max(wait, 0.0))
        report.write(stats_file, publisher)
    publisher.close()
    report.write(stats_file, publisher)
    log.info("simulator: %d rounds, %d samples, %d late rounds", report.rounds, report.samples, report.late_rounds)
    return report
