"""The faust-streaming processor: raw samples -> validated, normalized, interpreted events (+ dead letters,
+ findings on the alerts topic).

Wiring only; the logic is :func:`processors.normalize.process_raw`, the stages of
:class:`processors.interpret.Interpreter` and the sizing of what they write (:class:`processors.writes.TakeWriter`).
The agent takes batches of events, so validation and interpretation run vectorized over many node messages at once.

Delivery is at-least-once, and a take's offsets commit only after everything it wrote was acknowledged. The
agent takes events *without* faust's automatic acks (``stream.noack_take``: ``take_events`` acks a take in a
``finally``, so a take whose agent raised or was cancelled would be acked, and committed, all the same); it sends
the take's records, waits for every delivery report, resends what failed (stall detection: ``stalled`` in the
stats, one log line with the record's size and source) and only then acks the take's events. faust commits only
consecutive acked offsets, after flushing its producer, so a crash or a stop replays rather than loses; the sink
is idempotent, so a replay is harmless. The agent never raises on data (:class:`~processors.writes.TakeWriter`
never raises), so it is not restarted in a loop: the stats count ``agent_starts`` and ``agent_crashes``.

Building the app connects to nothing: the interpreted topic's partition count, the size limits of the topics it
writes (:func:`pipeline.sizing.read_limits`) and the mirrors of the compacted topics the interpretation reads are
:class:`Connections`, opened when the worker starts (:func:`run_worker` runs them as a service ahead of the app, so
the mirrors are read to their end before the consumer joins its group).

Run it with ``hermeneut process``. Counters are logged every 10 s, written to ``--stats-file`` and exposed on
``/metrics`` with what the processor concluded (processors.metrics, processors.conclusions).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import faust
import mode
from confluent_kafka.admin import AdminClient
from faust.types import EventT
from prometheus_client import CollectorRegistry

from pipeline.codec import decode_record
from pipeline.config import Settings
from pipeline.errors import ServiceError
from pipeline.events import GpuContext, node_key
from pipeline.mirror import TopicMirror
from pipeline.sizing import read_limits
from pipeline.stats import Stall, write_stats
from pipeline.topics import wait_for_topics
from pipeline.topology import NodeTopology
from processors.baselines.score import AnomalyTracker, Judgement, Scorer
from processors.baselines.store import BaselineSet, BaselineStore, decode_baselines_record
from processors.detectors.stage import Detectors
from processors.enrich import ContextTimeline, Enricher, context_record
from processors.interpret import Interpreter
from processors.metrics import ProcessorMetrics, faust_lag, quiet_idle_streams
from processors.normalize import RawMessage, import_run_of
from processors.state import GpuSlots
from processors.writes import TakeResult, TakeWriter, Write

log = logging.getLogger(__name__)

BATCH_MAX = 500
BATCH_WITHIN_S = 0.05
#: the producer's own per-record limit: every record is sized to the cluster's limits (read at start-up) before it
#: is sent, so the client's limit must never be the one that binds (faust's default is 1,000,000 bytes)
CLIENT_MAX_REQUEST_BYTES = 64 * 2**20
#: the producer's compression and batch size, chosen by measurement (bench/kafka_clients.py, docs/performance.md):
#: zstd over 1 MiB batches holds an interpreted sample in 55 bytes instead of 749 and costs about half the CPU of
#: uncompressed 16 KiB batches (faust's default): the processor and the broker less, the sink's decompression a little
#: more; aiokafka's lz4 costs the producer 3x zstd's CPU
PRODUCER_COMPRESSION: Final = "zstd"
PRODUCER_BATCH_BYTES: Final = 2**20
PRODUCER_LINGER_MS: Final = 5
#: resending a write that failed: exponential backoff with jitter up to this
_RETRY_MAX_S = 10.0
#: how long a take waits for the context mirror to read what was published before the take was made
CONTEXT_WAIT_S = 5.0


@dataclass
class ProcessorStats:
    messages_in: int = 0
    samples_ok: int = 0
    dead_lettered: int = 0
    #: interpreted records written
    messages_out: int = 0
    findings: int = 0
    batches: int = 0
    #: rows (or extras, or findings) that alone did not fit their topic: dead-lettered ``too_large``
    too_large: int = 0
    #: messages dead-lettered because interpreting them raised (a bug, not bad data)
    processing_errors: int = 0
    #: times the agent started, and left by an exception (faust restarts it): 1 and 0 in a healthy run
    agent_starts: int = 0
    agent_crashes: int = 0
    #: the learned-baselines version the scorer uses (0: none yet, rows unscored)
    baselines_version: int = 0
    #: batches labelled before the context mirror had caught up (its wait timed out)
    context_waits_timed_out: int = 0
    assigned: bool = False
    stall: Stall = field(default_factory=lambda: Stall("processor"))

    def count(self, result: TakeResult) -> None:
        self.samples_ok += result.samples_ok
        self.dead_lettered += result.dead_lettered
        self.messages_out += result.interpreted
        self.findings += result.findings
        self.too_large += result.too_large
        self.processing_errors += result.processing_errors

    def write(self, path: Path | None) -> None:
        values = {k: v for k, v in asdict(self).items() if k != "stall"}
        write_stats(path, values | self.stall.values())


def faust_broker_credentials(settings: Settings) -> Any:
    """aiokafka's side of ``kafka.*`` (what :meth:`KafkaSettings.client_config` is for librdkafka): TLS with the
    CA and, for mTLS, the client's certificate; SASL (PLAIN, SCRAM-SHA-256/512) over TLS or not."""
    k = settings.kafka
    if k.security_protocol == "PLAINTEXT":
        return None
    ssl_context = None
    if k.security_protocol in ("SSL", "SASL_SSL"):
        import ssl

        ssl_context = ssl.create_default_context(cafile=str(k.ssl_cafile) if k.ssl_cafile else None)
        if k.ssl_certfile and k.ssl_keyfile:
            password = k.ssl_key_password.get_secret_value() if k.ssl_key_password else None
            ssl_context.load_cert_chain(str(k.ssl_certfile), str(k.ssl_keyfile), password)
    if k.security_protocol == "SSL":
        return faust.SSLCredentials(ssl_context)
    return faust.SASLCredentials(
        username=k.sasl_username,
        password=k.sasl_password.get_secret_value() if k.sasl_password else None,
        mechanism=k.sasl_mechanism,
        ssl_context=ssl_context,
    )


