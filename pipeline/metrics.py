"""Prometheus self-metrics: one registry per stage process, served on ``/metrics``.

Every long-running stage (``collect``, ``context watch``, ``process``, ``sink``, ``alerts run``, ``web``) builds one
registry with :func:`stage_registry`, hands it to the stage, which registers what it counts, and the CLI serves it
with :func:`serve` on ``metrics.host`` and the stage's port (``metrics.<stage>_port``; docs/metrics.md lists every
metric). Names follow ``hermeneut_<thing>_<unit>[_total]``; what every consumer stage has in common carries one
name in all of them (``hermeneut_dead_letters_total{reason}``, ``hermeneut_consumer_lag_messages{topic,partition}``),
so one rule covers every stage and the scrape target tells them apart.

The stages keep counting in their stats dataclasses, which the ``--stats-file`` JSON (read by the main job, the
tests and the benchmarks) is written from. :class:`StatsView` exposes those same fields, read when Prometheus
scrapes: one counter, two views, so the file and ``/metrics`` cannot disagree. What a flat file cannot hold (labels,
histograms, per-partition lag) lives in ordinary metrics next to them; :class:`BulkHistogram` takes a whole numpy
array per call, for per-sample figures on hot paths.

The same port answers ``/healthz`` (:func:`health`): ``stuck`` (HTTP 503) while work waits and none moves (a
partition stalled, or the sink's writes failing past the stall time), else ``ok`` while there is work, ``idle``
when there is none. A stuck stage is never reported idle: a sink whose InfluxDB hangs holds its batches and pauses
its consumer, which alone would look like a consumer with nothing to read.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Final, Literal
from wsgiref.simple_server import make_server

import numpy as np
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
)
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler, make_wsgi_app
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

#: seconds; from 1 ms (a small batch) to 2 minutes (a sample stored after a long InfluxDB outage)
DURATION_BUCKETS: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
#: items per batch (messages, samples, points): powers of 4 up to the sink's largest batch
SIZE_BUCKETS: tuple[float, ...] = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)


def _version() -> str:
    try:
        return metadata.version("hermeneut")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def stage_registry(stage: str) -> CollectorRegistry:
    """A fresh registry for one stage process: the process' own CPU, memory and file descriptors
    (``process_*``), Python's GC and version, and ``hermeneut_build_info{stage,version}``. Two metrics of one name
    are refused when the second registers (``auto_describe``), not found later in a scrape."""
    registry = CollectorRegistry(auto_describe=True)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    info = Gauge(
        "hermeneut_build_info",
        "Always 1: which stage and version this process runs.",
        ["stage", "version"],
        registry=registry,
    )
    info.labels(stage, _version()).set(1)
    return registry


Kind = Literal["counter", "gauge"]


@dataclass(frozen=True, slots=True)
class Field:
    """One field of a stats object as a metric: ``key`` in the mapping the view reads, its metric ``name``, and
    ``labels`` when the value is itself a mapping (label value, or a tuple of them, -> number)."""

    key: str
    name: str
    help: str
    kind: Kind = "counter"
    labels: tuple[str, ...] = ()


def counter(key: str, name: str, help: str, *labels: str) -> Field:
    return Field(key, name, help, "counter", labels)


def gauge(key: str, name: str, help: str, *labels: str) -> Field:
    return Field(key, name, help, "gauge", labels)


#: the Publisher's counters (pipeline.publisher.PublisherStats), as every producing stage's stats carry them
PUBLISHER_FIELDS: tuple[Field, ...] = (
    counter("published", "hermeneut_producer_messages_queued_total", "Messages handed to the Kafka producer."),
    counter("delivered", "hermeneut_producer_messages_delivered_total", "Messages Kafka acknowledged."),
    counter("failed", "hermeneut_producer_messages_failed_total", "Messages Kafka refused, or that timed out."),
    gauge("in_flight", "hermeneut_producer_messages_in_flight", "Messages queued and not yet acknowledged."),
    counter("blocked_s", "hermeneut_producer_blocked_seconds_total", "Seconds spent waiting for room in the buffer."),
)


def dead_letters(registry: CollectorRegistry | None) -> Counter:
    """``hermeneut_dead_letters_total{reason}``: items a stage sent to the dead-letter topic (reasons: README's
    "Bad input"); the same name in every stage, whose stats file counts their sum."""
    return Counter(
        "hermeneut_dead_letters", "Items sent to the dead-letter topic, by reason.", ["reason"], registry=registry
    )


class StatsView:
    """Metrics read from a stats mapping when Prometheus scrapes (see the module docstring). ``read`` returns the
    stage's current counters; a key it lacks is left out of that scrape rather than shown as 0."""

    def __init__(self, read: Callable[[], Mapping[str, Any]], fields: Sequence[Field]) -> None:
        self.read, self.fields = read, tuple(fields)

    def collect(self) -> Iterable[Metric]:
        values = self.read()
        for f in self.fields:
            value = values.get(f.key)
            if value is None:
                continue
            family: CounterMetricFamily | GaugeMetricFamily
            if f.kind == "counter":
                family = CounterMetricFamily(f.name, f.help, labels=f.labels)
            else:
                family = GaugeMetricFamily(f.name, f.help, labels=f.labels)
            if f.labels:
                for key, number in sorted(value.items()):
                    family.add_metric([str(k) for k in (key if isinstance(key, tuple) else (key,))], float(number))
            else:
                family.add_metric([], float(value))
            yield family


