"""The InfluxDB sink plugin (registered as ``influxdb``): interpreted events and findings into InfluxDB 2.x.

Stores the interpreted topic (``gpu``, ``gpu_info``, ``gpu_event``, ``nic``, ``nvlink``, ``gpu_process`` points)
and the alerts topic (``finding`` points); :mod:`sinks.influxdb.lines` has the schema. A replayed message becomes
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
from sinks.base import Prepared
from sinks.influxdb.lines import InfoTracker, batch_lines, finding_line
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


@dataclass(frozen=True, slots=True)
class Lines:
    """Line protocol for one message, and what it holds."""

    lines: list[str]
    points: int = 0
    findings: int = 0


class InfluxDBSink:
    """Line protocol from each message (prepared on the runner's consumer thread), written per batch."""

    name = "influxdb"
    Config = InfluxDBConfig

    def __init__(self, config: InfluxDBConfig, writer: InfluxWriter) -> None:
        self.config = config
        self.topics = (config.interpreted_topic, config.alerts_topic)
        self.writer = writer
        self._info = InfoTracker()
        self._pending: list[Lines] = []
        #: the pending lines cut into requests on the first flush, and how many of them are written: a retry
        #: resends the same requests from the first unwritten one, so a retried request never grows
        self._batch: list[Lines] = []
        self._requests: list[list[str]] | None = None
        self._written = 0
        self._closed = False
        self.points_written = 0
        self.findings_written = 0

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
    def from_config(cls, config: InfluxDBConfig, writer: InfluxWriter | None = None) -> InfluxDBSink:
        """Built, not connected (``writer``: default a client for the config's server)."""
        return cls(
            config,
            writer
            or InfluxWriter(config.url, config.token, config.org, config.bucket, config.timeout_s, config.batch_size),
        )

    def prepare(self, topic: str, value: bytes) -> Prepared[Lines]:
        if topic == self.config.alerts_topic:
            return Prepared(Lines([finding_line(decode_record(Finding, value))], findings=1))
        if topic != self.config.interpreted_topic:
            raise DecodeError("wrong_topic", f"the influxdb sink does not store {topic}")
        batch = decode_interpreted(value)
        lines = batch_lines((batch,), self._info)
        return Prepared(Lines(lines, points=len(batch)), size=len(batch), ts_ns=batch.ts_ns)

    def add(self, batch: Sequence[Prepared[Lines]]) -> None:
        self._pending.extend(p.payload for p in batch)

    def flush(self) -> None:
        """Write what was added, in requests of at most ``batch_size`` lines. The lines are cut into requests
        once; after a transient error the next flush goes on from the request that failed, so a retried request
        is the same request, never a bigger one."""
        while self._requests is not None or self._pending:
            if self._requests is None:
                self._batch, self._pending = self._pending, []
                lines = [line for p in self._batch for line in p.lines]
                size = self.config.batch_size
                self._requests, self._written = [lines[n : n + size] for n in range(0, len(lines), size)], 0
            try:
                while self._written < len(self._requests):
                    self.writer.write(self._requests[self._written])
                    self._written += 1
            except PermanentWriteError:
                self._batch, self._requests = [], None
                raise
            self.points_written += sum(p.points for p in self._batch)
            self.findings_written += sum(p.findings for p in self._batch)
            self._batch, self._requests = [], None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending, self._batch, self._requests = [], [], None
            self.writer.close()

    def stats(self) -> dict[str, int]:
        return {"points_written": self.points_written, "findings_written": self.findings_written}
