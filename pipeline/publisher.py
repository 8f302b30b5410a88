"""The one Kafka publisher: every hermeneut process that writes to Kafka outside faust goes through it.

Idempotent (``enable.idempotence``: no duplicates or reordering from the producer's own retries), ``acks=all``,
zstd batches (chosen by measurement against lz4 and none: bench/kafka_clients.py; the same CPU, a third of lz4's
bytes). Every delivery report is counted: ``delivered`` + ``failed`` + ``in_flight`` = published.
When librdkafka's local queue is full (the broker is down for longer than the buffer lasts), ``publish``
blocks and serves delivery reports until there is room: the caller slows down instead of losing data.
``close()`` flushes and reports what could not be delivered.

Sized to the cluster (``limits``, read at start-up with :func:`pipeline.sizing.read_limits`): the producer allows
the largest record the topics take and batches below the smallest, and a record over its topic's budget raises
:class:`~pipeline.errors.RecordTooLarge` before it is queued (so do librdkafka's own size refusals), for the
caller to split or dead-letter. :meth:`deliver` sends records and says which were not acknowledged, for the
writers that must not commit past a record Kafka did not take (dead letters, alert state).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pipeline.errors import RecordTooLarge
from pipeline.sizing import Limits

#: every batch's compression (docs/performance.md: a raw sample is 54 bytes in the log, 161 with lz4, 1,409 without)
COMPRESSION: Final = "zstd"

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]
#: (topic, key, value, headers) of one record
Record = tuple[str, bytes | None, bytes | None, Headers | None]


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
        limits: Limits | None = None,
    ) -> None:
        sized = {} if limits is None else {"message.max.bytes": limits.producer_max(), "batch.size": limits.batch_max()}
        conf: dict[str, Any] = {
            **kafka_conf,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": COMPRESSION,
            "linger.ms": linger_ms,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": buffer_messages,
            "message.timeout.ms": delivery_timeout_ms,
            **sized,
            **(extra or {}),
        }
        self.limits = limits
        self._producer = Producer(conf)
        self._closed = False
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
        reports) while the local queue is full; raises RecordTooLarge for a record over its topic's budget.
        ``on_delivery`` is called with its delivery report too (where it landed: an import waits for the pipeline to
        get that far).

        With ``timeout_s``, gives up when the queue stayed full that long and returns False (nothing was queued),
        so a caller can stay responsive to a shutdown; otherwise returns True.
        """
        report: Callable[[KafkaError | None, Message], None] = self._on_delivery
        if on_delivery is not None:
            caller = on_delivery

            def both(err: KafkaError | None, msg: Message) -> None:
                self._on_delivery(err, msg)
                caller(err, msg)

            report = both
        return self._produce(topic, key, value, headers, report, timeout_s)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        on_delivery: Callable[[KafkaError | None, Message], None],
        timeout_s: float | None = None,
    ) -> bool:
        if self.limits is not None and not self.limits.fits(topic, key, value, headers or ()):
            raise RecordTooLarge(topic, len(value or b""), self.limits.value_budget(topic, key, headers or ()))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                self._producer.produce(
                    topic, value, key, headers=list(headers) if headers else None, on_delivery=on_delivery
                )
                break
            except BufferError:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                start = time.monotonic()
                self._producer.poll(0.1)
                self.stats.blocked_s += time.monotonic() - start
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise RecordTooLarge(topic, len(value or b""), -1) from exc
                raise
        self.stats.published += 1
        self._producer.poll(0)
        return True

    def deliver(self, records: Sequence[Record], timeout_s: float = 30.0) -> list[int]:
        """Send ``records`` and wait up to ``timeout_s`` for their delivery reports; returns the indices of those
        not acknowledged (failed, or still unanswered), for the caller to send again before it commits anything."""
        results: dict[int, KafkaError | None] = {}

        def report(i: int) -> Callable[[KafkaError | None, Message], None]:
            def on_delivery(err: KafkaError | None, msg: Message) -> None:
                self._on_delivery(err, msg)
                results[i] = err

            return on_delivery

        for i, (topic, key, value, headers) in enumerate(records):
            self._produce(topic, key, value, headers, report(i))
        self._producer.flush(timeout_s)
        return [i for i in range(len(records)) if i not in results or results[i] is not None]

    def poll(self, timeout_s: float = 0.0) -> None:
        if not self._closed:  # closed: nothing is in flight, no report can come
            self._producer.poll(timeout_s)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for outstanding deliveries; returns how many are still in flight."""
        if self._closed:
            return 0
        remaining: int = self._producer.flush(timeout_s)
        return remaining

    def close(self, timeout_s: float = 60.0) -> int:
        """Flush, then shut the client down (its connections and threads go now, not when it is collected, which
        may be after the broker: it would log every refused reconnect); a client with messages still in flight is
        left up, so nothing is dropped. Returns how many are still in flight; a second close does nothing."""
        remaining = self.flush(timeout_s)
        if remaining:
            log.error("%d messages still undelivered at close", remaining)
        elif not self._closed:
            self._producer.close()
            self._closed = True
        return remaining
