"""The InfluxDB sink plugin (registered as ``influxdb``): interpreted events and findings into InfluxDB 2.x.

Stores the interpreted topic (``gpu``, ``gpu_info``, ``gpu_event``, ``nic``, ``nvlink``, ``gpu_process`` points)
and the alerts topic (``finding`` points); :mod:`sinks.influxdb.lines` has the schema. The 1-minute rollups are
computed from the same messages (:mod:`sinks.influxdb.rollup`) and written to ``<bucket>_1m`` with them; the
offsets the runner commits keep every open minute re-readable after a restart. A replayed message becomes
the same points (same measurement, tags and timestamp), so InfluxDB overwrites instead of duplicating and the
runner's at-least-once delivery stores each sample once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.codec import decode_interpreted, decode_record
from pipeline.config import Settings
from pipeline.errors import ConfigError, DecodeError, PermanentWriteError
from pipeline.events import Finding
from pipeline.registry import with_options
from sinks.base import Position, Prepared
from sinks.influxdb.lines import InfoTracker, batch_lines, finding_line
from sinks.influxdb.rollup import MinuteRollups, SeriesIndex
from sinks.influxdb.write import InfluxWriter


@dataclass(frozen=True, slots=True)
class InfluxDBConfig:
    """The ``influxdb`` sink's settings (from the ``influxdb`` and ``topics`` sections)."""

    url: str = ""
    #: never shown: left out of repr and of every error message
    token: str = field(default="", repr=False)
    org: str = "hermeneut"
    bucket: str = "telemetry"
    timeout_s: float = 10.0
    #: lines per write request at most (``influxdb.batch_size``)
    batch_size: int = 5000
    interpreted_topic: str = "hermeneut.events.interpreted"
    alerts_topic: str = "hermeneut.alerts"
    #: where the 1-minute rollups go ("": ``<bucket>_1m``), and the retention it is created with when missing
    rollup_bucket: str = ""
    rollup_retention_s: int = 90 * 86400


@dataclass(frozen=True, slots=True)
class Lines:
    """Line protocol for one message, and what it holds; ``rollups`` are lines of the minutes it completed."""

    lines: list[str]
    points: int = 0
    findings: int = 0
    rollups: list[str] = field(default_factory=list)


