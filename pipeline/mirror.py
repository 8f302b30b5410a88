"""The latest value per key of a (compacted) Kafka topic, held in memory and kept current by a thread.

What faust's GlobalTable promises, without its recovery loops when several workers share a table: every
process that needs the workload context, node topologies, baselines, subscriptions or alert state mirrors the
whole topic itself. The mirror reads every partition from the beginning (no consumer group, nothing committed),
so a restarted process rebuilds the same state; a tombstone (null value) deletes the key. ``wait_ready`` blocks
until everything that was in the topic when the mirror started has been read; ``catch_up`` until everything
the topic holds *now* has been: a reader that must not act before a record published ahead of its own input
(the processor, before it labels samples with their workload context) calls it first.

A record that does not decode is counted and logged (with its topic/partition/offset) and skipped: the state
keeps the key's last good value. The writers of these topics validate before they publish. A mirror built with
``invalid_clears`` takes such a record as a tombstone instead: where the latest record says what holds *now* (a
GPU's workload context), the value it replaced no longer does, and keeping it would label what follows falsely.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pipeline.errors import InvalidEvent, ServiceError
from pipeline.topics import wait_for_topics

log = logging.getLogger(__name__)

V = TypeVar("V")


_NO_LEADER_YET = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)


def _watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """A just-created topic may not have a partition leader yet: retry (with backoff) while that lasts."""
    deadline, delay = time.monotonic() + timeout_s, 0.1
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            return int(low), int(high)
        except KafkaException as exc:
            err = exc.args[0]
            if not (err.retriable() or err.code() in _NO_LEADER_YET) or time.monotonic() > deadline:
                consumer.close()
                raise ServiceError(f"cannot read {tp.topic} partition {tp.partition}: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


class TopicMirror(Generic[V]):
    """Mirror ``topic`` into a dict of key -> decoded value; ``on_change(key, value_or_None)`` per update, and
    ``on_record(key, value_or_None, published_ns)`` with the record's Kafka timestamp (a tombstone's only date)."""

    def __init__(
        self,
        kafka_conf: dict[str, Any],
        topic: str,
        decode: Callable[[bytes], V],
        on_change: Callable[[bytes, V | None], None] | None = None,
        on_record: Callable[[bytes, V | None, int], None] | None = None,
        metadata_wait_s: float = 10.0,
        invalid_clears: bool = False,
    ) -> None:
        self.topic = topic
        self._invalid_clears = invalid_clears
        #: how long ``start`` waits for a topic missing from the metadata (or without partition leaders) to appear
        self.metadata_wait_s = metadata_wait_s
        self._decode = decode
        self._on_change = on_change
        self._on_record = on_record
        self._conf = kafka_conf | {
            "group.id": f"hermeneut-mirror-{uuid.uuid4().hex[:12]}",  # required by librdkafka; never committed
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
        }
        self._data: dict[bytes, V] = {}
        self._lock = threading.Lock()
        #: per partition, the offset of the next record to apply (what catch_up compares with the high watermark)
        self._next: dict[int, int] = {}
        self._moved = threading.Condition()
        self._probe: Consumer | None = None
        self._partitions: list[int] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.invalid = 0
        self.version = 0  # bumped on every change: cheap "did anything change" checks for readers

    def start(self) -> TopicMirror[V]:
        consumer = Consumer(self._conf)
        try:
            # a topic created a moment ago may not be in this broker's metadata yet: wait (bounded) for it
            found, _pending = wait_for_topics(consumer, [self.topic], self.metadata_wait_s)
        except ServiceError:
            consumer.close()
            raise
        info = found.get(self.topic)
        if info is None or info.error is not None:
            consumer.close()
            if info is None or info.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise ServiceError(
                    f"topic {self.topic} does not exist (waited {self.metadata_wait_s:.0f}s): "
                    "run `hermeneut topics` first"
                )
            raise ServiceError(f"cannot read topic {self.topic}: {info.error.str()}")
        partitions = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(info.partitions)]
        pending = set()
        for tp in partitions:
            low, high = _watermarks(consumer, tp)
            self._next[tp.partition] = low
            if high > low:
                pending.add(tp.partition)
        self._partitions = [tp.partition for tp in partitions]
        consumer.assign(partitions)
        if not pending:
            self._ready.set()
        self._thread = threading.Thread(
            target=self._run, args=(consumer, pending), name=f"mirror-{self.topic}", daemon=True
        )
        self._thread.start()
        return self

    def _run(self, consumer: Consumer, pending: set[int]) -> None:
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, timeout=0.2):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            pending.discard(msg.partition() or 0)
                            self._advance(msg.partition() or 0, msg.offset() or 0)
                            if not pending:
                                self._ready.set()
                        else:
                            log.warning("mirror %s: %s", self.topic, err)
                        continue
                    _kind, ts_ms = msg.timestamp()
                    self._apply(msg.key() or b"", msg.value(), f"{msg.partition()}/{msg.offset()}", ts_ms * 1_000_000)
                    self._advance(msg.partition() or 0, (msg.offset() or 0) + 1)
        finally:
            consumer.close()

    def _advance(self, partition: int, next_offset: int) -> None:
        with self._moved:
            if next_offset > self._next.get(partition, 0):
                self._next[partition] = next_offset
                self._moved.notify_all()

    def catch_up(self, timeout_s: float = 5.0) -> bool:
        """Block until every record the topic holds now has been applied (True), or ``timeout_s`` passed (False).

        One ListOffsets round trip per partition to the broker, then a wait for the reader thread."""
        if self._thread is None:
            return True
        if self._probe is None:
            self._probe = Consumer(self._conf | {"group.id": f"{self._conf['group.id']}-probe"})
        deadline = time.monotonic() + timeout_s
        highs: dict[int, int] = {}
        for partition in self._partitions:
            try:
                _low, high = self._probe.get_watermark_offsets(
                    TopicPartition(self.topic, partition), timeout=max(0.1, deadline - time.monotonic()), cached=False
                )
            except KafkaException as exc:
                log.warning(
                    "mirror %s: partition %d's end unknown (%s); not waiting for it", self.topic, partition, exc
                )
                continue
            highs[partition] = int(high)
        with self._moved:
            return self._moved.wait_for(
                lambda: all(self._next.get(p, 0) >= high for p, high in highs.items()),
                max(0.0, deadline - time.monotonic()),
            )

    def _apply(self, key: bytes, value: bytes | None, where: str, published_ns: int = 0) -> None:
        decoded: V | None = None
        if value is not None:
            try:
                decoded = self._decode(value)
            except InvalidEvent as exc:
                self.invalid += 1
                done = "clearing its key" if self._invalid_clears else "skipping it"
                log.error("mirror %s: record %s invalid, %s (%s: %s)", self.topic, where, done, exc.reason, exc.detail)
                if not self._invalid_clears:
                    return
        with self._lock:
            if decoded is None:
                self._data.pop(key, None)
            else:
                self._data[key] = decoded
            self.version += 1
        if self._on_change is not None:
            self._on_change(key, decoded)
        if self._on_record is not None:
            self._on_record(key, decoded, published_ns)

    def wait_ready(self, timeout_s: float = 60.0) -> bool:
        """True once everything that was in the topic at start has been read."""
        return self._ready.wait(timeout_s)

    def get(self, key: bytes) -> V | None:
        with self._lock:
            return self._data.get(key)

    def snapshot(self) -> dict[bytes, V]:
        with self._lock:
            return dict(self._data)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self._probe is not None:
            self._probe.close()
            self._probe = None
