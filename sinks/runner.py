"""The generic sink runner: consume from Kafka, batch, hand each batch to a :class:`~sinks.base.Sink` plugin, and
commit the batch's offsets only after the sink's flush succeeded.

Two threads. The consumer thread consumes, has the sink prepare each message (:meth:`Sink.prepare`, pure), and
hands a due batch (as soon as it holds ``batch_size`` of the sink's units, or when ``flush_interval_s`` old) to
the writer thread; while the sink writes one batch the next one is being prepared. The writer adds and flushes
batches strictly in order and reports each back; the consumer thread then delivers that batch's dead letters and
commits its offsets, in the same order.

A transient failure (the destination down or overloaded) is flushed again with exponential backoff and jitter,
or after the wait a :class:`~pipeline.errors.SinkBackpressure` asks for, for as long as it takes; the hand-off
queue fills, the consumer pauses its partitions (still polling, so it keeps its group membership) and nothing is
committed, so nothing acknowledged is lost; a replay after a crash rewrites identical data. A message the sink
cannot prepare goes to the dead-letter topic and is counted; so does each item the sink refuses (a
:class:`~sinks.base.Refusal`, when prepared or when the destination refused it), alone: the rest of its message
and of its batch is stored and committed.

Dead letters are bounded (:func:`pipeline.deadletter.bounded`, sized to the dead-letter topic's limit) and must
be acknowledged by Kafka before their batch's offsets commit: a batch whose letters were not taken stays at the
head, uncommitted (later batches wait behind it, in order), and is tried again with backoff. **A dead letter is sent
once**: a commit may stay behind what was stored (the sink's marks: an open rollup minute), so a restart reads
messages again whose letters were sent; every commit's metadata says how far letters were sent (``lettered``:
:func:`commit_metadata`), and a message read again below it sends none (counted ``letters_not_resent``). Only
a crash between Kafka's acknowledgement of a batch's letters and its commit sends them twice. A write that keeps
failing (InfluxDB's, or the dead letters') makes the runner *stalled* in its stats (:class:`pipeline.stats.Stall`:
one log line with the batch's size and source offsets), never a crash or a restart.

Counters go to the ``--stats-file`` and, with the batch sizes, flush times, sample -> stored latency and consumer lag,
to ``/metrics`` (:data:`RUNNER_FIELDS`, and ``hermeneut_sink_<counter>_total`` for each counter of the sink plugin).
"""

from __future__ import annotations

import collections
import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from prometheus_client import CollectorRegistry, Gauge, Histogram

from pipeline.config import Settings
from pipeline.deadletter import DeadLetter, bounded, dead_letter
from pipeline.errors import DecodeError, PermanentWriteError, SinkBackpressure, TransientWriteError
from pipeline.metrics import (
    DURATION_BUCKETS,
    SIZE_BUCKETS,
    BulkHistogram,
    ConsumerLag,
    Field,
    StatsView,
    counter,
    dead_letters,
    gauge,
    librdkafka_lag,
)
from pipeline.publisher import Publisher
from pipeline.sizing import KAFKA_DEFAULT_LIMIT
from pipeline.stats import Stall, write_stats
from sinks.base import Position, Prepared, Refusal, Sink

log = logging.getLogger(__name__)

STAGE = "sink"
#: the whole run's sample -> stored latencies as counts in log-spaced bins, 1 ms to 11.6 days at 1% steps: the
#: quantiles are within 1% in constant memory. (Keeping the last 2,000,000 latencies, as this did, grew the sink
#: by 32 MiB over its first 33 minutes at 1,000 GPUs and sorted them every second: ``make soak``, README.)
_LATENCY_EDGES = np.geomspace(1e-3, 1e6, 2084)
_RECENT_NS = 30 * 10**9


T = TypeVar("T")

