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
        self._closed = False
        self.points_written = 0
        self.findings_written = 0

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> InfluxDBConfig:
        i, t = settings.influxdb, settings.topics
        token = i.token.get_secret_value() if i.token else ""
        config = InfluxDBConfig(i.url or "", token, i.org, i.bucket, i.timeout_s, t.interpreted, t.alerts)
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

    @classmethod
    def from_config(cls, config: InfluxDBConfig, writer: InfluxWriter | None = None) -> InfluxDBSink:
        """Built, not connected (``writer``: default a client for the config's server)."""
        return cls(
            config,
            writer or InfluxWriter(config.url, config.token, config.org, config.bucket, config.timeout_s),
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
        pending = self._pending
        try:
            self.writer.write([line for p in pending for line in p.lines])
        except PermanentWriteError:
            self._pending = []
            raise
        self._pending = []
        self.points_written += sum(p.points for p in pending)
        self.findings_written += sum(p.findings for p in pending)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending = []
            self.writer.close()

    def stats(self) -> dict[str, int]:
        return {"points_written": self.points_written, "findings_written": self.findings_written}
