"""The exception tree shared by every stage.

    HermeneutError
    ├── ConfigError          invalid settings; the CLI prints its one line and exits 2
    ├── ServiceError         a local Kafka/InfluxDB could not be installed, started or reached
    ├── InvalidQuery         a trend query that cannot be run as asked (bad field, window, range...)
    └── InvalidEvent         an event that cannot be accepted (carries a short machine-readable ``reason``)
        └── DecodeError      bytes that do not decode into the schema

Transient I/O failures are not in this tree: each edge retries them with backoff and only gives up with a
ServiceError.
"""

from __future__ import annotations


class HermeneutError(Exception):
    """Base of every error hermeneut raises on purpose."""


class ConfigError(HermeneutError):
    """Settings that cannot work; ``str(exc)`` is one readable line."""


class ServiceError(HermeneutError):
    """A local service failed to install, start or answer."""


class InvalidQuery(HermeneutError):
    """A query rejected before it reaches the database; ``str(exc)`` says what to fix."""


class InvalidEvent(HermeneutError):
    """An event rejected by validation; ``reason`` is a short stable code, ``detail`` the human part."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class DecodeError(InvalidEvent):
    """Bytes that are not a valid encoded event."""
