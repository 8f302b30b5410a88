"""Kafka stand-ins for unit tests: a publisher that records what it was given (the real one, against a real broker
that is stopped and restarted, is in tests/integration/test_producer_reliability.py)."""

from __future__ import annotations

import time
from typing import Any

from pipeline.publisher import PublisherStats

Sent = tuple[str, bytes | None, bytes, Any]


class RecordingPublisher:
    """Keeps every message in ``sent`` as (topic, key, value, headers); the first ``full_for`` attempts find the
    buffer full (as :meth:`pipeline.publisher.Publisher.publish` with a timeout does) and queue nothing."""

    def __init__(self, full_for: int = 0) -> None:
        self.sent: list[Sent] = []
        self.stats = PublisherStats()
        self.full_for = full_for
        self.closed = False

    def publish(
        self, topic: str, key: bytes | None, value: bytes, headers: Any = None, timeout_s: float | None = None
    ) -> bool:
        if self.full_for:
            self.full_for -= 1
            time.sleep(0.05)  # the real one waits up to timeout_s for room
            return False
        self.sent.append((topic, key, value, headers))
        self.stats.published += 1
        self.stats.delivered += 1
        return True

    def poll(self, timeout_s: float = 0.0) -> None:
        pass

    def flush(self, timeout_s: float = 30.0) -> int:
        return 0

    def close(self, timeout_s: float = 60.0) -> int:
        self.closed = True
        return 0

    def on(self, topic: str) -> list[Sent]:
        return [m for m in self.sent if m[0] == topic]