#: the runner's counters as ``/metrics`` shows them (the stats file has the same numbers under the keys)
RUNNER_FIELDS: tuple[Field, ...] = (
    counter("messages", "hermeneut_sink_messages_total", "Messages stored (or dead-lettered) and committed."),
    counter("batches", "hermeneut_sink_batches_total", "Batches stored and committed."),
    counter("write_retries", "hermeneut_sink_write_retries_total", "Flushes retried after a transient failure."),
    counter("commits", "hermeneut_sink_commits_total", "Offset commits."),
    counter(
        "letters_not_resent",
        "hermeneut_sink_letters_not_resent_total",
        "Dead letters of messages read again after a restart, sent by an earlier run and not sent again.",
    ),
    gauge("assigned", "hermeneut_sink_assigned", "1 once the consumer has joined its group."),
)
#: sample -> stored, seconds: a live sample takes a fraction of a second, a backfill or an outage much longer
LATENCY_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600)


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """How the runner batches and how long it keeps trying at shutdown."""

    #: a batch is due at this many of the sink's units (:attr:`Prepared.size`) ...
    batch_size: int = 5000
    #: ... or when its first message is this old
    flush_interval_s: float = 0.2
    #: after a stop request, how long an unreachable destination is retried before the runner gives up
    #: (uncommitted data stays in Kafka and is stored by the next run)
    shutdown_grace_s: float = 30.0
    dead_letter_topic: str = "hermeneut.deadletter"
    #: the dead-letter topic's size limit (read from the cluster at start-up): letters are bounded to it
    dead_letter_limit: int = KAFKA_DEFAULT_LIMIT

    @classmethod
    def of(cls, settings: Settings, dead_letter_limit: int = KAFKA_DEFAULT_LIMIT) -> RunnerConfig:
        """The InfluxDB sink's batching (``influxdb.batch_size``, ``flush_interval_s``, ``shutdown_grace_s``)."""
        i = settings.influxdb
        return cls(i.batch_size, i.flush_interval_s, i.shutdown_grace_s, settings.topics.dead_letter, dead_letter_limit)


def sink_consumer(settings: Settings, sink: str) -> Consumer:
    """The Kafka consumer of one sink's group (``<group_prefix>-sink-<sink>``), offsets committed by the runner."""
    return Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": f"{settings.group_prefix}-sink-{sink}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "max.poll.interval.ms": 600_000,
            "session.timeout.ms": int(settings.kafka.session_timeout_s * 1000),
            "fetch.wait.max.ms": 50,
        }
    )


@dataclass
class SinkStats:
    messages: int = 0
    batches: int = 0
    write_retries: int = 0
    dead_lettered: int = 0
    #: letters of messages read again that an earlier run had sent (not sent again)
    letters_not_resent: int = 0
    commits: int = 0
    assigned: bool = False
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    latency_max_s: float | None = None
    #: over the freshest data only: samples taken in the last 30 s of sample time seen (a backfill of history,
    #: stored in the same seconds, does not count: its samples are old on purpose)
    recent_latency_p50_s: float | None = None
    recent_latency_p99_s: float | None = None
    stall: Stall = field(default_factory=lambda: Stall("sink"))
    _counts: np.ndarray = field(default_factory=lambda: np.zeros(len(_LATENCY_EDGES) + 1, np.int64), repr=False)
    #: the latencies of the last 30 s of sample time (bounded by the rate, whatever the run's length)
    _recent: collections.deque[tuple[np.ndarray, np.ndarray]] = field(default_factory=collections.deque, repr=False)
    _newest_ns: int = 0

    def record_latency(self, ack_ns: int, ts_ns: np.ndarray) -> None:
        if not len(ts_ns):
            return
        lat = (ack_ns - ts_ns) / 1e9
        self._counts += np.bincount(np.searchsorted(_LATENCY_EDGES, lat), minlength=len(self._counts))
        self.latency_max_s = max(self.latency_max_s or 0.0, float(lat.max()))
        self._newest_ns = max(self._newest_ns, int(ts_ns.max()))
        self._recent.append((ts_ns, lat))
        while self._recent and int(self._recent[0][0].max()) < self._newest_ns - _RECENT_NS:
            self._recent.popleft()

    def summarize(self) -> None:
        if self._recent:
            self.latency_p50_s, self.latency_p99_s = latency_quantiles(self._counts, (0.5, 0.99))
            ts = np.concatenate([t for t, _ in self._recent])
            lat = np.concatenate([a for _, a in self._recent])
            recent = lat[ts >= self._newest_ns - _RECENT_NS]
            self.recent_latency_p50_s, self.recent_latency_p99_s = (float(x) for x in np.percentile(recent, [50, 99]))

    def write(self, path: Path | None, extra: dict[str, int] | None = None) -> None:
        if path is not None:
            self.summarize()
            # not asdict(): it deep-copies the private latency arrays on every write
            values = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
            values.pop("stall")
            write_stats(path, values | self.stall.values() | (extra or {}))


