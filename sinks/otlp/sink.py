"""The OTLP sink plugin (registered as ``otlp``): telemetry, findings and health states to an OpenTelemetry
Collector (or any OTLP/HTTP endpoint) as OTLP/JSON.

Consumes three topics with its own consumer group (``<prefix>-sink-otlp``), beside the InfluxDB sink's:

    interpreted   each message's rows -> metrics (hw.gpu.*, hw.power, hw.energy, hw.temperature, hw.errors and
                  hermeneut.gpu.* for fields without a convention: :mod:`sinks.otlp.mapping`)
    alerts        each finding -> one log record, its severity the finding's
    health        each health state -> ``hw.status`` (1 for the state, 0 for the others)

A batch is sent as few requests as fit ``max_request_items`` (data points + log records), metrics first, then
logs. After a transient error the next flush goes on from the request that failed, so a request the collector
took is never sent again by the same sink (a restart may send what was not committed again: OTLP has no
idempotent write, so a replay duplicates points at the receiver, as any OTLP exporter's retry does). A request
refused as data (HTTP 400, 413...) is sent again one message at a time, and the messages still refused alone are
returned as refusals (dead-lettered, reason ``otlp_rejected``, with the collector's answer); the others are
stored. A partial success (the collector took the request but rejected some points or records) is counted
(``points_rejected``, ``records_rejected``) and logged with the collector's message, never retried, as the
specification says; it cannot name the items, so nothing is dead-lettered for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.codec import decode_interpreted, decode_record
from pipeline.config import OtlpSettings, Settings, TopicSettings
from pipeline.errors import ConfigError, DecodeError, PermanentWriteError
from pipeline.events import Finding
from pipeline.registry import from_section, with_options
from sinks.base import Position, Prepared, Refusal, Stateless
from sinks.otlp.mapping import (
    BadHealth,
    Exported,
    batch_metrics,
    finding_log,
    health_metrics,
    logs_request,
    metrics_request,
)
from sinks.otlp.send import Answer, OtlpClient

log = logging.getLogger(__name__)

#: the reason of a message the OTLP endpoint refused
REJECTED = "otlp_rejected"


@dataclass(frozen=True, slots=True)
class OtlpConfig:
    """The ``otlp`` sink's settings (from the ``otlp`` and ``topics`` sections)."""

    #: the OTLP/HTTP base URL (``/v1/metrics`` and ``/v1/logs`` go after it)
    endpoint: str = ""
    #: request headers (an API key of a hosted endpoint): never shown, left out of repr and errors
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    timeout_s: float = from_section(OtlpSettings, "timeout_s")
    #: data points + log records per request at most
    max_request_items: int = from_section(OtlpSettings, "max_request_items")
    interpreted_topic: str = from_section(TopicSettings, "interpreted")
    alerts_topic: str = from_section(TopicSettings, "alerts")
    health_topic: str = from_section(TopicSettings, "health")


