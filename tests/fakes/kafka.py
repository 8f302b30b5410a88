"""Kafka stand-ins for unit tests: a publisher that records what it was given (the real one, against a real broker
that is stopped and restarted, is in tests/integration/test_producer_reliability.py)."""

from __future__ import annotations

import time
from typing import Any

from pipeline.publisher import PublisherStats
from pipeline.sizing import Limits

Sent = tuple[str, bytes | None, bytes, Any]


class RecordingPublisher:
    """Keeps every message in ``sent`` as (topic, key, value, headers); the first ``full_for`` attempts find the
    buffer full (as :meth:`pipeline.publisher.Publisher.publish` with a timeout does) and queue nothing."""

    def __init__(self, full_for: int = 0, refuse_for: int = 0, limits: Limits | None = None) -> None:
        self.sent: list[Sent] = []
        self.stats = PublisherStats()
        self.full_for = full_for
        #: the first ``refuse_for`` calls of :meth:`deliver` get no acknowledgement (Kafka down)
        self.refuse_for = refuse_for
        #: sized like a real publisher to these (None: Kafka's defaults)
        self.limits: Limits | None = limits
        self.closed = False

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Any = None,
        timeout_s: float | None = None,
        on_delivery: Any = None,
    ) -> bool:
        if self.full_for:
            self.full_for -= 1
            time.sleep(0.05)  # the real one waits up to timeout_s for room
            return False
        self.sent.append((topic, key, value, headers))
        self.stats.published += 1
        self.stats.delivered += 1
        if on_delivery is not None:  # one partition, offsets in order of publishing
            on_delivery(None, FakeMessage(topic, 0, len(self.on(topic)) - 1, value, key))
        return True

    def deliver(self, records: list[Sent], timeout_s: float = 30.0) -> list[int]:
        if self.refuse_for:
            self.refuse_for -= 1
            return list(range(len(records)))
        self.sent.extend(records)
        return []

    def poll(self, timeout_s: float = 0.0) -> None:
        pass

    def flush(self, timeout_s: float = 30.0) -> int:
        return 0

    def close(self, timeout_s: float = 60.0) -> int:
        self.closed = True
        return 0

    def on(self, topic: str) -> list[Sent]:
        return [m for m in self.sent if m[0] == topic]


class FakeMessage:
    """A consumed record, with confluent-kafka's accessors."""

    def __init__(self, topic: str, partition: int, offset: int, value: bytes, key: bytes | None = None) -> None:
        self._topic, self._partition, self._offset, self._value, self._key = topic, partition, offset, value, key

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def error(self) -> None:
        return None


class FakeConsumer:
    """A consumer group member that owns every partition of the messages it is given, hands them out in order
    and records what it was asked: pauses, resumes and commits (into ``events`` too, shared with a fake sink, so
    a test can check what happened before what). Each ``consume`` hands out at most ``per_consume`` messages, as
    if they trickled in."""

    def __init__(self, messages: list[FakeMessage], events: list[str] | None = None, per_consume: int = 1) -> None:
        self.queue = list(messages)
        self.per_consume = per_consume
        #: per (topic, partition): the next offset to read, and the end of the log (librdkafka's high watermark)
        self.positions: dict[tuple[str, int], int] = {}
        self.ends = {(m.topic(), m.partition()): 0 for m in messages}
        for m in messages:
            self.ends[(m.topic(), m.partition())] = max(self.ends[(m.topic(), m.partition())], m.offset() + 1)
        self.events = events if events is not None else []
        self.paused = False
        self.pauses = self.resumes = 0
        self.commits: list[list[tuple[str, int, int]]] = []
        self.metadata: dict[tuple[str, int], str] = {}
        self.closed = False

    def subscribe(self, topics: list[str], on_assign: Any = None, on_revoke: Any = None) -> None:
        self.topics = topics
        if on_assign is not None:
            on_assign(self, self.assignment())

    def assignment(self) -> list[Any]:
        from confluent_kafka import TopicPartition

        return sorted((TopicPartition(topic, partition) for topic, partition in self.ends), key=str)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[FakeMessage]:
        if self.paused or not self.queue:
            time.sleep(max(timeout, 0.0))
            return []
        n = min(num_messages, self.per_consume)
        out, self.queue = self.queue[:n], self.queue[n:]
        for m in out:
            self.positions[(m.topic(), m.partition())] = m.offset() + 1
        return out

    def position(self, partitions: list[Any]) -> list[Any]:
        """The next offset to read per partition (-1001, OFFSET_INVALID, before the first message)."""
        from confluent_kafka import TopicPartition

        return [TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
                for tp in partitions]  # fmt: skip

    def get_watermark_offsets(self, partition: Any, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        return 0, self.ends.get((partition.topic, partition.partition), 0)

    def poll(self, timeout: float = -1) -> None:
        return None

    def pause(self, partitions: list[Any]) -> None:
        self.paused, self.pauses = True, self.pauses + 1
        self.events.append("pause")

    def resume(self, partitions: list[Any]) -> None:
        self.paused, self.resumes = False, self.resumes + 1
        self.events.append("resume")

    def commit(self, *, offsets: list[Any], asynchronous: bool = True) -> None:
        committed = sorted((tp.topic, tp.partition, tp.offset) for tp in offsets)
        self.commits.append(committed)
        self.metadata |= {(tp.topic, tp.partition): tp.metadata for tp in offsets}
        self.events.append(f"commit {committed}")

    def close(self) -> None:
        self.closed = True

    def committed(self, partitions: list[Any] | None = None, timeout: float = -1) -> Any:
        """The last committed offset per (topic, partition): the next one to read; given ``partitions`` (as the
        runner asks), those as TopicPartitions with each commit's metadata."""
        if partitions is not None:
            from confluent_kafka import TopicPartition

            last = self.committed()
            return [
                TopicPartition(tp.topic, tp.partition, last.get((tp.topic, tp.partition), -1001),
                               metadata=self.metadata.get((tp.topic, tp.partition)) or "")
                for tp in partitions
            ]  # fmt: skip
        out: dict[tuple[str, int], int] = {}
        for commit in self.commits:
            for topic, partition, offset in commit:
                out[(topic, partition)] = max(out.get((topic, partition), 0), offset)
        return out