def latency_quantiles(counts: np.ndarray, qs: tuple[float, ...]) -> tuple[float, ...]:
    """Quantiles of latencies counted in the bins of :data:`_LATENCY_EDGES` (bin 0: under 1 ms, reported as 1 ms),
    each the geometric middle of its bin."""
    cum = np.cumsum(counts)
    out = []
    for q in qs:
        k = int(np.searchsorted(cum, q * cum[-1]))
        lo, hi = _LATENCY_EDGES[max(k - 1, 0)], _LATENCY_EDGES[min(k, len(_LATENCY_EDGES) - 1)]
        out.append(float(np.sqrt(lo * hi)))
    return tuple(out)


@dataclass
class _Job(Generic[T]):
    """One batch on its way to the sink and back."""

    messages: list[Message]
    prepared: list[Prepared[T]]
    letters: list[DeadLetter]
    #: the message of each prepared one (``prepared[i]`` came from ``sources[i]``)
    sources: list[Message] = field(default_factory=list)
    #: the sink's marks when the batch was handed over: commit no further (see Sink.marks)
    marks: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)
    ok: bool = False
    rejected: str | None = None
    #: what the destination refused item by item (the rest of the batch is stored)
    refused: list[Refusal] = field(default_factory=list)
    ack_ns: int = 0
    #: dead letters still to be acknowledged by Kafka (bounded, built once the writer reported)
    unsent: list[DeadLetter] | None = None
    retry_at: float = 0.0
    delay_s: float = 0.5


