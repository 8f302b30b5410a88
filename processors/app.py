"""The faust-streaming processor: raw samples -> validated, normalized, interpreted events (+ dead letters,
+ findings on the alerts topic).

Wiring only; the logic is :func:`processors.normalize.process_raw` and the stages of
:class:`processors.interpret.Interpreter`. The agent takes batches of events (``stream.take_events``), so
validation and interpretation run vectorized over many node messages at once. Delivery is at-least-once: faust
acks a batch after the agent returns from it and flushes its producer before it commits offsets, so a crash
replays rather than loses; the sink is idempotent, so a replay is harmless.

Building the app connects to nothing: the interpreted topic's partition count and the mirrors of the compacted
topics the interpretation reads are :class:`Connections`, opened when the worker starts (:func:`run_worker` runs
them as a service ahead of the app, so the mirrors are read to their end before the consumer joins its group).

Run it with ``hermeneut process``. Counters are logged every 10 s, written to ``--stats-file`` and exposed on
``/metrics`` with what the processor concluded (processors.metrics, processors.conclusions).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import faust
import mode
from confluent_kafka.admin import AdminClient
from faust.types import EventT
from prometheus_client import CollectorRegistry

from pipeline.codec import decode_record, encode_interpreted, encode_record
from pipeline.config import Settings
from pipeline.errors import ServiceError
from pipeline.events import Finding, GpuContext, InterpretedBatch, NodeTopology, node_key
from pipeline.mirror import TopicMirror
from pipeline.stats import write_stats
from processors.baselines.score import AnomalyTracker, Judgement, Scorer
from processors.baselines.store import BaselineSet, BaselineStore, decode_baselines_record
from processors.detectors.stage import Detectors
from processors.enrich import ContextTimeline, Enricher
from processors.interpret import Interpreter
from processors.metrics import ProcessorMetrics, faust_lag, quiet_idle_streams
from processors.normalize import RawMessage, process_raw
from processors.state import GpuSlots

log = logging.getLogger(__name__)

BATCH_MAX = 500
BATCH_WITHIN_S = 0.05
#: under Kafka's default max.message.bytes / max.request.size of 1 MB, with room for headers
MAX_MESSAGE_BYTES = 900_000


@dataclass
class ProcessorStats:
    messages_in: int = 0
    samples_ok: int = 0
    dead_lettered: int = 0
    messages_out: int = 0
    findings: int = 0
    batches: int = 0
    #: the learned-baselines version the scorer uses (0: none yet, rows unscored)
    baselines_version: int = 0
    assigned: bool = False

    def write(self, path: Path | None) -> None:
        write_stats(path, asdict(self))


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
    meta = AdminClient(settings.kafka.client_config()).list_topics(topic, timeout=30)
    info = meta.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        raise ServiceError(f"topic {topic} does not exist: run `hermeneut topics` first")
    return len(info.partitions)


def encoded_parts(batch: InterpretedBatch) -> list[bytes]:
    """The batch encoded in as few messages as fit Kafka's default 1 MB message limit, rows kept in order.

    A fast-forward replay puts hundreds of one node's rounds into one take; encoded whole they exceed the limit.
    """
    payload = encode_interpreted(batch)
    if len(payload) <= MAX_MESSAGE_BYTES or len(batch) < 2:
        return [payload]
    half = len(batch) // 2
    # the node-level extras (events, NIC readings) go with the first part
    return encoded_parts(batch.take(slice(0, half))) + encoded_parts(batch.take(slice(half, None), extras=False))


def build_interpreter(settings: Settings) -> Interpreter:
    """The interpretation stages for these settings, in order (see processors.interpret); the mirrors of the
    compacted topics they read are started here (and read to their end) and injected."""
    kafka = settings.kafka.client_config()
    timeline = ContextTimeline()
    contexts = TopicMirror(kafka, settings.topics.context, lambda v: decode_record(GpuContext, v), timeline.see).start()
    topologies = TopicMirror(kafka, settings.topics.topology, lambda v: decode_record(NodeTopology, v)).start()
    store = BaselineStore()
    baselines = TopicMirror(kafka, settings.topics.baselines, decode_baselines_record, store.on_change).start()
    for mirror in (contexts, topologies, baselines):
        if not mirror.wait_ready(60):
            log.warning("mirror of %s not read to its end within 60 s; continuing", mirror.topic)
    return interpreter_from(
        settings,
        contexts.get,
        lambda cluster, node: topologies.get(node_key(cluster, node)),
        store.current,
        timeline,
    )


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
    slots = GpuSlots()
    tracker = AnomalyTracker(
        after_s=settings.baselines.anomaly_after_s, clear_s=settings.baselines.anomaly_clear_s, slots=slots
    )
    return Interpreter(
        [
            Enricher(context_of, baselines, timeline, slots),
            Scorer(baselines, tracker, Judgement.of(settings.baselines)),
            Detectors(settings.detectors, topology_of, slots),
        ]
    )


class Connections:
    """What the processor reads besides its input stream, opened once at worker start-up (:meth:`open`, which
    blocks until the mirrors are read to their end), never while the app is built."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._opened: tuple[int, Interpreter] | None = None

    def open(self) -> None:
        """The interpreted topic's partition count, and the interpretation stages over the topics' mirrors."""
        with self._lock:
            if self._opened is None:
                out_partitions = partition_count(self.settings, self.settings.topics.interpreted)
                self._opened = out_partitions, build_interpreter(self.settings)

    async def ready(self) -> tuple[int, Interpreter]:
        """:meth:`open` (in a thread, so the event loop keeps serving) unless done; the partition count and
        the interpreter."""
        if self._opened is None:
            await asyncio.get_running_loop().run_in_executor(None, self.open)
        assert self._opened is not None
        return self._opened

    @property
    def interpreter(self) -> Interpreter | None:
        """The interpreter once opened, else None."""
        return None if self._opened is None else self._opened[1]