def partition_count(settings: Settings, topic: str) -> int:
    """The real partition count of an existing topic (it may differ from the settings)."""
    found, pending = wait_for_topics(AdminClient(settings.kafka.client_config()), [topic], timeout_s=10.0)
    info = found.get(topic)
    if pending or info is None or not info.partitions:
        raise ServiceError(f"topic {topic} does not exist: run `hermeneut topics` first")
    return len(info.partitions)


def build_interpreter(settings: Settings) -> tuple[Interpreter, TopicMirror[GpuContext]]:
    """The interpretation stages for these settings, in order (see processors.interpret), and the context mirror;
    the mirrors of the compacted topics they read are started here (and read to their end) and injected."""
    kafka = settings.kafka.client_config()
    timeline = ContextTimeline()
    contexts = TopicMirror(
        kafka, settings.topics.context, context_record, on_record=timeline.see, invalid_clears=True
    ).start()
    topologies = TopicMirror(kafka, settings.topics.topology, lambda v: decode_record(NodeTopology, v)).start()
    store = BaselineStore()
    baselines = TopicMirror(kafka, settings.topics.baselines, decode_baselines_record, store.on_change).start()
    for mirror in (contexts, topologies, baselines):
        if not mirror.wait_ready(60):
            log.warning("mirror of %s not read to its end within 60 s; continuing", mirror.topic)
    interpreter = interpreter_from(
        settings,
        contexts.get,
        lambda cluster, node: topologies.get(node_key(cluster, node)),
        store.current,
        timeline,
    )
    return interpreter, contexts


