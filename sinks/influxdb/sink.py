"""The InfluxDB sink plugin (registered as ``influxdb``): interpreted events and findings into InfluxDB 2.x.

Stores the interpreted topic (``gpu``, ``gpu_info``, ``gpu_event``, ``nic``, ``nvlink``, ``gpu_process`` points),
the alerts topic (``finding`` points) and the alert manager's notification history (``notification`` points);
:mod:`sinks.influxdb.schema` has the schema, :mod:`sinks.influxdb.lines` the lines. The 1-minute rollups are
computed from the same messages (:mod:`sinks.influxdb.rollup`) and written to ``<bucket>_1m`` with them; the
offsets the runner commits keep every open minute re-readable after a restart. A replayed message becomes
the same points (same measurement, tags and timestamp), so InfluxDB overwrites instead of duplicating and the
runner's at-least-once delivery stores each sample once.

One bad item never costs the others. :meth:`InfluxDBSink.prepare` refuses what cannot become a line
(:func:`sinks.influxdb.lines.refusals`) before it reaches the lines or the rollups' state, so a restart that reads
the message again refuses it again and stores the rest. A request InfluxDB still refuses (HTTP 400, 413, 422 and
other client errors about the data, :func:`sinks.influxdb.write.refuses_data`) is cut in two, each half written on
its own, until only the refused lines are left alone: each is returned as a refusal with InfluxDB's own message,
everything else is stored. k refused lines among n cost about ``k * log2(n)`` extra requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from pipeline.codec import decode_interpreted, decode_record
from pipeline.config import InfluxSettings, Settings, StorageSettings, TopicSettings, ValidationSettings
from pipeline.errors import ConfigError, DecodeError, PermanentWriteError
from pipeline.events import Finding, InterpretedBatch
from pipeline.notifications import NotificationRecord
from pipeline.registry import from_section, section_default, with_options
from sinks.base import Position, Prepared, Refusal
from sinks.influxdb.lines import InfoTracker, Refused, batch_lines, finding_line, notification_line, refusals
from sinks.influxdb.rollup import MinuteRollups, SeriesIndex
from sinks.influxdb.write import InfluxWriter


@dataclass(frozen=True, slots=True)
class InfluxDBConfig:
    """The ``influxdb`` sink's settings (from the ``influxdb`` and ``topics`` sections)."""

    url: str = ""
    #: never shown: left out of repr and of every error message
    token: str = field(default="", repr=False)
    org: str = from_section(InfluxSettings, "org")
    bucket: str = from_section(InfluxSettings, "bucket")
    timeout_s: float = from_section(InfluxSettings, "timeout_s")
    #: lines per write request at most
    batch_size: int = from_section(InfluxSettings, "batch_size")
    interpreted_topic: str = from_section(TopicSettings, "interpreted")
    alerts_topic: str = from_section(TopicSettings, "alerts")
    notification_history_topic: str = from_section(TopicSettings, "notification_history")
    #: where the 1-minute rollups go ("": ``<bucket>_1m``), and the retention it is created with when missing
    #: (``storage.rollup_retention_days``: the retention service's)
    rollup_bucket: str = ""
    rollup_retention_s: int = round(section_default(StorageSettings, "rollup_retention_days") * 86_400)
    #: a row this far ahead of the sink's clock is refused (twice ``validation.max_future_skew_s``: the hosts of
    #: the processor and the sink may differ by some seconds, so what the processor accepted is not refused here)
    max_future_s: float = 2 * section_default(ValidationSettings, "max_future_skew_s")


@dataclass(frozen=True, slots=True)
class Lines:
    """Line protocol for one message, and what it holds; ``rollups`` are lines of the minutes it completed. The
    first ``points`` lines are the ``gpu`` points of its rows, in order: ``positions`` are their places in the
    message (None: every row, in order) and ``gpus`` their GPUs, so a refused line names its sample."""

    lines: list[str]
    points: int = 0
    findings: int = 0
    notifications: int = 0
    rollups: list[str] = field(default_factory=list)
    positions: tuple[int, ...] | None = None
    gpus: tuple[str, ...] = ()

    def refusal(self, line: int, rollup: bool, detail: str, item: int) -> Refusal:
        """The refusal of its line ``line`` (of ``rollups`` if ``rollup``) by InfluxDB."""
        if rollup:
            return Refusal(REJECTED, detail, item, part="rollup", position=line)
        if self.findings:
            return Refusal(REJECTED, detail, item, part="finding")
        if self.notifications:
            return Refusal(REJECTED, detail, item, part="notification")
        if line < self.points:
            position = line if self.positions is None else self.positions[line]
            return Refusal(REJECTED, detail, item, self.gpus[line] if self.gpus else None, position)
        return Refusal(REJECTED, detail, item, part="line", position=line)


#: the reason of a line InfluxDB refused
REJECTED = "influxdb_rejected"


