"""Publish a simulated fleet to Kafka: in real time (one round per sampling interval) or fast-forward.

Every round's node batches go to the raw topic (keyed ``cluster/node``). With :class:`Destinations` that name
them, the simulation also publishes every node's topology once at its start (topology topic, keyed by node), the
workload of every GPU on the first round and of each GPU whose job changes afterwards (context topic, keyed by GPU;
``GpuContext(workload=None)`` when a GPU frees up, so the record keeps the time it did), and each fault's
ground truth when it starts, with its planned end (ground-truth topic, keyed by node). ``withhold`` keeps chosen
context records off the topic (an evaluation measures workload classification on those GPUs); they are kept in
the report instead, as the truth to score against.

Fast-forward publishes a stretch of history ending now as fast as Kafka takes it (the publisher blocks when its
buffer is full), with sample timestamps in the recent past, and keeps going until it has caught up with the clock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from pipeline.codec import CONTENT_TYPE, encode_record, encode_samples
from pipeline.config import TopicSettings
from pipeline.events import GpuContext
from pipeline.publisher import Headers, Publisher
from pipeline.stats import write_stats
from producers.simulator.fleet import Fleet, SimRound

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Destinations:
    """Where a simulation publishes; None: that kind of record is not published."""

    raw: str
    context: str | None = None
    topology: str | None = None
    ground_truth: str | None = None

    @classmethod
    def of(cls, topics: TopicSettings) -> Destinations:
        return cls(topics.raw, topics.context, topics.topology, topics.ground_truth)


@dataclass
class SimulationReport:
    rounds: int = 0
    samples: int = 0
    messages: int = 0
    late_rounds: int = 0
    fast_forward_rounds: int = 0
    events: int = 0
    contexts: int = 0
    topologies: int = 0
    ground_truth: int = 0
    #: context records kept off the topic by ``withhold`` (the truth for the GPUs whose context was withheld)
    withheld: list[GpuContext] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if isinstance(v, int)}

    def write(self, path: Path | None, publisher: Publisher) -> None:
        s = publisher.stats
        write_stats(path, self.counts() | {"delivered": s.delivered, "failed": s.failed, "in_flight": s.in_flight})


class Publishes(Protocol):
    """What publishing a round needs of :class:`pipeline.publisher.Publisher`."""

    def publish(self, topic: str, key: bytes | None, value: bytes, headers: Headers | None = None) -> object: ...

    def poll(self, timeout_s: float = 0.0) -> None: ...


Withhold = Callable[[GpuContext], bool]
_HEADERS = [("content-type", CONTENT_TYPE)]


def publish_round(fleet: Fleet, publisher: Publishes, topic: str, ts_ns: int) -> int:
    """Sample every GPU once and publish one message per node; returns the number of samples."""
    report = SimulationReport()
    publish_sim_round(fleet.round(ts_ns), publisher, Destinations(topic), report)
    return report.samples


def publish_sim_round(
    sim: SimRound, publisher: Publishes, dest: Destinations, report: SimulationReport, withhold: Withhold | None = None
) -> None:
    """Publish one round: node batches (none that are empty), and the context and ground-truth records."""
    for batch in sim.batches:
        if batch.samples or batch.events or batch.nics:
            publisher.publish(dest.raw, batch.kafka_key, encode_samples(batch), _HEADERS)
            report.messages += 1
            report.samples += len(batch.samples)
            report.events += len(batch.events)
    if dest.context is not None:
        for ctx in sim.contexts:
            if withhold is not None and withhold(ctx):
                report.withheld.append(ctx)
            else:
                publisher.publish(dest.context, ctx.kafka_key, encode_record(ctx))
                report.contexts += 1
    if dest.ground_truth is not None:
        for record in sim.ground_truth:
            publisher.publish(dest.ground_truth, record.kafka_key, encode_record(record))
            report.ground_truth += 1
    report.rounds += 1


def publish_topologies(fleet: Fleet, publisher: Publishes, dest: Destinations, ts_ns: int) -> int:
    if dest.topology is None:
        return 0
    topologies = fleet.topologies(ts_ns)
    for topo in topologies:
        publisher.publish(dest.topology, topo.kafka_key, encode_record(topo))
    return len(topologies)


def fast_forward(
    fleet: Fleet,
    publisher: Publishes,
    dest: Destinations,
    history_s: float,
    interval_s: float,
    stop: threading.Event,
    report: SimulationReport | None = None,
    withhold: Withhold | None = None,
    progress: bool = True,
    clock: Callable[[], int] = time.time_ns,
) -> SimulationReport:
    """Publish ``history_s`` of rounds ending now as fast as Kafka takes them, then catch up with the clock."""
    report = report or SimulationReport()
    step = int(interval_s * 1e9)
    ts = clock() - int(history_s * 1e9)
    report.topologies += publish_topologies(fleet, publisher, dest, ts)
    with tqdm(total=round(history_s / interval_s), desc="fast-forward (rounds)", unit="", disable=not progress,
              dynamic_ncols=True, mininterval=0.5) as bar:  # fmt: skip
        while ts <= clock() and not stop.is_set():
            publish_sim_round(fleet.round(ts), publisher, dest, report, withhold)
            report.fast_forward_rounds += 1
            publisher.poll(0)
            bar.update(1)
            ts += step
    log.info("simulator: fast-forwarded %d rounds (%d samples)", report.fast_forward_rounds, report.samples)
    return report


def run_simulation(
    fleet: Fleet,
    publisher: Publisher,
    topic: str,
    interval_s: float,
    stop: threading.Event,
    duration_s: float | None = None,
    stats_file: Path | None = None,
    *,
    topics: TopicSettings | None = None,
    fast_forward_s: float = 0.0,
    withhold: Withhold | None = None,
    progress: bool = False,
) -> SimulationReport:
    """Publish rounds every ``interval_s`` until ``stop`` is set or ``duration_s`` passed; then flush.

    ``topics``: also publish topology, context and ground truth (else samples only, to ``topic``).
    ``fast_forward_s``: first publish that much history ending now, as fast as possible.
    """
    dest = Destinations(topic) if topics is None else Destinations.of(topics)
    report = SimulationReport()
    if fast_forward_s > 0:
        fast_forward(fleet, publisher, dest, fast_forward_s, interval_s, stop, report, withhold, progress)
    elif dest.topology is not None:
        report.topologies += publish_topologies(fleet, publisher, dest, time.time_ns())
    start = time.monotonic()
    next_round = start
    while not stop.is_set() and (duration_s is None or time.monotonic() - start < duration_s):
        publish_sim_round(fleet.round(time.time_ns()), publisher, dest, report, withhold)
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
    log.info(
        "simulator: %d rounds, %d samples, %d contexts, %d faults, %d late rounds",
        report.rounds, report.samples, report.contexts, report.ground_truth, report.late_rounds,
    )  # fmt: skip
    return report
