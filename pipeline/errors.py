"""The exception tree shared by every stage.

    HermeneutError
    ├── ConfigError            invalid settings; the CLI prints its one line and exits 2
    ├── ServiceError           a local Kafka/InfluxDB could not be installed, started or reached
    ├── RunInterrupted         a run stopped by SIGINT/SIGTERM: children stopped, no result; exit 128 + signal
    ├── IncompleteRun          a run whose input ended early (producer signalled, killed): no result; exit 4
    ├── SourceUnavailable      a source cannot answer now (exporter down, scheduler busy): retried with backoff
    ├── InvalidInput           a value a person gave that cannot be read (duration, time, matcher); one line
    │   ├── InvalidQuery       a trend query that cannot be run as asked (bad field, window, range...)
    │   └── AlertConfigError   a subscription, silence, matcher, receiver that cannot be accepted
    ├── InvalidEvent           an event that cannot be accepted (carries a short machine-readable ``reason``)
    │   ├── DecodeError        bytes that do not decode into the schema
    │   └── BadSourceData      a source's answer that cannot be read; its original bytes are dead-lettered
    └── WriteError             a sink could not write a batch
        ├── TransientWriteError   may succeed later (server down, overloaded, timed out): retry with backoff
        │   └── SinkBackpressure  the server asks to wait ``retry_after_s``: pause, then retry the same data
        └── PermanentWriteError   the data itself was rejected: retrying the same data will not help
            └── RecordTooLarge    a record over its topic's size limit (pipeline.sizing): split or dead-letter it

Transient I/O failures of clients are not in this tree: each edge retries them with backoff and only gives up
with a ServiceError (or a TransientWriteError the runner retries).
"""

from __future__ import annotations


class HermeneutError(Exception):
    """Base of every error hermeneut raises on purpose."""


class ConfigError(HermeneutError):
    """Settings that cannot work; ``str(exc)`` is one readable line."""


class ServiceError(HermeneutError):
    """A local service failed to install, start or answer."""


class RunInterrupted(HermeneutError):
    """A run stopped by a signal before its end; ``signum`` is the signal, ``str()`` one line."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum


class IncompleteRun(HermeneutError):
    """A run whose input stopped short (a producer signalled, killed or failed; samples unaccounted for): a result
    computed on it would be false, so none is given; ``str()`` is one line."""


class SourceUnavailable(HermeneutError):
    """A source could not be read now; the caller keeps what it had and tries again later."""


class InvalidInput(HermeneutError):
    """A value a person gave (CLI flag, HTTP body, config entry) that cannot be read; ``str()`` says what to fix."""


class InvalidQuery(InvalidInput):
    """A query rejected before it reaches the database; ``str(exc)`` says what to fix."""


class AlertConfigError(InvalidInput):
    """A subscription, silence, matcher, receiver or query that cannot be accepted; ``str()`` is one line."""


class InvalidEvent(HermeneutError):
    """An event rejected by validation; ``reason`` is a short stable code, ``detail`` the human part."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class DecodeError(InvalidEvent):
    """Bytes that are not a valid encoded event."""


class BadSourceData(InvalidEvent):
    """A source's answer is unusable: ``payload`` (the original bytes) is dead-lettered with ``reason``."""

    def __init__(self, reason: str, detail: str, payload: bytes, origin: str) -> None:
        super().__init__(reason, detail)
        self.payload = payload
        self.origin = origin


class WriteError(HermeneutError):
    """A sink could not write a batch."""


class TransientWriteError(WriteError):
    """The write may succeed later (server down, overloaded, timed out): retry with backoff."""


class SinkBackpressure(TransientWriteError):
    """The sink cannot take more now and says for how long to wait (e.g. HTTP 429 with Retry-After): the runner
    pauses consumption for ``retry_after_s`` and retries the same batch, nothing is dropped or committed."""

    def __init__(self, retry_after_s: float, detail: str = "") -> None:
        super().__init__(detail or f"retry after {retry_after_s:g} s")
        self.retry_after_s = retry_after_s


class PermanentWriteError(WriteError):
    """The sink's server rejected the data itself (e.g. HTTP 400/413): retrying the same data will not help."""


class RecordTooLarge(PermanentWriteError):
    """A record larger than its topic (or the producer) accepts: the writer splits it or dead-letters it; sending
    it again as it is would fail again."""

    def __init__(self, topic: str, size: int, budget: int) -> None:
        super().__init__(f"a record of {size} bytes is over the {budget}-byte budget of {topic}")
        self.topic, self.size, self.budget = topic, size, budget