@dataclass(frozen=True, slots=True)
class _Request:
    """One write request: lines ``lo:hi`` of one writer's share of the batch (see :meth:`InfluxDBSink._cut`)."""

    writer: InfluxWriter
    rollup: bool
    lo: int
    hi: int


class InfluxDBSink:
    """Line protocol from each message (prepared on the runner's consumer thread), written per batch."""

    name = "influxdb"
    Config = InfluxDBConfig

    def __init__(
        self,
        config: InfluxDBConfig,
        writer: InfluxWriter,
        rollup_writer: InfluxWriter,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.config = config
        self.clock = clock
        self.topics = (config.interpreted_topic, config.alerts_topic, config.notification_history_topic)
        self.writer, self.rollup_writer = writer, rollup_writer
        self._info = InfoTracker()
        self._series = SeriesIndex()
        self.rollups = MinuteRollups()
        self._rollup_bucket_checked = False
        self._pending: list[Lines] = []
        #: the pending lines cut into requests on the first flush, and how many of them are written: a retry
        #: resends the same requests from the first unwritten one, so a retried request never grows
        self._batch: list[Lines] = []
        self._requests: list[_Request] | None = None
        self._written = 0
        #: per writer's share of the batch (raw, rollups): its lines, and per line its message and place there
        self._shares: dict[bool, tuple[list[str], np.ndarray, np.ndarray]] = {}
        self._refused: list[Refusal] = []
        self._closed = False
        self.points_written = 0
        self.findings_written = 0
        self.notifications_written = 0
        #: the largest request written (a request is at most ``batch_size`` lines; resent unchanged when retried)
        self.max_request_lines = 0
        #: lines InfluxDB refused (each dead-lettered alone), and the requests split to find them
        self.lines_refused = 0
        self.requests_split = 0

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> InfluxDBConfig:
        i, t = settings.influxdb, settings.topics
        token = i.token.get_secret_value() if i.token else ""
        config = InfluxDBConfig(
            i.url or "",
            token,
            i.org,
            i.bucket,
            i.timeout_s,
            i.batch_size,
            t.interpreted,
            t.alerts,
            t.notification_history,
            rollup_retention_s=round(settings.storage.rollup_retention_days * 86_400),
            max_future_s=2 * settings.validation.max_future_skew_s,
        )
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
        if not config.notification_history_topic:
            raise ConfigError("invalid configuration: influxdb sink: the notification history topic must be named")
        if not config.timeout_s > 0:
            raise ConfigError(f"invalid configuration: influxdb sink: timeout must be > 0 s, got {config.timeout_s}")
        if not config.batch_size >= 1:
            raise ConfigError(f"invalid configuration: influxdb sink: batch size must be >= 1, got {config.batch_size}")

    @classmethod
    def from_config(
        cls,
        config: InfluxDBConfig,
        writer: InfluxWriter | None = None,
        rollup_writer: InfluxWriter | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> InfluxDBSink:
        """Built, not connected (writers: default clients for the config's server and its two buckets; the clock
        judges how far ahead a row may be)."""
        c = config
        rollups = c.rollup_bucket or f"{c.bucket}_1m"
        return cls(
            config,
            writer or InfluxWriter(c.url, c.token, c.org, c.bucket, c.timeout_s, c.batch_size),
            rollup_writer or InfluxWriter(c.url, c.token, c.org, rollups, c.timeout_s, c.batch_size),
            clock,
        )

    def prepare(self, topic: str, value: bytes, at: Position) -> Prepared[Lines]:
        if topic == self.config.alerts_topic:
            return Prepared(Lines([finding_line(decode_record(Finding, value))], findings=1))
        if topic == self.config.notification_history_topic:
            record = decode_record(NotificationRecord, value)
            return Prepared(Lines([notification_line(record)], notifications=1))
        if topic != self.config.interpreted_topic:
            raise DecodeError("wrong_topic", f"the influxdb sink does not store {topic}")
        batch = decode_interpreted(value)
        rows, events, nics = refusals(batch, self.clock() + int(self.config.max_future_s * 1e9))
        positions: tuple[int, ...] | None = None
        refused: tuple[Refusal, ...] = ()
        if rows or events or nics:
            batch, positions, refused = _without(batch, rows, events, nics)
        lines = batch_lines((batch,), self._info)
        rollups = self.rollups.add(batch, self._series.of(batch, self.rollups), at.partition, at.offset)
        held = Lines(lines, points=len(batch), rollups=rollups, positions=positions, gpus=batch.gpu_uuid)
        return Prepared(held, size=len(batch), ts_ns=batch.ts_ns, refused=refused)

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

    def flush(self) -> list[Refusal]:
        """Write what was added, in requests of at most ``batch_size`` lines; returns the lines InfluxDB refused.
        The lines are cut into requests once; after a transient error the next flush goes on from the request that
        failed, so a retried request is the same request, never a bigger one. A request refused as data is replaced
        by its two halves (the module docstring); a single line refused is a refusal."""
        refused: list[Refusal] = []
        while self._requests is not None or self._pending:
            if self._requests is None:
                self._batch, self._pending = self._pending, []
                self._requests, self._written, self._refused = self._cut(self._batch), 0, []
            while self._written < len(self._requests):
                request = self._requests[self._written]
                lines = self._shares[request.rollup][0][request.lo : request.hi]
                if request.rollup and not self._rollup_bucket_checked:
                    request.writer.ensure_bucket(self.config.rollup_retention_s)
                    self._rollup_bucket_checked = True
                try:
                    request.writer.write(lines)
                except PermanentWriteError as exc:
                    if len(lines) > 1:
                        mid = (request.lo + request.hi) // 2
                        halves = [replace(request, hi=mid), replace(request, lo=mid)]
                        self._requests[self._written : self._written + 1] = halves
                        self.requests_split += 1
                        continue
                    self._refused.append(self._refusal(request, str(exc)))
                self._written += 1
                self.max_request_lines = max(self.max_request_lines, len(lines))
            lost = [r for r in self._refused if r.part in ("sample", "finding", "notification")]
            self.points_written += sum(p.points for p in self._batch) - sum(r.part == "sample" for r in lost)
            self.findings_written += sum(p.findings for p in self._batch) - sum(r.part == "finding" for r in lost)
            self.notifications_written += sum(p.notifications for p in self._batch) - sum(
                r.part == "notification" for r in lost
            )
            self.lines_refused += len(self._refused)
            refused += self._refused
            self._batch, self._requests, self._shares, self._refused = [], None, {}, []
        return refused

    def _refusal(self, request: _Request, detail: str) -> Refusal:
        _, item, place = self._shares[request.rollup]
        i = int(item[request.lo])
        return self._batch[i].refusal(int(place[request.lo]), request.rollup, detail, i)

    def _cut(self, batch: list[Lines]) -> list[_Request]:
        """The batch's lines as requests of at most ``batch_size`` lines: raw points first, then rollups. Each
        writer's share is kept whole with, per line, the message it came from and its place among that message's
        lines, so a request is a range of it and a refused line is traced back."""
        size, out = self.config.batch_size, []
        for writer, rollup in ((self.writer, False), (self.rollup_writer, True)):
            parts = [p.rollups if rollup else p.lines for p in batch]
            counts = np.fromiter(map(len, parts), np.int64, len(parts))
            lines = [line for part in parts for line in part]
            item = np.repeat(np.arange(len(parts)), counts)
            place = np.arange(len(lines)) - np.repeat(np.cumsum(counts) - counts, counts)
            self._shares[rollup] = (lines, item, place)
            out += [_Request(writer, rollup, n, min(n + size, len(lines))) for n in range(0, len(lines), size)]
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pending, self._batch, self._requests, self._shares = [], [], None, {}
            self.writer.close()
            self.rollup_writer.close()

    def stats(self) -> dict[str, int]:
        r = self.rollups.stats
        return {
            "points_written": self.points_written,
            "findings_written": self.findings_written,
            "notifications_written": self.notifications_written,
            "max_request_lines": self.max_request_lines,
            "lines_refused": self.lines_refused,
            "requests_split": self.requests_split,
            "rollup_minutes": r.minutes_written,
            "rollup_late_rows": r.late_rows,
            "rollup_replayed_rows": r.replayed_rows,
            "rollup_series": self.rollups.live,
        }


def _without(
    batch: InterpretedBatch, rows: list[Refused], events: list[Refused], nics: list[Refused]
) -> tuple[InterpretedBatch, tuple[int, ...], tuple[Refusal, ...]]:
    """The batch without the refused rows and extras, the kept rows' places in the message, and the refusals."""
    gone = {i for i, _, _ in rows}
    kept = tuple(i for i in range(len(batch)) if i not in gone)
    out = replace(
        batch.take(np.asarray(kept, dtype=np.int64)),
        gpu_events=_keep(batch.gpu_events, events),
        nics=_keep(batch.nics, nics),
    )
    refused = [Refusal(reason, detail, gpu=batch.gpu_uuid[i], position=i) for i, reason, detail in rows]
    refused += [Refusal(r, d, gpu=batch.gpu_events[i].gpu_uuid, position=i, part="event") for i, r, d in events]
    refused += [Refusal(reason, detail, position=i, part="nic") for i, reason, detail in nics]
    return out, kept, tuple(refused)


def _keep(items: tuple[Any, ...], refused: list[Refused]) -> tuple[Any, ...]:
    gone = {i for i, _, _ in refused}
    return tuple(x for i, x in enumerate(items) if i not in gone) if gone else items