class OpenAtStart(mode.Service):
    """A worker service that opens the :class:`Connections` before the app (and its consumer) starts."""

    def __init__(self, connections: Connections) -> None:
        super().__init__()
        self.connections = connections

    async def on_start(self) -> None:
        await self.connections.ready()


def create_app(
    settings: Settings,
    stats_file: Path | None = None,
    connections: Connections | None = None,
    registry: CollectorRegistry | None = None,
) -> faust.App:
    """Build the faust app for resolved settings (Kafka bootstrap servers known); connects to nothing.

    ``connections`` are opened at worker start-up (:class:`OpenAtStart`), else when the agent first runs; the
    processor's metrics register on ``registry`` (processors.metrics)."""
    assert settings.kafka.bootstrap_servers, "resolve local services before creating the app"
    datadir = settings.services.state_dir / "faust" / f"{settings.group_prefix}-processor"
    datadir.parent.mkdir(parents=True, exist_ok=True)
    brokers = ";".join(f"kafka://{s.strip()}" for s in settings.kafka.bootstrap_servers.split(","))
    app = faust.App(
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
        # the interpreted topic carries float64 columns, which barely compress; aiokafka's lz4 costs CPU per byte
        producer_compression_type=None,
        producer_linger_ms=5,
        stream_buffer_maxsize=max(4096, BATCH_MAX * 2),
        broker_commit_every=BATCH_MAX,
        broker_commit_interval=1.0,
        broker_session_timeout=settings.kafka.session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.kafka.session_timeout_s / 3),
    )
    raw = app.topic(settings.topics.raw, key_type=bytes, value_type=bytes, internal=False)
    interpreted = app.topic(settings.topics.interpreted, key_type=bytes, value_type=bytes)
    dead = app.topic(settings.topics.dead_letter, key_type=bytes, value_type=bytes)
    alerts = app.topic(settings.topics.alerts, key_type=bytes, value_type=bytes)
    limits = settings.validation
    stats = ProcessorStats()
    metrics = ProcessorMetrics(registry, lambda: asdict(stats), settings.metrics.stale_after_s)
    connections = connections or Connections(settings)

    async def publish_findings(findings: list[Finding]) -> None:
        for finding in findings:
            await alerts.send(key=finding.dedup_key.encode(), value=encode_record(finding))
        stats.findings += len(findings)
        metrics.conclusions.findings(findings)

    @app.agent(raw, name="interpret")  # type: ignore[arg-type]  # take_events is on Stream, not StreamT
    async def interpret(stream: faust.Stream[bytes]) -> None:
        out_partitions, interpreter = await connections.ready()
        events: Sequence[EventT[bytes]]
        async for events in stream.take_events(BATCH_MAX, within=BATCH_WITHIN_S):
            took_at = time.perf_counter()
            messages = [
                RawMessage(
                    e.message.key,
                    e.message.value or b"",
                    f"{e.message.topic}/{e.message.partition}/{e.message.offset}",
                    e.message.partition,
                )
                for e in events
            ]
            now_ns = time.time_ns()
            outcome = process_raw(messages, now_ns, limits)
            for partition, normalized in outcome.forward:
                batch, findings = interpreter.apply(normalized, now_ns)
                metrics.conclusions.observe(batch)
                # same partition number as the source: one GPU's events stay in order without a key
                for payload in encoded_parts(batch):
                    await interpreted.send(value=payload, partition=partition % out_partitions)
                await publish_findings(findings)
            for letter in outcome.dead:
                await dead.send(key=letter.key, value=letter.value, headers=letter.headers)
            stats.messages_in += len(messages)
            stats.samples_ok += outcome.samples_ok
            stats.dead_lettered += len(outcome.dead)
            stats.messages_out += len(outcome.forward)
            stats.batches += 1
            metrics.took(len(messages), outcome.dead, time.perf_counter() - took_at)

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
        interpreter = connections.interpreter
        if interpreter is None:
            return  # not started yet
        await publish_findings(interpreter.tick(time.time_ns()))
        stats.baselines_version = next((s.version for s in interpreter.stages if isinstance(s, Scorer)), 0)
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
