"""The node agent: every interval, read a :class:`~producers.source.Source` and publish what it read.

Emits, per round, one message per node on the raw topic (``encode_samples`` of the node's SampleBatch, keyed
``cluster/node``), the node's :class:`NodeTopology` on the topology topic when the agent starts and whenever it
changes (checked every ``topology_interval_s`` and after a MIG reconfiguration), and a dead-letter record for
anything the source answered that cannot be read.

Reliability, through the one :class:`~pipeline.publisher.Publisher` (idempotent, ``acks=all``):

- *Broker down or restarting*: messages wait in the producer's bounded buffer and are retried by librdkafka
  until the broker is back; idempotence means a retried message is stored once. Nothing queued is given up
  while the agent runs (with the default ``delivery_timeout_s`` of 0, i.e. never).
- *Buffer full* (the broker stayed away longer than the buffer lasts): queuing blocks, the agent stops
  sampling until there is room, and counts the rounds it could not take (``skipped_rounds``): the gap is in
  the data, visibly, rather than silently dropped samples.
- *SIGTERM*: the agent finishes the round, stops, flushes for up to ``shutdown_grace_s`` and reports what could
  not be delivered (``undelivered``; with the broker away that long, those are lost and counted).
- *A source that fails*: transient failures (``SourceUnavailable``) skip that round and are counted; bad data
  (``BadSourceData``) is dead-lettered with its reason.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.codec import CONTENT_TYPE, encode_record, encode_samples
from pipeline.config import TopicSettings
from pipeline.deadletter import dead_letter
from pipeline.errors import BadSourceData, SourceUnavailable
from pipeline.events import EventKind, NodeTopology, SampleBatch
from pipeline.publisher import Headers, Publisher
from pipeline.stats import write_stats
from producers.source import Source

log = logging.getLogger(__name__)

STAGE = "collector"
_HEADERS: Headers = [("content-type", CONTENT_TYPE)]
#: how long one attempt to queue waits for room before the agent checks for a stop request
_QUEUE_WAIT_S = 0.5


@dataclass
class AgentReport:
    rounds: int = 0
    samples: int = 0
    events: int = 0
    nics: int = 0
    messages: int = 0
    #: rounds that took longer than the interval (slow source, or waiting for buffer room)
    late_rounds: int = 0
    #: sampling slots that passed without a round because the previous one was still busy
    skipped_rounds: int = 0
    source_errors: int = 0
    dead_lettered: int = 0
    topologies: int = 0
    #: samples read but never queued, because a stop came while the buffer was full
    unqueued_samples: int = 0
    #: messages still undelivered when the agent gave up flushing at shutdown
    undelivered: int = 0
    collect_s: float = 0.0


def _same_topology(a: NodeTopology | None, b: NodeTopology) -> bool:
    return a is not None and dataclasses.replace(a, ts_ns=0) == dataclasses.replace(b, ts_ns=0)


class NodeAgent:
    """Runs a source against a publisher; :meth:`run` until ``stop`` is set or ``duration_s`` passed."""

    def __init__(
        self,
        source: Source,
        publisher: Publisher,
        topics: TopicSettings,
        interval_s: float,
        *,
        topology_interval_s: float = 60.0,
        shutdown_grace_s: float = 30.0,
        stats_file: Path | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.source, self.publisher, self.topics = source, publisher, topics
        self.interval_s = interval_s
        self.topology_interval_s = topology_interval_s
        self.shutdown_grace_s = shutdown_grace_s
        self.stats_file = stats_file
        self.clock = clock
        self.report = AgentReport()
        self._topology: NodeTopology | None = None
        self._source_failing = False

    def _send(self, stop: threading.Event, topic: str, key: bytes | None, value: bytes, headers: Headers) -> bool:
        while not self.publisher.publish(topic, key, value, headers, timeout_s=_QUEUE_WAIT_S):
            if stop.is_set():
                return False
        return True

    def _read(self, ts_ns: int, stop: threading.Event) -> list[SampleBatch]:
        started = time.perf_counter()
        try:
            batches = self.source.collect(ts_ns)
        except SourceUnavailable as exc:
            self.report.source_errors += 1
            if not self._source_failing:
                log.error("%s: nothing read (%s); retrying every round", self.source.name, exc)
            self._source_failing = True
            return []
        except BadSourceData as exc:
            letter = dead_letter(None, exc.payload, exc.reason, exc.detail, STAGE, exc.origin)
            if self._send(stop, self.topics.dead_letter, letter.key, letter.value, letter.headers):
                self.report.dead_lettered += 1
            log.error("%s: unreadable answer dead-lettered (%s)", self.source.name, exc)
            return []
        finally:
            self.report.collect_s += time.perf_counter() - started
        if self._source_failing:
            log.info("%s: reading again", self.source.name)
            self._source_failing = False
        return batches

    def _publish_topology(self, ts_ns: int, stop: threading.Event) -> None:
        topology = self.source.topology(ts_ns)
        if topology is None or _same_topology(self._topology, topology):
            return
        if self._send(stop, self.topics.topology, topology.kafka_key, encode_record(topology), _HEADERS):
            self._topology = topology
            self.report.topologies += 1
            log.info("topology of %s/%s published (%d GPUs)", topology.cluster, topology.node, len(topology.gpus))

    def round(self, stop: threading.Event) -> bool:
        """One round: read, publish; returns whether the MIG layout changed (so the topology is checked now)."""
        ts_ns = self.clock()
        r = self.report
        changed = False
        for batch in self._read(ts_ns, stop):
            if not (batch.samples or batch.events or batch.nics):
                continue
            if not self._send(stop, self.topics.raw, batch.kafka_key, encode_samples(batch), _HEADERS):
                r.unqueued_samples += len(batch.samples)
                break
            r.messages += 1
            r.samples += len(batch.samples)
            r.events += len(batch.events)
            r.nics += len(batch.nics)
            changed |= any(e.kind is EventKind.MIG_CONFIG for e in batch.events)
        r.rounds += 1
        return changed

    def run(self, stop: threading.Event, duration_s: float | None = None) -> AgentReport:
        r = self.report
        log.info("agent: %s every %.3g s", self.source.name, self.interval_s)
        start = next_round = time.monotonic()
        next_topology = start
        while not stop.is_set() and (duration_s is None or time.monotonic() - start < duration_s):
            mig_changed = self.round(stop)
            if (mig_changed or time.monotonic() >= next_topology) and not stop.is_set():
                self._publish_topology(self.clock(), stop)
                next_topology = time.monotonic() + self.topology_interval_s
            next_round += self.interval_s
            now = time.monotonic()
            if now > next_round:
                r.late_rounds += 1
                r.skipped_rounds += int((now - next_round) // self.interval_s)
                next_round = now
            self.publisher.poll(0)
            self.write_stats()
            stop.wait(max(next_round - time.monotonic(), 0.0))
        r.undelivered = self.publisher.close(self.shutdown_grace_s)
        self.write_stats()
        log.info(
            "agent stopped: %d rounds, %d samples, %d late, %d skipped, %d undelivered",
            r.rounds,
            r.samples,
            r.late_rounds,
            r.skipped_rounds,
            r.undelivered,
        )
        return r

    def write_stats(self) -> None:
        s = self.publisher.stats
        values: dict[str, Any] = dataclasses.asdict(self.report) | self.source.stats()
        values |= {"published": s.published, "delivered": s.delivered, "failed": s.failed, "in_flight": s.in_flight}
        values["blocked_s"] = s.blocked_s
        write_stats(self.stats_file, values)