def interpreter_from(
    settings: Settings,
    context_of: Callable[[bytes], GpuContext | None],
    topology_of: Callable[[str, str], NodeTopology | None],
    baselines: Callable[[], BaselineSet | None],
    timeline: ContextTimeline | None = None,
) -> Interpreter:
    """The stages over injected state (mirrors in the processor, in-memory tables in bench/scoring.py), in
    order: enrichment, scoring against the learned baselines, domain detectors. They share one per-GPU slot table
    (processors.state), so a batch's GPUs are looked up once."""
    slots = GpuSlots(idle_s=settings.detectors.lane_idle_s or None)
    detectors = Detectors(settings.detectors, topology_of, slots)
    tracker = AnomalyTracker(
        after_s=settings.baselines.anomaly_after_s,
        clear_s=settings.baselines.anomaly_clear_s,
        slots=slots,
        explained=detectors.latest.explains,
    )
    return Interpreter(
        [
            Enricher(context_of, baselines, timeline, slots),
            Scorer(baselines, tracker, Judgement.of(settings.baselines)),
            detectors,
        ],
        topology_of,
    )


class Connections:
    """What the processor reads besides its input stream, opened once at worker start-up (:meth:`open`, which
    blocks until the mirrors are read to their end), never while the app is built."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._opened: TakeWriter | None = None
        self._contexts: TopicMirror[GpuContext] | None = None
        #: takes labelled without waiting for the whole context topic (the wait timed out): counted, logged once
        self.context_waits_timed_out = 0

    def open(self) -> None:
        """The interpreted topic's partition count, the size limits of the topics the processor writes, and the
        interpretation stages over the topics' mirrors."""
        with self._lock:
            if self._opened is None:
                s = self.settings
                out_partitions = partition_count(s, s.topics.interpreted)
                limits = read_limits(
                    s.kafka.client_config(), (s.topics.interpreted, s.topics.alerts, s.topics.dead_letter)
                )
                log.info("record budgets (bytes): %s", ", ".join(f"{t} {n}" for t, n in limits.topics.items()))
                interpreter, self._contexts = build_interpreter(s)
                self._opened = TakeWriter(s.topics, limits, s.validation_limits(), interpreter, out_partitions)

    def contexts_caught_up(self, timeout_s: float = CONTEXT_WAIT_S) -> None:
        """Wait until the context mirror holds every record published before now (before a take made now is
        labelled): a context published just ahead of its samples then applies to their first rows too."""
        if self._contexts is not None and not self._contexts.catch_up(timeout_s):
            if not self.context_waits_timed_out:
                log.warning("the context mirror did not catch up within %.0f s; labelling with what it has", timeout_s)
            self.context_waits_timed_out += 1

    async def ready(self) -> TakeWriter:
        """:meth:`open` (in a thread, so the event loop keeps serving) unless done; what turns takes into
        records."""
        if self._opened is None:
            await asyncio.get_running_loop().run_in_executor(None, self.open)
        assert self._opened is not None
        return self._opened

    @property
    def interpreter(self) -> Interpreter | None:
        """The interpreter once opened, else None."""
        return None if self._opened is None else self._opened.interpreter

    @property
    def writer(self) -> TakeWriter | None:
        return self._opened


class OpenAtStart(mode.Service):
    """A worker service that opens the :class:`Connections` before the app (and its consumer) starts."""

    def __init__(self, connections: Connections) -> None:
        super().__init__()
        self.connections = connections

    async def on_start(self) -> None:
        await self.connections.ready()