class BulkHistogram:
    """A histogram that takes a whole array per :meth:`observe` (numpy bucketing, one lock per call), for figures
    with one value per sample where a Python call per value would cost more than the stage's own work."""

    def __init__(self, name: str, help: str, buckets: Sequence[float], registry: CollectorRegistry | None) -> None:
        self.name, self.help = name, help
        self._bounds = np.asarray(sorted(buckets), dtype=np.float64)
        self._counts = np.zeros(len(self._bounds) + 1, dtype=np.int64)  # the last is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def observe(self, values: np.ndarray | float) -> None:
        v = np.asarray(values, dtype=np.float64).ravel()
        v = v[~np.isnan(v)]
        if not len(v):
            return
        # bucket i counts values <= bound i (Prometheus' "le"): side="left" puts a value equal to a bound in it
        counts = np.bincount(np.searchsorted(self._bounds, v, side="left"), minlength=len(self._counts))
        with self._lock:
            self._counts += counts
            self._sum += float(v.sum())

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            cumulative, total = np.cumsum(self._counts).tolist(), self._sum
        # bounds written as prometheus_client's Histogram writes them ("1.0", not "1"): one le value per bound
        buckets = list(zip([*map(floatToGoString, self._bounds.tolist()), "+Inf"], cumulative, strict=True))
        yield HistogramMetricFamily(self.name, self.help, buckets=buckets, sum_value=total)


#: a partition as a consumer sees it
TopicPartition = tuple[str, int]


@dataclass
class _Progress:
    position: int
    since: float
    stalled: bool = False


