"""The one Kafka publisher: every hermeneut process that writes to Kafka outside faust goes through it.

Idempotent (``enable.idempotence``: no duplicates or reordering from the producer's own retries), ``acks=all``,
lz4 batches. Every delivery report is counted: ``delivered`` + ``failed`` + ``in_flight`` = published.
When librdkafka's local queue is full (the broker is down for longer than the buffer lasts), ``publish``
blocks and serves delivery reports until there is room: the caller slows down instead of losing data.
``close()`` flushes and reports what could not be delivered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]


@dataclass
class PublisherStats:
    published: int = 0
    delivered: int = 0
    failed: int = 0
    blocked_s: float = 0.0

    @property
    def in_flight(self) -> int:
        return self.published - self.delivered - self.failed


class Publisher:
    """A thin, counted wrapper around ``confluent_kafka.Producer``."""

    def __init__(
        self,
        kafka_conf: dict[str, str],
        *,
        linger_ms: int = 20,
        buffer_messages: int = 200_000,
        delivery_timeout_ms: int = 600_000,
        extra: dict[str, Any] | None = None,
    ) -> None:
        conf: dict[str, Any] = {
            **kafka_conf,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "lz4",
            "linger.ms": linger_ms,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": buffer_messages,
            "message.timeout.ms": delivery_timeout_ms,
            **(extra or {}),
        }
        self._producer = Producer(conf)
        self.stats = PublisherStats()
        self.last_error: KafkaError | None = None

    def _on_delivery(self, err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            self.stats.delivered += 1
        else:
            self.stats.failed += 1
            if self.last_error is None or self.last_error.code() != err.code():
                log.error("delivery failed: %s", err)
            self.last_error = err

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        timeout_s: float | None = None,
        on_delivery: Callable[[KafkaError | None, Message], None] | None = None,
    ) -> bool:
        """Queue one message (``value`` None: a tombstone for a compacted topic); blocks (serving delivery
        reports) while the local queue is full. ``on_delivery`` is called with its delivery report too (where it
        landed: an import waits for the pipeline to get that far).

        With ``timeout_s``, gives up when the queue stayed full that long and returns False (nothing was queued),
        so a caller can stay responsive to a shutdown; otherwise returns True.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        report: Callable[[KafkaError | None, Message], None] = self._on_delivery
        if on_delivery is not None:

            def both(err: KafkaError | None, msg: Message) -> None:
                self._on_delivery(err, msg)
                on_delivery(err, msg)

            report = both

        while True:
            try:
                self._producer.produce(
                    topic,
                    value,
                    key,
                    headers=list(headers) if headers else None,
                    on_delivery=report,
                )
                break
            except BufferError:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                start = time.monotonic()
                self._producer.poll(0.1)
                self.stats.blocked_s += time.monotonic() - start
        self.stats.published += 1
        self._producer.poll(0)
        return True

    def poll(self, timeout_s: float = 0.0) -> None:
        self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for outstanding deliveries; returns how many are still in flight."""
        remaining: int = self._producer.flush(timeout_s)
        return remaining

    def close(self, timeout_s: float = 60.0) -> int:
        remaining = self.flush(timeout_s)
        if remaining:
            log.error("%d messages still undelivered at close", remaining)
        return remaining