async def deliver_all(
    writes: list[Write], send: Callable[[Write], Awaitable[asyncio.Future[Any]]], stall: Stall
) -> None:
    """Send ``writes`` and wait until every one is acknowledged; resend what failed, with backoff, for as long as
    it takes (``stall`` says so after a few attempts, or while an acknowledgement is awaited past its time).
    ``send`` hands a write to the producer and returns the future of its acknowledgement."""
    pending, delay = writes, 0.2
    while pending:
        sent: list[tuple[Write, Any]] = []
        for w in pending:
            try:
                sent.append((w, await send(w)))
            except Exception as exc:  # refused before it left (e.g. by the client's own checks)
                sent.append((w, exc))
        futures = [f for _, f in sent if not isinstance(f, BaseException)]
        while futures:
            _, waiting = await asyncio.wait(futures, timeout=stall.after_s)
            if not waiting:
                break
            w = next(w for w, f in sent if f in waiting)
            stall.waiting(w.topic, len(w.value), w.source)
        failed = []
        for w, f in sent:
            error = f if isinstance(f, BaseException) else f.exception()
            if error is not None:
                failed.append(w)
                stall.failed(w.topic, len(w.value), w.source, f"{type(error).__name__}: {error}")
        if not failed:
            stall.ok()
            return
        # only what failed goes again: interpreted parts may then arrive out of order, which nothing after depends
        # on (every point carries its own timestamp); nothing is acked meanwhile
        pending = failed
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, _RETRY_MAX_S)


def _sender(topics: dict[str, Any]) -> Callable[[Write], Awaitable[asyncio.Future[Any]]]:
    """A write handed to its faust topic's producer."""

    async def send(w: Write) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = await topics[w.topic].send(
            key=w.key, value=w.value, headers=w.headers or None, partition=w.partition
        )
        return future

    return send


def _faust_app(settings: Settings) -> faust.App:
    """The faust application: its broker, state folder, serializers and the producer and consumer tuning."""
    assert settings.kafka.bootstrap_servers, "resolve local services before creating the app"
    datadir = settings.services.state_dir / "faust" / f"{settings.group_prefix}-processor"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    brokers = ";".join(f"kafka://{s.strip()}" for s in settings.kafka.bootstrap_servers.split(","))
    return faust.App(
        f"{settings.group_prefix}-processor",
        # faust keeps table state here; never in the working directory
        datadir=str(datadir),
        broker=brokers,
        broker_credentials=faust_broker_credentials(settings),
        value_serializer="raw",
        key_serializer="raw",
        topic_replication_factor=settings.topics.replication_factor,
        topic_partitions=settings.topics.partitions,
        table_standby_replicas=0,
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_compression_type=PRODUCER_COMPRESSION,
        producer_max_batch_size=PRODUCER_BATCH_BYTES,
        producer_linger_ms=PRODUCER_LINGER_MS,
        producer_max_request_size=CLIENT_MAX_REQUEST_BYTES,
        stream_buffer_maxsize=max(4096, BATCH_MAX * 2),
        broker_commit_every=BATCH_MAX,
        broker_commit_interval=1.0,
        broker_session_timeout=settings.kafka.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.kafka.session_timeout_s / 3),
    )


def _raw_messages(events: Sequence[EventT[bytes]]) -> list[RawMessage]:
    """The taken events as the interpreter reads them: key, value, where they came from, their import run."""
    return [
        RawMessage(
            e.message.key,
            e.message.value or b"",
            f"{e.message.topic}/{e.message.partition}/{e.message.offset}",
            e.message.partition,
            import_run_of(e.message.headers),
        )
        for e in events
    ]