class InfluxDBSink:
    """Line protocol from each message (prepared on the runner's consumer thread), written per batch."""

    name = "influxdb"
    Config = InfluxDBConfig

    def __init__(self, config: InfluxDBConfig, writer: InfluxWriter, rollup_writer: InfluxWriter) -> None:
        self.config = config
        self.topics = (config.interpreted_topic, config.alerts_topic)
        self.writer, self.rollup_writer = writer, rollup_writer
        self._info = InfoTracker()
        self._series = SeriesIndex()
        self.rollups = MinuteRollups()
        self._rollup_bucket_checked = False
        self._pending: list[Lines] = []
        #: the pending lines cut into requests on the first flush, and how many of them are written: a retry
        #: resends the same requests from the first unwritten one, so a retried request never grows
        self._batch: list[Lines] = []
        self._requests: list[tuple[InfluxWriter, list[str]]] | None = None
        self._written = 0
        self._closed = False
        self.points_written = 0
        self.findings_written = 0
        #: the largest request written (a request is at most ``batch_size`` lines; resent unchanged when retried)
        self.max_request_lines = 0

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> InfluxDBConfig:
        i, t = settings.influxdb, settings.topics
        token = i.token.get_secret_value() if i.token else ""
        config = InfluxDBConfig(i.url or "", token, i.org, i.bucket, i.timeout_s, i.batch_size, t.interpreted, t.alerts)
        return with_options(config, options, "the influxdb sink")

    @classmethod
    def validate(cls, config: InfluxDBConfig) -> None:
        """Where to write, and with what; nothing is sent."""
        if not config.url.startswith(("http://", "https://")):
            shown = repr(config.url) if config.url else "not set (HERMENEUT_INFLUXDB__URL, or start local services)"
            raise ConfigError(f"invalid configuration: influxdb sink: url must be http:// or https://, got {shown}")
        if not config.token:
            raise ConfigError("invalid configuration: influxdb sink: no token (HERMENEUT_INFLUXDB__TOKEN)")
        if not (config.org and config.bucket and config.interpreted_topic and config.alerts_topic):
            raise ConfigError("invalid configuration: influxdb sink: org, bucket and both topics must be named")
        if not config.timeout_s > 0:
            raise ConfigError(f"invalid configuration: influxdb sink: timeout must be > 0 s, got {config.timeout_s}")
        if not config.batch_size >= 1:
            raise ConfigError(f"invalid configuration: influxdb sink: batch size must be >= 1, got {config.batch_size}")

    @classmethod
    def from_config(
        cls, config: InfluxDBConfig, writer: InfluxWriter | None = None, rollup_writer: InfluxWriter | None = None
    ) -> InfluxDBSink:
        """Built, not connected (writers: default clients for the config's server and its two buckets)."""
        c = config
        rollups = c.rollup_bucket or f"{c.bucket}_1m"
        return cls(
            config,
            writer or InfluxWriter(c.url, c.token, c.org, c.bucket, c.timeout_s, c.batch_size),
            rollup_writer or InfluxWriter(c.url, c.token, c.org, rollups, c.timeout_s, c.batch_size),
        )

    def prepare(self, topic: str, value: bytes, at: Position) -> Prepared[Lines]:
        if topic == self.config.alerts_topic:
            return Prepared(Lines([finding_line(decode_record(Finding, value))], findings=1))
        if topic != self.config.interpreted_topic:
            raise DecodeError("wrong_topic", f"the influxdb sink does not store {topic}")
        batch = decode_interpreted(value)
        lines = batch_lines((batch,), self._info)
        rollups = self.rollups.add(batch, self._series.of(batch, self.rollups), at.partition, at.offset)
        return Prepared(Lines(lines, points=len(batch), rollups=rollups), size=len(batch), ts_ns=batch.ts_ns)

    def marks(self) -> dict[tuple[str, int], tuple[int, str]]:
        topic = self.config.interpreted_topic
        return {(topic, p): mark for p, mark in self.rollups.mark().items()}

    def resume(self, topic: str, partition: int, metadata: str | None) -> None:
        if topic == self.config.interpreted_topic:
            self.rollups.resume(partition, metadata)

    def forget(self, topic: str, partition: int) -> None:
        if topic == self.config.interpreted_topic:
            self.rollups.forget(partition)

    def add(self, batch: Sequence[Prepared[Lines]]) -> None:
        self._pending.extend(p.payload for p in batch)

    def flush(self) -> None:
        """Write what was added, in requests of at most ``batch_size`` lines. The lines are cut into requests
        once; after a transient error the next flush goes on from the request that failed, so a retried request
        is the same request, never a bigger one."""
        while self._requests is not None or self._pending:
            if self._requests is None:
                self._batch, self._pending = self._pending, []
                self._requests, self._written = self._cut(self._batch), 0
            try:
                while self._written < len(self._requests):
                    writer, lines = self._requests[self._written]
                    if writer is self.rollup_writer and not self._rollup_bucket_checked:
                        writer.ensure_bucket(self.config.rollup_retention_s)
                        self._rollup_bucket_checked = True
                    writer.write(lines)
                    self._written += 1
                    self.max_request_lines = max(self.max_request_lines, len(lines))
            except PermanentWriteError:
                self._batch, self._requests = [], None
                raise
            self.points_written += sum(p.points for p in self._batch)
            self.findings_written += sum(p.findings for p in self._batch)
            self._batch, self._requests = [], None

    def _cut(self, batch: list[Lines]) -> list[tuple[InfluxWriter, list[str]]]:
        """The batch's lines as requests of at most ``batch_size`` lines: raw points first, then rollups."""
        size, out = self.config.batch_size, []
        for writer, lines in (
            (self.writer, [line for p in batch for line in p.lines]),
            (self.rollup_writer, [line for p in batch for line in p.rollups]),
        ):
            out += [(writer, lines[n : n + size]) for n in range(0, len(lines), size)]
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending, self._batch, self._requests = [], [], None
            self.writer.close()
            self.rollup_writer.close()

    def stats(self) -> dict[str, int]:
        r = self.rollups.stats
        return {
            "points_written": self.points_written,
            "findings_written": self.findings_written,
            "max_request_lines": self.max_request_lines,
            "rollup_minutes": r.minutes_written,
            "rollup_late_rows": r.late_rows,
            "rollup_replayed_rows": r.replayed_rows,
            "rollup_series": self.rollups.live,
        }