@dataclass(eq=False)  # hashable by identity: a registry keeps its collectors in a dict
class ConsumerLag:
    """Per assigned partition: messages not yet read by this consumer (``hermeneut_consumer_lag_messages``) and
    whether it is stalled (``hermeneut_consumer_stalled``): messages waiting and none read for ``stall_after_s``.

    A partition with nothing waiting is idle, never stalled, however long it has been quiet. The stage's loop calls
    :meth:`update` with what it measured (:func:`librdkafka_lag` for confluent-kafka consumers); a stall is logged
    once as an error when it starts and once when it ends.
    """

    stage: str
    stall_after_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _lag: dict[TopicPartition, int] = field(default_factory=dict)
    _progress: dict[TopicPartition, _Progress] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def update(self, measured: Mapping[TopicPartition, tuple[int, int]]) -> None:
        """``measured``: per assigned partition (lag, position); partitions not in it are no longer assigned."""
        now = self.clock()
        progress = {tp: p for tp, p in self._progress.items() if tp in measured}
        for tp, (lag, position) in measured.items():
            p = progress.get(tp)
            if p is None or position != p.position or lag <= 0:
                if p is not None and p.stalled:
                    log.info("%s: %s/%d moves again (%d messages waiting)", self.stage, tp[0], tp[1], max(lag, 0))
                progress[tp] = _Progress(position, now)
            elif not p.stalled and now - p.since >= self.stall_after_s:
                p.stalled = True
                log.error(
                    "%s: %s/%d stalled: %d messages waiting, none read for %.0f s",
                    self.stage,
                    tp[0],
                    tp[1],
                    lag,
                    now - p.since,
                )
        with self._lock:
            self._lag = {tp: max(lag, 0) for tp, (lag, _) in measured.items()}
            self._progress = progress

    def stalled(self) -> list[TopicPartition]:
        with self._lock:
            return sorted(tp for tp, p in self._progress.items() if p.stalled)

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            lag = dict(self._lag)
            stalled = {tp: p.stalled for tp, p in self._progress.items()}
        lag_family = GaugeMetricFamily(
            "hermeneut_consumer_lag_messages",
            "Messages in the partition this consumer has not read yet.",
            labels=["topic", "partition"],
        )
        stall_family = GaugeMetricFamily(
            "hermeneut_consumer_stalled",
            "1 while messages wait in the partition and none was read for a while.",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted(lag.items()):
            lag_family.add_metric([topic, str(partition)], value)
            stall_family.add_metric([topic, str(partition)], float(stalled.get((topic, partition), False)))
        yield lag_family
        yield stall_family


def librdkafka_lag(consumer: Any) -> dict[TopicPartition, tuple[int, int]]:
    """(lag, position) of every partition assigned to a confluent-kafka consumer, from what it already knows (its
    position and the high watermark of its last fetch): no request to the broker. Partitions it has not fetched
    from yet are left out."""
    out: dict[TopicPartition, tuple[int, int]] = {}
    assigned = consumer.assignment()
    if not assigned:
        return out
    for tp in consumer.position(assigned):
        _low, high = consumer.get_watermark_offsets(tp, cached=True)
        if tp.offset < 0 or high < 0:  # OFFSET_INVALID: nothing read, or no fetch answered yet
            continue
        out[(str(tp.topic), int(tp.partition))] = (int(high) - int(tp.offset), int(tp.offset))
    return out


#: gauges that are 1 while something a stage must do waits and does not move; a stage with one at 1 is stuck
STALL_GAUGES: Final = ("hermeneut_consumer_stalled", "hermeneut_sink_write_stalled")
LAG_GAUGE: Final = "hermeneut_consumer_lag_messages"


def health(registry: CollectorRegistry) -> tuple[str, dict[str, Any]]:
    """``(status, details)`` of a stage from its own metrics: ``stuck`` when a stall gauge is 1 (each named in
    ``stuck``), else ``ok`` while messages wait to be read (``lag``), else ``idle``."""
    stuck: list[str] = []
    lag = 0.0
    for family in registry.restricted_registry([*STALL_GAUGES, LAG_GAUGE]).collect():
        for sample in family.samples:
            if family.name in STALL_GAUGES and sample.value:
                where = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                stuck.append(f"{family.name}{{{where}}}" if where else family.name)
            elif family.name == LAG_GAUGE:
                lag += sample.value
    status = "stuck" if stuck else "ok" if lag > 0 else "idle"
    return status, {"status": status, "lag": int(lag), "stuck": stuck}


def _app(registry: CollectorRegistry) -> Any:
    """The WSGI app of a stage's port: ``/healthz`` (JSON; 503 when stuck), else the metrics."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != "/healthz":
            return metrics(environ, start_response)
        status, details = health(registry)
        code = "503 Service Unavailable" if status == "stuck" else "200 OK"
        start_response(code, [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
        return [json.dumps(details).encode()]

    return app


@dataclass
class MetricsServer:
    """A registry served on ``http://host:port/metrics`` (and the stage's ``/healthz``) from a daemon thread."""

    host: str
    port: int
    _server: Any = field(repr=False)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(registry: CollectorRegistry, host: str, port: int, stage: str) -> MetricsServer:
    """Serve ``registry`` and the stage's health on ``host:port`` (0: any free port); a port in use is a
    ConfigError with one line."""

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    try:
        server = make_server(host, port, _app(registry), Server, handler_class=_SilentHandler)
    except OSError as exc:
        raise ConfigError(
            f"invalid configuration: metrics of {stage} cannot listen on {host}:{port} ({exc.strerror}); "
            f"set metrics.{stage}_port (HERMENEUT_METRICS__{stage.upper()}_PORT) or --metrics-port"
        ) from exc
    threading.Thread(target=server.serve_forever, name=f"{stage}-metrics", daemon=True).start()
    served = MetricsServer(host, int(server.server_port), server)
    log.info("%s metrics on %s", stage, served.url)
    return served