def create_app(
    settings: Settings,
    stats_file: Path | None = None,
    connections: Connections | None = None,
    registry: CollectorRegistry | None = None,
) -> faust.App:
    """Build the faust app for resolved settings (Kafka bootstrap servers known); connects to nothing.

    ``connections`` are opened at worker start-up (:class:`OpenAtStart`), else when the agent first runs; the
    processor's metrics register on ``registry`` (processors.metrics)."""
    app = _faust_app(settings)
    raw = app.topic(settings.topics.raw, key_type=bytes, value_type=bytes, internal=False)
    t = settings.topics
    out = {name: app.topic(name, key_type=bytes, value_type=bytes) for name in (t.interpreted, t.dead_letter, t.alerts)}
    stats = ProcessorStats()
    metrics = ProcessorMetrics(registry, lambda: asdict(stats), settings.metrics.stale_after_s)
    connections = connections or Connections(settings)

    def observe(result: TakeResult) -> None:
        """What the take (or a tick) concluded, into the interpretation metrics, once it is delivered."""
        for batch in result.batches:
            metrics.conclusions.observe(batch)
        metrics.conclusions.findings(result.sent_findings)

    async def deliver(writes: list[Write]) -> None:
        await deliver_all(writes, _sender(out), stats.stall)

    @app.agent(raw, name="interpret")  # type: ignore[arg-type]  # noack_take is on Stream, not StreamT
    async def interpret(stream: faust.Stream[bytes]) -> None:
        stats.agent_starts += 1
        writer = await connections.ready()
        events: Sequence[EventT[bytes]]
        try:
            # noack_take yields the events themselves (its buffer holds them), typed as values upstream
            async for events in stream.noack_take(BATCH_MAX, within=BATCH_WITHIN_S):  # type: ignore[assignment]
                messages = _raw_messages(events)
                await asyncio.get_running_loop().run_in_executor(None, connections.contexts_caught_up)
                took_at = time.perf_counter()
                result = writer.take(messages, time.time_ns())
                await deliver(result.writes)
                observe(result)
                metrics.took(len(messages), result.letters, time.perf_counter() - took_at)
                # only now may these offsets commit: everything the take wrote is acknowledged
                for event in events:
                    await stream.ack(event)
                stats.messages_in += len(messages)
                stats.count(result)
                stats.batches += 1
                stats.write(stats_file)  # what is stored downstream is counted here already
        except asyncio.CancelledError:
            raise
        except Exception:
            stats.agent_crashes += 1
            log.exception("the interpret agent failed; faust restarts it, its take is not acked")
            raise

    @app.timer(interval=10.0)  # type: ignore[untyped-decorator]
    async def report() -> None:
        log.info(
            "processor: %d messages in, %d samples ok, %d dead-lettered, %d messages out",
            stats.messages_in,
            stats.samples_ok,
            stats.dead_lettered,
            stats.messages_out,
        )
        stats.write(stats_file)

    @app.timer(interval=1.0)  # type: ignore[untyped-decorator]
    async def snapshot() -> None:
        writer = connections.writer
        if writer is None:
            return  # not started yet
        result = TakeResult()
        writer.findings(writer.interpreter.tick(time.time_ns()), result)
        await deliver(result.writes)
        observe(result)
        stats.count(result)
        stats.baselines_version = next((s.version for s in writer.interpreter.stages if isinstance(s, Scorer)), 0)
        stats.context_waits_timed_out = connections.context_waits_timed_out
        stats.write(stats_file)
        if stats.assigned:
            metrics.lag.update(faust_lag(app.consumer, app.monitor))

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def on_assigned(_app: Any, *_args: Any, **_kwargs: Any) -> None:
        stats.assigned = True
        stats.write(stats_file)

    @app.on_before_shutdown.connect  # type: ignore[arg-type]
    async def final_stats(_app: Any, *_args: Any, **_kwargs: Any) -> None:
        stats.write(stats_file)

    return app


def run_worker(
    settings: Settings,
    stats_file: Path | None = None,
    loglevel: str = "warning",
    registry: CollectorRegistry | None = None,
) -> None:
    """Run the processor until SIGTERM/SIGINT (faust drains and commits on the way out)."""
    quiet_idle_streams()
    connections = Connections(settings)
    app = create_app(settings, stats_file, connections, registry)
    worker = faust.Worker(app, OpenAtStart(connections), loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
