"""The node agent: the one loop that drives any :class:`~producers.source.Source` (NVML, dcgm-exporter, the
simulator) and publishes what it read.

Emits, per round, one message per node on the raw topic (``encode_samples`` of the node's SampleBatch, keyed
``cluster/node``, every sample stamped with the round's interval as ``sample_interval_seconds``), the round's
workload-context and ground-truth records (from sources that know them) on their topics, each node's
:class:`NodeTopology` on the topology topic when the agent starts and whenever it changes (checked every
``topology_interval_s`` and after a MIG reconfiguration), and a dead-letter record for anything the source
answered that cannot be read.

Real time (a round every ``interval_s``) or, first, fast-forward (``run(fast_forward_s=...)``): rounds stamped
from that far in the past up to now, one ``interval_s`` apart, published as fast as Kafka takes them; then it
goes on in real time.

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
- *A record over its topic's size limit* (the publisher is sized to the cluster's limits, read at start-up): a
  node message is split (:func:`pipeline.sizing.fit`: its samples, events and NIC readings cut in proportion, so
  an 8-GPU NVSwitch node in an XID storm still goes out whole, in several messages); a sample, event or record that
  alone cannot fit is dead-lettered (``too_large``, bounded to the dead-letter topic, with its node and position)
  and counted (``too_large``), never retried forever.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from tqdm import tqdm

from pipeline.codec import CONTENT_TYPE, encode_record, encode_samples
from pipeline.config import TopicSettings
from pipeline.deadletter import DeadLetter, bounded, dead_letter
from pipeline.errors import BadSourceData, SourceUnavailable
from pipeline.events import EventKind, FaultRecord, GpuContext, SampleBatch
from pipeline.metrics import DURATION_BUCKETS, PUBLISHER_FIELDS, Field, StatsView, counter, dead_letters
from pipeline.publisher import Headers, Publisher
from pipeline.sizing import Cut, Limits, fit
from pipeline.stats import write_stats
from pipeline.topology import NodeTopology
from producers.source import INTERVAL_FIELD, Record, Source

if TYPE_CHECKING:  # the readers (and the Slurm and Kubernetes modules) load where one is configured: cli/collect.py
    from producers.context.nodestate import NodeState

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
    #: items (samples, events, NIC readings, records) that alone exceed their topic's limit: dead-lettered
    too_large: int = 0
    #: node messages that went out in several parts because whole they exceeded the raw topic's limit
    split_messages: int = 0
    topologies: int = 0
    #: workload-context and ground-truth records published (sources that know them: the simulator)
    contexts: int = 0
    ground_truth: int = 0
    #: rounds published in fast-forward (part of ``rounds``)
    fast_forward_rounds: int = 0
    #: samples read but never queued, because a stop came while the buffer was full
    unqueued_samples: int = 0
    #: messages still undelivered when the agent gave up flushing at shutdown
    undelivered: int = 0
    collect_s: float = 0.0


#: the report's counters as ``/metrics`` shows them (the stats file has the same numbers under the keys)
AGENT_FIELDS: tuple[Field, ...] = (
    counter("rounds", "hermeneut_collector_rounds_total", "Sampling rounds taken."),
    counter("samples", "hermeneut_collector_samples_total", "GPU samples queued for Kafka."),
    counter("events", "hermeneut_collector_gpu_events_total", "GPU events (XID, ECC, GPU lost, ...) queued."),
    counter("nics", "hermeneut_collector_nic_readings_total", "NIC port readings queued."),
    counter("messages", "hermeneut_collector_messages_total", "Node messages queued on the raw topic."),
    counter("late_rounds", "hermeneut_collector_late_rounds_total", "Rounds that took longer than the interval."),
    counter("skipped_rounds", "hermeneut_collector_skipped_rounds_total", "Sampling slots missed: still busy."),
    counter("source_errors", "hermeneut_collector_source_errors_total", "Rounds the source could not be read."),
    counter("topologies", "hermeneut_collector_topologies_total", "Node topologies published (new or changed)."),
    counter("contexts", "hermeneut_collector_contexts_total", "Workload-context records from the source."),
    counter("ground_truth", "hermeneut_collector_ground_truth_total", "Ground-truth fault records (simulator)."),
    counter("unqueued_samples", "hermeneut_collector_unqueued_samples_total", "Samples read, never queued."),
    counter("collect_s", "hermeneut_collector_read_seconds_total", "Seconds spent reading the source."),
    *PUBLISHER_FIELDS,
)


def source_fields(source: Source) -> tuple[Field, ...]:
    """The source's own counters (``Source.stats``: NVML errors, unsupported readings, ...) as
    ``hermeneut_collector_<counter>_total``."""
    return tuple(
        counter(key, f"hermeneut_collector_{key}_total", f"{source.name} source: {key.replace('_', ' ')}.")
        for key in source.stats()
    )


def _same_topology(a: NodeTopology | None, b: NodeTopology) -> bool:
    return a is not None and dataclasses.replace(a, ts_ns=0) == dataclasses.replace(b, ts_ns=0)


def _empty(batch: SampleBatch) -> bool:
    return not (batch.samples or batch.events or batch.nics)


def stamp_interval(batch: SampleBatch, interval_s: float) -> None:
    """Each sample says how long it stands for (the round's interval), unless its source knows better: GPU-hours
    and idle time are counted per series from it, never from a setting the reader has to guess. The metrics dicts
    are this round's own, fresh from the source."""
    for sample in batch.samples:
        sample.metrics.setdefault(INTERVAL_FIELD, interval_s)


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
        registry: CollectorRegistry | None = None,
        rack: str = "",
        switch: str = "",
        node_state: NodeState | None = None,
    ) -> None:
        self.source, self.publisher, self.topics = source, publisher, topics
        #: where this node sits (the operator's config), put on every topology the source leaves without one
        self.rack, self.switch = rack, switch
        #: whether the node's scheduler holds it out of service (checked with the topology), and its last answer
        self.node_state, self._maintenance = node_state, ""
        self._node_state_failing = False
        self.interval_s = interval_s
        self.topology_interval_s = topology_interval_s
        self.shutdown_grace_s = shutdown_grace_s
        self.stats_file = stats_file
        self.clock = clock
        self.report = AgentReport()
        self._topologies: dict[bytes, NodeTopology] = {}
        self._source_failing = False
        self._dead_letters = dead_letters(registry)
        self._read_seconds = Histogram(
            "hermeneut_collector_round_read_seconds",
            "Seconds one round's read took.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        if registry is not None:
            registry.register(StatsView(self.values, AGENT_FIELDS + source_fields(source)))

    def _send(self, stop: threading.Event, topic: str, key: bytes | None, value: bytes, headers: Headers) -> bool:
        while not self.publisher.publish(topic, key, value, headers, timeout_s=_QUEUE_WAIT_S):
            if stop.is_set():
                return False
        return True

    def _read(self, ts_ns: int, stop: threading.Event) -> Sequence[Record]:
        started = time.perf_counter()
        try:
            records = self.source.collect(ts_ns)
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
                self._dead_letters.labels(exc.reason).inc()
            log.error("%s: unreadable answer dead-lettered (%s)", self.source.name, exc)
            return []
        finally:
            took = time.perf_counter() - started
            self.report.collect_s += took
            self._read_seconds.observe(took)
        if self._source_failing:
            log.info("%s: reading again", self.source.name)
            self._source_failing = False
        return records

    def _maintenance_now(self) -> str:
        """Why the node's scheduler holds it out of service now ("": in service); its last answer while it cannot
        tell (said once when that starts and once when it ends)."""
        if self.node_state is None:
            return ""
        try:
            now = self.node_state.maintenance()
        except SourceUnavailable as exc:
            if not self._node_state_failing:
                log.warning("%s node state unknown (%s); keeping the last answer", self.node_state.name, exc)
            self._node_state_failing = True
            return self._maintenance
        if self._node_state_failing:
            log.info("%s node state read again", self.node_state.name)
        if now and now != self._maintenance:
            log.info("node out of service: %s", now)
        elif self._maintenance and not now:
            log.info("node back in service")
        self._node_state_failing, self._maintenance = False, now
        return now

    def _publish_topologies(self, ts_ns: int, stop: threading.Event) -> None:
        """Each node's topology, where it is new or changed since the agent last published it."""
        maintenance = self._maintenance_now()
        for found in self.source.topologies(ts_ns):
            topology = dataclasses.replace(
                found,
                rack=found.rack or self.rack,
                switch=found.switch or self.switch,
                maintenance=found.maintenance or maintenance,
            )
            key = topology.kafka_key
            if _same_topology(self._topologies.get(key), topology):
                continue
            if not self._send(stop, self.topics.topology, key, encode_record(topology), _HEADERS):
                return
            self._topologies[key] = topology
            self.report.topologies += 1
            log.info("topology of %s/%s published (%d GPUs)", topology.cluster, topology.node, len(topology.gpus))

    def _route(self, record: Record) -> list[tuple[str, bytes | None, bytes]]:
        """The records (topic, key, value) a record is published as: one, or a node message's parts."""
        limits = self.publisher.limits or Limits()
        if isinstance(record, SampleBatch):
            payload = encode_samples(record)
            budget = limits.value_budget(self.topics.raw, record.kafka_key, _HEADERS)
            if len(payload) <= budget:
                return [(self.topics.raw, record.kafka_key, payload)]
            return [(self.topics.raw, record.kafka_key, part) for part in self._split(record, budget)]
        topic = self.topics.context if isinstance(record, GpuContext) else self.topics.ground_truth
        value = encode_record(record)
        if limits.fits(topic, record.kafka_key, value, _HEADERS):
            return [(topic, record.kafka_key, value)]
        self._too_large(
            [
                dead_letter(
                    record.kafka_key,
                    value,
                    "too_large",
                    f"{type(record).__name__} over the {topic} budget",
                    STAGE,
                    f"{self.source.name}/{topic}",
                )
            ]
        )
        return []

    def _split(self, batch: SampleBatch, budget: int) -> list[bytes]:
        """A node message too large for the raw topic as several, each list cut in proportion; what cannot fit
        alone is dead-lettered."""

        def encode(cut: Cut) -> bytes:
            samples, events, nics = cut
            return encode_samples(
                SampleBatch(batch.cluster, batch.node, batch.samples[samples], batch.events[events], batch.nics[nics])
            )

        fitted = fit((len(batch.samples), len(batch.events), len(batch.nics)), encode, budget)
        self.report.split_messages += 1
        if fitted.too_large:
            whole = encode_samples(batch)
            parts = ("sample", "event", "nic")
            letters = []
            for which, item in fitted.too_large:
                listed = (batch.samples, batch.events, batch.nics)[which][item]
                uuid = getattr(listed, "gpu_uuid", None)
                letters.append(
                    dead_letter(
                        batch.kafka_key,
                        whole,
                        "too_large",
                        f"one {parts[which]} alone is over the {self.topics.raw} budget of {budget} bytes",
                        STAGE,
                        f"{self.source.name}/{batch.cluster}/{batch.node}",
                        uuid,
                        item,
                        parts[which],
                    )
                )
            self._too_large(letters)
        return fitted.parts

    def _too_large(self, letters: list[DeadLetter]) -> None:
        limits = self.publisher.limits or Limits()
        for letter in bounded(letters, limits.limit(self.topics.dead_letter)):
            self.publisher.publish(self.topics.dead_letter, letter.key, letter.value, letter.headers)
        self.report.too_large += len(letters)
        self.report.dead_lettered += len(letters)
        log.error("%s: %d items too large for their topic, dead-lettered", self.source.name, len(letters))

    def round(self, stop: threading.Event, ts_ns: int | None = None) -> bool:
        """One round stamped ``ts_ns`` (default: now): read, publish; returns whether the MIG layout changed (so
        the topology is checked now)."""
        ts_ns = self.clock() if ts_ns is None else ts_ns
        r = self.report
        changed = False
        for record in self._read(ts_ns, stop):
            if isinstance(record, SampleBatch):
                if _empty(record):
                    continue
                stamp_interval(record, self.interval_s)
            routed = self._route(record)
            if not routed:
                continue  # dead-lettered: too large for its topic
            if not all(self._send(stop, *out, _HEADERS) for out in routed):
                r.unqueued_samples += len(record.samples) if isinstance(record, SampleBatch) else 0
                break
            if isinstance(record, SampleBatch):
                r.messages += len(routed)
                r.samples += len(record.samples)
                r.events += len(record.events)
                r.nics += len(record.nics)
                changed |= any(e.kind is EventKind.MIG_CONFIG for e in record.events)
            elif isinstance(record, FaultRecord):
                r.ground_truth += 1
            else:
                r.contexts += 1
        r.rounds += 1
        return changed

    def fast_forward(self, stop: threading.Event, history_s: float, progress: bool = False) -> None:
        """Rounds from ``history_s`` ago up to now, ``interval_s`` apart, as fast as Kafka takes them."""
        r = self.report
        step = int(self.interval_s * 1e9)
        ts = self.clock() - int(history_s * 1e9)
        self._publish_topologies(ts, stop)
        last_stats = time.monotonic()
        with tqdm(
            total=round(history_s / self.interval_s),
            desc="fast-forward (rounds)",
            unit="",
            disable=not progress,
            dynamic_ncols=True,
            mininterval=0.5,
        ) as bar:
            while ts <= self.clock() and not stop.is_set():
                if self.round(stop, ts):
                    self._publish_topologies(ts, stop)
                r.fast_forward_rounds += 1
                self.publisher.poll(0)
                bar.update(1)
                ts += step
                if time.monotonic() - last_stats >= 1.0:
                    self.write_stats()
                    last_stats = time.monotonic()
        log.info("agent: fast-forwarded %d rounds (%d samples)", r.fast_forward_rounds, r.samples)

    def run(
        self,
        stop: threading.Event,
        duration_s: float | None = None,
        *,
        fast_forward_s: float = 0.0,
        progress: bool = False,
    ) -> AgentReport:
        """Publish rounds until ``stop`` is set or ``duration_s`` of real time passed (after ``fast_forward_s``
        of history, if any); then flush and close the publisher."""
        r = self.report
        log.info("agent: %s every %.3g s", self.source.name, self.interval_s)
        if fast_forward_s > 0:
            self.fast_forward(stop, fast_forward_s, progress)
        else:
            self._publish_topologies(self.clock(), stop)
        start = next_round = time.monotonic()
        next_topology = start  # checked after the first round too: some sources know their nodes only then
        while not stop.is_set() and (duration_s is None or time.monotonic() - start < duration_s):
            mig_changed = self.round(stop)
            if (mig_changed or time.monotonic() >= next_topology) and not stop.is_set():
                self._publish_topologies(self.clock(), stop)
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
            "agent stopped: %d rounds, %d samples, %d contexts, %d faults, %d late, %d skipped, %d undelivered",
            r.rounds,
            r.samples,
            r.contexts,
            r.ground_truth,
            r.late_rounds,
            r.skipped_rounds,
            r.undelivered,
        )
        return r

    def values(self) -> dict[str, Any]:
        """The agent's counters, as the stats file and ``/metrics`` (:data:`AGENT_FIELDS`) show them."""
        s = self.publisher.stats
        values: dict[str, Any] = dataclasses.asdict(self.report) | self.source.stats()
        values |= {"published": s.published, "delivered": s.delivered, "failed": s.failed, "in_flight": s.in_flight}
        values["blocked_s"] = s.blocked_s
        return values

    def write_stats(self) -> None:
        write_stats(self.stats_file, self.values())