@dataclass(frozen=True, slots=True)
class _Request:
    """One request: a signal and the messages (places in the flushed batch) whose parts it carries."""

    signal: str
    messages: tuple[int, ...]


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``name=value,name=value`` (the OTEL_EXPORTER_OTLP_HEADERS form) as pairs; a pair without ``=`` is a
    ConfigError that names its position only (a header may be a secret)."""
    pairs = []
    for n, part in enumerate(p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"invalid configuration: otlp sink: header {n + 1} is not name=value")
        pairs.append((name.strip(), value.strip()))
    return tuple(pairs)


class OtlpSink(Stateless):
    """OTLP/JSON from each message (prepared on the runner's consumer thread), sent per batch."""

    name = "otlp"
    Config = OtlpConfig

    def __init__(self, config: OtlpConfig, client: OtlpClient) -> None:
        self.config = config
        self.client = client
        self.topics = (config.interpreted_topic, config.alerts_topic, config.health_topic)
        self._pending: list[Exported] = []
        #: the batch being flushed, cut into requests on the first flush, and how many of them are sent
        self._batch: list[Exported] = []
        self._requests: list[_Request] | None = None
        self._sent = 0
        self._refused: list[Refusal] = []
        self.points_exported = 0
        self.records_exported = 0
        self.points_rejected = 0
        self.records_rejected = 0
        self.messages_refused = 0
        self.requests = 0
        self.requests_split = 0

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> OtlpConfig:
        o, t = settings.otlp, settings.topics
        headers = parse_headers(o.headers.get_secret_value()) if o.headers else ()
        config = OtlpConfig(
            o.endpoint or "", headers, o.timeout_s, o.max_request_items, t.interpreted, t.alerts, t.health
        )
        return with_options(config, options, "the otlp sink")

    @classmethod
    def validate(cls, config: OtlpConfig) -> None:
        """Where to send; nothing is sent."""
        if not config.endpoint.startswith(("http://", "https://")):
            shown = repr(config.endpoint) if config.endpoint else "not set (HERMENEUT_OTLP__ENDPOINT)"
            raise ConfigError(f"invalid configuration: otlp sink: endpoint must be http:// or https://, got {shown}")
        if not config.timeout_s > 0:
            raise ConfigError(f"invalid configuration: otlp sink: timeout must be > 0 s, got {config.timeout_s}")
        if not config.max_request_items >= 1:
            raise ConfigError(
                f"invalid configuration: otlp sink: max request items must be >= 1, got {config.max_request_items}"
            )
        if not (config.interpreted_topic and config.alerts_topic and config.health_topic):
            raise ConfigError("invalid configuration: otlp sink: the three topics must be named")

    @classmethod
    def from_config(cls, config: OtlpConfig, client: OtlpClient | None = None) -> OtlpSink:
        """Built, not connected (client: a default one for the config's endpoint)."""
        return cls(config, client or OtlpClient(config.endpoint, dict(config.headers), config.timeout_s))

    def prepare(self, topic: str, value: bytes, at: Position) -> Prepared[Exported]:
        c = self.config
        if topic == c.interpreted_topic:
            batch = decode_interpreted(value)
            return Prepared(batch_metrics(batch), size=len(batch), ts_ns=batch.ts_ns)
        if topic == c.alerts_topic:
            return Prepared(finding_log(decode_record(Finding, value)), size=1)
        if topic == c.health_topic:
            try:
                record = json.loads(value)
                if not isinstance(record, dict):
                    raise BadHealth("not a JSON object")
                return Prepared(health_metrics(record), size=1)
            except (ValueError, BadHealth) as exc:  # BadHealth is a ValueError; JSONDecodeError too
                raise DecodeError("bad_health", str(exc)[:300]) from exc
        raise DecodeError("wrong_topic", f"the otlp sink does not export {topic}")

    def add(self, batch: Sequence[Prepared[Exported]]) -> None:
        self._pending.extend(p.payload for p in batch)

    def flush(self) -> list[Refusal]:
        """Send what was added (the module docstring); returns the messages the endpoint refused alone."""
        refused: list[Refusal] = []
        while self._requests is not None or self._pending:
            if self._requests is None:
                self._batch, self._pending = self._pending, []
                self._requests, self._sent, self._refused = self._cut(self._batch), 0, []
            while self._sent < len(self._requests):
                request = self._requests[self._sent]
                parts = [self._batch[i] for i in request.messages]
                body = metrics_request(parts) if request.signal == "metrics" else logs_request(parts)
                try:
                    answer = self.client.export(request.signal, body)
                except PermanentWriteError as exc:
                    if len(request.messages) > 1:
                        alone = [_Request(request.signal, (i,)) for i in request.messages]
                        self._requests[self._sent : self._sent + 1] = alone
                        self.requests_split += 1
                        continue
                    self._refuse(request, str(exc))
                else:
                    self._count(request, parts, answer)
                self.requests += 1
                self._sent += 1
            refused += self._refused
            self._batch, self._requests, self._refused = [], None, []
        return refused

    def _refuse(self, request: _Request, detail: str) -> None:
        (i,) = request.messages
        part = "message" if self._batch[i].resource_logs == [] else "finding"
        self._refused.append(Refusal(REJECTED, detail, i, part=part))
        self.messages_refused += 1

    def _count(self, request: _Request, parts: list[Exported], answer: Answer) -> None:
        if request.signal == "metrics":
            self.points_exported += sum(p.points for p in parts) - answer.rejected
            self.points_rejected += answer.rejected
        else:
            self.records_exported += sum(p.records for p in parts) - answer.rejected
            self.records_rejected += answer.rejected
        if answer.rejected:
            log.warning(
                "the OTLP endpoint rejected %d of a request's %s: %s",
                answer.rejected,
                request.signal,
                answer.message[:300] or "(no message)",
            )

    def _cut(self, batch: list[Exported]) -> list[_Request]:
        """The batch as requests of at most ``max_request_items`` items each (a message bigger than that is a
        request of its own): every message's metrics, then every message's logs."""
        out: list[_Request] = []
        for signal in ("metrics", "logs"):
            current: list[int] = []
            size = 0
            for i, part in enumerate(batch):
                n = part.points if signal == "metrics" else part.records
                if not n:
                    continue
                if current and size + n > self.config.max_request_items:
                    out.append(_Request(signal, tuple(current)))
                    current, size = [], 0
                current.append(i)
                size += n
            if current:
                out.append(_Request(signal, tuple(current)))
        return out

    def close(self) -> None:
        self.client.close()

    def stats(self) -> dict[str, int]:
        return {
            "points_exported": self.points_exported,
            "records_exported": self.records_exported,
            "points_rejected": self.points_rejected,
            "records_rejected": self.records_rejected,
            "messages_refused": self.messages_refused,
            "requests": self.requests,
            "requests_split": self.requests_split,
        }