class SinkRunner(Generic[T]):
    """One sink worker: a Kafka consumer group member (:func:`sink_consumer`) feeding one sink plugin. Building
    it connects to nothing; :meth:`run` subscribes."""

    def __init__(
        self,
        sink: Sink[T],
        consumer: Consumer,
        dlq: Publisher,
        config: RunnerConfig | None = None,
        stats_file: Path | None = None,
        clock: Callable[[], int] = time.time_ns,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.sink = sink
        self.consumer = consumer
        self.dlq = dlq
        self.config = config or RunnerConfig()
        self.stats = SinkStats()
        self.stats_file = stats_file
        self.clock = clock
        self._todo: queue.Queue[_Job[T]] = queue.Queue(maxsize=1)
        self._done: queue.Queue[_Job[T]] = queue.Queue()
        #: the oldest finished batch, kept while its dead letters are not acknowledged (nothing commits past it)
        self._head: _Job[T] | None = None
        self._in_flight = 0
        self._abandoned = False
        self._job_size, self._job_source = 0, ""
        self._stop = threading.Event()
        self._closing = threading.Event()
        self._give_up_at: float | None = None
        self._reset_pending()
        #: per partition: the offset below which every message's dead letters were sent (by this run or an earlier)
        self._lettered: dict[tuple[str, int], int] = {}
        self._dead_letters = dead_letters(registry)
        self._batch_size = Histogram(
            "hermeneut_sink_batch_size",
            "The sink's units per batch (influxdb: samples).",
            buckets=SIZE_BUCKETS,
            registry=registry,
        )
        self._flush_seconds = Histogram(
            "hermeneut_sink_flush_seconds",
            "Seconds per flush attempt.",
            ["outcome"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self._latency = BulkHistogram(
            "hermeneut_sink_sample_stored_seconds",
            "Seconds from a sample's time to its batch being stored.",
            LATENCY_BUCKETS,
            registry,
        )
        self.lag = ConsumerLag(f"{sink.name} sink")
        #: when the writer took the batch it has not stored yet (None: it waits for one); a destination that hangs
        #: or fails holds it here while the consumer pauses, so this, not the lag, tells stuck from idle
        self._writing_since: float | None = None
        unstored = Gauge(
            "hermeneut_sink_oldest_unstored_seconds",
            "Seconds the batch being written has waited to be stored (0: none).",
            registry=registry,
        )
        unstored.set_function(self.unstored_s)
        stalled = Gauge(
            "hermeneut_sink_write_stalled",
            "1 while a batch has not been stored for the stall time "
            "(the destination is down, hung or refusing): stuck, not idle.",
            registry=registry,
        )
        stalled.set_function(lambda: float(self.unstored_s() >= self.lag.stall_after_s))
        if registry is not None:
            plugin = tuple(
                counter(key, f"hermeneut_sink_{key}_total", f"{sink.name} sink: {key.replace('_', ' ')}.")
                for key in sink.stats()
            )
            registry.register(StatsView(self.values, RUNNER_FIELDS + plugin))
            registry.register(self.lag)

    def _reset_pending(self) -> None:
        self._pending: list[Message] = []
        self._prepared: list[Prepared[T]] = []
        self._sources: list[Message] = []
        self._letters: list[DeadLetter] = []
        self._size = 0
        self._first_pending = 0.0

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """Each assigned partition resumes from its last commit (with the commit's metadata for the sink, and how
        far dead letters were sent)."""
        if partitions:
            for tp in consumer.committed(partitions, timeout=30):
                lettered, metadata = parse_metadata(tp.metadata)
                key = (str(tp.topic), int(tp.partition))
                if lettered is None:
                    self._lettered.pop(key, None)
                else:
                    self._lettered[key] = lettered
                self.sink.resume(*key, metadata)
        self.stats.assigned = True
        self.write_stats()

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        """Revoked partitions are read again from their last commit, by this runner or another: what was prepared
        from them but not handed over is dropped with the state the sink built from it, so that commits made
        from here on follow only what is read from here on. The sink's consumer rebalances eagerly (every
        partition is revoked, then assigned again), so that is everything pending; were some partitions kept,
        pending messages would stay (dropping theirs would let a later commit pass over them)."""
        revoked = {(str(tp.topic), int(tp.partition)) for tp in partitions}
        if {(str(m.topic()), int(m.partition() or 0)) for m in self._pending} <= revoked:
            self._reset_pending()
        for topic, partition in revoked:
            self.sink.forget(topic, partition)

    def write_stats(self) -> None:
        self.stats.write(self.stats_file, self.sink.stats())

    def values(self) -> dict[str, Any]:
        """The counters of the runner and its sink (no latency summary: that is the stats file's, on demand)."""
        s = self.stats
        runner = {"messages": s.messages, "batches": s.batches, "write_retries": s.write_retries}
        runner |= {"letters_not_resent": s.letters_not_resent}
        return runner | {"commits": s.commits, "assigned": s.assigned} | self.sink.stats()

    def run(self, stop: threading.Event) -> None:
        """Consume and store until ``stop`` is set; then drain what is pending (giving up after a grace)."""
        self._stop = stop
        self.consumer.subscribe(list(self.sink.topics), on_assign=self._on_assign, on_revoke=self._on_revoke)
        writer = threading.Thread(target=self._writer_loop, name=f"{self.sink.name}-writer", daemon=True)
        writer.start()
        cfg = self.config
        last_stats = time.monotonic()
        try:
            while not stop.is_set():
                for msg in self.consumer.consume(num_messages=1000, timeout=0.05):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("consume error: %s", err)
                        continue
                    self._add(msg)
                    if self._size >= cfg.batch_size:
                        # checked per message: one consume call may bring far more than a batch (hundreds of
                        # samples per message), and a batch that grows past its size makes requests that outlast
                        # their timeout and are resent whole
                        self._hand_off()
                if self._pending and time.monotonic() - self._first_pending >= cfg.flush_interval_s:
                    self._hand_off()
                self._complete()
                if time.monotonic() - last_stats >= 1.0:
                    self.write_stats()
                    self.lag.update(librdkafka_lag(self.consumer))
                    last_stats = time.monotonic()
            if self._pending:
                self._hand_off()
            self._closing.set()
            while self._in_flight and not self._past_grace(extra_s=5.0):
                self._complete(wait_s=0.1)
            if self._in_flight:
                log.error("exiting with %d batches unstored; they stay uncommitted in Kafka", self._in_flight)
        finally:
            self.consumer.close()
            self.dlq.close()
            self.write_stats()

    def _add(self, msg: Message) -> None:
        if not self._pending:
            self._first_pending = time.monotonic()
        self._pending.append(msg)
        try:
            at = Position(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
            prepared = self.sink.prepare(at.topic, msg.value() or b"", at)
        except DecodeError as exc:
            self._letters += self._letters_of(msg, [(exc.reason, exc.detail, None)])
            return
        self._prepared.append(prepared)
        self._sources.append(msg)
        self._size += prepared.size
        self._letters += self._letters_of(msg, [(r.reason, r.detail, r) for r in prepared.refused])

    def _hand_off(self) -> None:
        """Queue the pending batch for the writer, pausing consumption while the queue is full."""
        job = _Job(self._pending, self._prepared, self._letters, self._sources, self.sink.marks())
        self._reset_pending()
        paused = False
        while True:
            try:
                self._todo.put(job, timeout=0.1)
                break
            except queue.Full:
                if self._past_grace():
                    log.error("%d messages not stored at shutdown; they stay uncommitted in Kafka", len(job.messages))
                    return
                if not paused:
                    self.consumer.pause(self.consumer.assignment())
                    paused = True
                self.consumer.poll(0)  # keeps group membership alive while paused
                self._complete()
        if paused:
            self.consumer.resume(self.consumer.assignment())
        self._in_flight += 1

    def _past_grace(self, extra_s: float = 0.0) -> bool:
        """After a stop request, True once the shutdown grace (plus ``extra_s``) has run out."""
        if not self._stop.is_set():
            return False
        if self._give_up_at is None:
            self._give_up_at = time.monotonic() + self.config.shutdown_grace_s
        return time.monotonic() > self._give_up_at + extra_s

    def _writer_loop(self) -> None:
        while True:
            try:
                job = self._todo.get(timeout=0.1)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            self._writing_since = time.monotonic()
            try:
                self._job_size = sum(len(m.value() or b"") for m in job.messages)
                self._job_source = _offsets(job.messages)
                self.sink.add(job.prepared)
                job.ok = self._flush_with_retry(job)
            except PermanentWriteError as exc:
                job.ok, job.rejected = True, str(exc)
            finally:
                self._writing_since = None
            job.ack_ns = self.clock()
            self._done.put(job)
            if not job.ok:
                return  # gave up at shutdown: later batches must not be committed past this one

    def unstored_s(self) -> float:
        """Seconds the writer has held its current batch (0 while it waits for one)."""
        since = self._writing_since
        return 0.0 if since is None else time.monotonic() - since

    def _flush_with_retry(self, job: _Job[T]) -> bool:
        """Flush until it succeeds (True; what the sink refused item by item in ``job.refused``) or the shutdown
        grace ran out (False); PermanentWriteError passes."""
        delay, attempt, messages = 0.2, 0, len(job.messages)
        while True:
            started = time.perf_counter()
            try:
                job.refused += self.sink.flush() or ()
                self._flush_seconds.labels("ok").observe(time.perf_counter() - started)
                self.stats.stall.ok()
                return True
            except PermanentWriteError:
                self._flush_seconds.labels("rejected").observe(time.perf_counter() - started)
                raise
            except TransientWriteError as exc:
                self._flush_seconds.labels("retried").observe(time.perf_counter() - started)
                attempt += 1
                self.stats.write_retries += 1
                self.stats.stall.failed(self.sink.name, self._job_size, self._job_source, str(exc)[:200])
                if attempt == 1 or attempt % 10 == 0:
                    log.warning("%s flush failed (attempt %d), retrying: %s", self.sink.name, attempt, exc)
                if self._past_grace():
                    log.error("giving up on %d messages at shutdown; they stay uncommitted in Kafka", messages)
                    return False
                if isinstance(exc, SinkBackpressure):
                    self._pause(exc.retry_after_s)
                else:
                    self._pause(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 10.0)

    def _pause(self, seconds: float) -> None:
        """Sleep between flushes; wake early once a stop's grace has run out."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0 and not self._past_grace():
            time.sleep(min(left, 0.5))

    def _complete(self, wait_s: float = 0.0) -> None:
        """Dead-letter and commit every batch the writer finished, in order; a batch whose dead letters Kafka did
        not take stays at the head (nothing commits past it) and is tried again after a backoff."""
        while True:
            if self._head is None:
                try:
                    self._head = self._done.get(timeout=wait_s) if wait_s else self._done.get_nowait()
                except queue.Empty:
                    return
            job = self._head
            if not job.ok or self._abandoned:
                self._abandoned = True
            elif not self._dead_letter(job):
                return
            else:
                self._commit(job.messages, job.marks)
                self.stats.messages += len(job.messages)
                self.stats.batches += 1
            self._head = None
            self._in_flight -= 1

    def _dead_letter(self, job: _Job[T]) -> bool:
        """Deliver the batch's dead letters (once, bounded); False while Kafka has not taken them all."""
        if job.unsent is None:
            letters = list(job.letters)
            if job.rejected is not None:
                log.error("%s rejected a batch of %d messages: %s", self.sink.name, len(job.messages), job.rejected)
                reason = f"{self.sink.name}_rejected"
                letters = [x for m in job.messages for x in self._letters_of(m, [(reason, job.rejected, None)])]
            else:
                if job.refused:
                    first = job.refused[0]
                    log.warning(
                        "%s refused %d items of a batch of %d messages (stored the rest); first: %s: %s",
                        self.sink.name,
                        len(job.refused),
                        len(job.messages),
                        first.reason,
                        first.detail[:300],
                    )
                letters += [
                    x for r in job.refused for x in self._letters_of(job.sources[r.item], [(r.reason, r.detail, r)])
                ]
                stamps = [p.ts_ns for p in job.prepared if p.ts_ns is not None]
                if stamps:
                    ts_ns = np.concatenate(stamps)
                    self.stats.record_latency(job.ack_ns, ts_ns)
                    self._latency.observe((job.ack_ns - ts_ns) / 1e9)
                self._batch_size.observe(sum(p.size for p in job.prepared))
            self.stats.dead_lettered += len(letters)
            for letter in letters:
                self._dead_letters.labels(letter.reason).inc()
            job.unsent = bounded(letters, self.config.dead_letter_limit)
        if not job.unsent:
            return True
        if time.monotonic() < job.retry_at:
            return False
        topic = self.config.dead_letter_topic
        failed = self.dlq.deliver([(topic, x.key, x.value, x.headers) for x in job.unsent], timeout_s=10.0)
        if not failed:
            self.stats.stall.ok()
            job.unsent = []
            return True
        size = sum(len(job.unsent[i].value) for i in failed)
        self.stats.stall.failed(topic, size, _offsets(job.messages), f"{len(failed)} dead letters not acknowledged")
        job.unsent = [job.unsent[i] for i in failed]
        job.retry_at = time.monotonic() + job.delay_s * (0.5 + random.random())
        job.delay_s = min(job.delay_s * 2, 10.0)
        return False

    def _letters_of(self, msg: Message, items: list[tuple[str, str, Refusal | None]]) -> list[DeadLetter]:
        """The dead letters of ``msg``'s refused items; none when an earlier run sent them (module docstring)."""
        if not items:
            return []
        key = (str(msg.topic()), int(msg.partition() or 0))
        if int(msg.offset() or 0) < self._lettered.get(key, 0):
            self.stats.letters_not_resent += len(items)
            return []
        return [self._letter(msg, reason, detail, refusal) for reason, detail, refusal in items]

    def _letter(self, msg: Message, reason: str, detail: str, refusal: Refusal | None = None) -> DeadLetter:
        source = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        if refusal is None:
            return dead_letter(msg.key(), msg.value() or b"", reason, detail, STAGE, source)
        r = refusal
        return dead_letter(msg.key(), msg.value() or b"", reason, detail, STAGE, source, r.gpu, r.position, r.part)

    def _commit(self, messages: list[Message], marks: dict[tuple[str, int], tuple[int, str]]) -> None:
        offsets: dict[tuple[str, int], int] = {}
        for msg in messages:
            key = (str(msg.topic()), int(msg.partition() or 0))
            offsets[key] = max(offsets.get(key, -1), int(msg.offset() or 0))
        commits = []
        for (topic, partition), last in offsets.items():
            held, metadata = marks.get((topic, partition), (last + 1, ""))
            lettered = self._lettered[topic, partition] = max(last + 1, self._lettered.get((topic, partition), 0))
            commits.append(
                TopicPartition(topic, partition, min(last + 1, held), metadata=commit_metadata(lettered, metadata))
            )
        try:
            self.consumer.commit(offsets=commits, asynchronous=False)
            self.stats.commits += 1
        except Exception as exc:  # e.g. partitions revoked meanwhile: they will be re-read, and overwrite
            log.warning("offset commit failed (%s); those messages will be replayed idempotently", exc)


#: how a commit's metadata starts when it says how far dead letters were sent: ``lettered=<offset>;<the sink's>``
_LETTERED = "lettered="


def commit_metadata(lettered: int, sink: str) -> str:
    """A commit's metadata: the offset below which every message's dead letters were sent, then the sink's own."""
    return f"{_LETTERED}{lettered};{sink}"


def parse_metadata(metadata: str | None) -> tuple[int | None, str | None]:
    """(how far dead letters were sent, the sink's metadata) of a commit; a commit made before letters were marked
    (or by something else) is the sink's alone."""
    if metadata and metadata.startswith(_LETTERED):
        offset, sep, rest = metadata.removeprefix(_LETTERED).partition(";")
        if sep and offset.isdigit():
            return int(offset), rest
    return None, metadata


def _offsets(messages: list[Message]) -> str:
    """Where a batch came from, for a stall's log line: topic/partition/first-last per partition."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for m in messages:
        key, offset = (str(m.topic()), int(m.partition() or 0)), int(m.offset() or 0)
        low, high = spans.get(key, (offset, offset))
        spans[key] = (min(low, offset), max(high, offset))
    return ", ".join(f"{t}/{p}/{lo}-{hi}" for (t, p), (lo, hi) in sorted(spans.items()))
