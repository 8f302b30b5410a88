"""Consume interpreted events and store them, committing Kafka offsets only after InfluxDB acknowledged them.

Loop: consume -> decode -> line protocol -> (batch full or flush interval over) -> write -> commit.
A transient write failure (InfluxDB down, overloaded) pauses the partitions and retries with exponential
backoff and jitter, for as long as it takes: nothing is committed, so nothing acknowledged is lost, and a
replay after a crash overwrites identical points. A message that does not decode, or that InfluxDB rejects as
data (HTTP 400), goes to the dead-letter topic (delivered before the offset is committed) and is counted.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from pipeline.codec import decode_interpreted
from pipeline.config import Settings
from pipeline.deadletter import DeadLetter, dead_letter
from pipeline.errors import DecodeError
from pipeline.events import InterpretedBatch
from pipeline.publisher import Publisher
from sinks.influxdb import InfluxWriter, PermanentWriteError, TransientWriteError, batch_lines

log = logging.getLogger(__name__)

STAGE = "sink"
_LATENCY_KEEP = 2_000_000


@dataclass
class SinkStats:
    messages: int = 0
    points_written: int = 0
    batches: int = 0
    write_retries: int = 0
    dead_lettered: int = 0
    commits: int = 0
    assigned: bool = False
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    latency_max_s: float | None = None
    _latencies: list[np.ndarray] = field(default_factory=list, repr=False)

    def record_latency(self, ack_ns: int, ts_ns: np.ndarray) -> None:
        self._latencies.append((ack_ns - ts_ns) / 1e9)
        while sum(len(a) for a in self._latencies) > _LATENCY_KEEP:
            self._latencies.pop(0)

    def reset_latency(self) -> None:
        self._latencies.clear()

    def summarize(self) -> None:
        if self._latencies:
            lat = np.concatenate(self._latencies)
            self.latency_p50_s, self.latency_p99_s = (float(x) for x in np.percentile(lat, [50, 99]))
            self.latency_max_s = float(lat.max())

    def write(self, path: Path | None) -> None:
        if path is None:
            return
        self.summarize()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: v for k, v in asdict(self).items() if not k.startswith("_")}))
        tmp.replace(path)


class InfluxSink:
    """One sink worker: a Kafka consumer group member feeding one InfluxWriter."""

    def __init__(
        self,
        settings: Settings,
        writer: InfluxWriter,
        dlq: Publisher,
        stats_file: Path | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.settings = settings
        self.writer = writer
        self.dlq = dlq
        self.stats = SinkStats()
        self.stats_file = stats_file
        self.clock = clock
        self.consumer = Consumer(
            {
                **settings.kafka.client_config(),
                "group.id": f"{settings.group_prefix}-sink-influxdb",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "max.poll.interval.ms": 600_000,
                "session.timeout.ms": int(settings.kafka.session_timeout_s * 1000),
                "fetch.wait.max.ms": 50,
            }
        )
        self.consumer.subscribe([settings.topics.interpreted], on_assign=self._on_assign)
        self._pending: list[Message] = []
        self._decoded: list[InterpretedBatch] = []
        self._letters: list[DeadLetter] = []
        self._points = 0
        self._first_pending = 0.0

    def run(self, stop: threading.Event) -> None:
        cfg = self.settings.influxdb
        last_stats = time.monotonic()
        try:
            while not stop.is_set():
                for msg in self.consumer.consume(num_messages=1000, timeout=0.05):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("consume error: %s", err)
                        continue
                    self._add(msg)
                due = self._pending and (
                    self._points >= cfg.batch_size or time.monotonic() - self._first_pending >= cfg.flush_interval_s
                )
                if due:
                    self.flush(stop)
                if time.monotonic() - last_stats >= 1.0:
                    self.stats.write(self.stats_file)
                    last_stats = time.monotonic()
            self.flush(stop, draining=True)
        finally:
            self.consumer.close()
            self.dlq.close()
            self.stats.write(self.stats_file)

    def _on_assign(self, _consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        self.stats.assigned = True
        self.stats.write(self.stats_file)

    def _add(self, msg: Message) -> None:
        if not self._pending:
            self._first_pending = time.monotonic()
        self._pending.append(msg)
        try:
            batch = decode_interpreted(msg.value() or b"")
        except DecodeError as exc:
            self._letters.append(self._letter(msg, exc.reason, exc.detail))
            return
        self._decoded.append(batch)
        self._points += len(batch.events)

    def flush(self, stop: threading.Event, draining: bool = False) -> bool:
        """Write what is pending, then commit it; returns False if it gave up (only while draining)."""
        if not self._pending:
            return True
        messages, batches, letters = self._pending, self._decoded, self._letters
        lines = batch_lines(batches)
        try:
            if not self._write_with_retry(lines, stop, draining):
                return False
        except PermanentWriteError as exc:
            log.error("InfluxDB rejected a batch of %d points: %s", len(lines), exc)
            letters.extend(self._letter(m, "influxdb_rejected", str(exc)) for m in messages)
            lines, batches = [], []
        ack_ns = self.clock()
        if batches:
            self.stats.record_latency(
                ack_ns, np.fromiter((e.sample.ts_ns for b in batches for e in b.events), np.int64)
            )
        for letter in letters:
            self.dlq.publish(self.settings.topics.dead_letter, letter.key, letter.value, letter.headers)
        if letters and self.dlq.flush(60.0):
            raise RuntimeError("dead letters could not be delivered; not committing")
        self._commit(messages)
        self._pending, self._decoded, self._letters, self._points = [], [], [], 0
        self.stats.messages += len(messages)
        self.stats.points_written += len(lines)
        self.stats.dead_lettered += len(letters)
        self.stats.batches += 1
        return True

    def _letter(self, msg: Message, reason: str, detail: str) -> DeadLetter:
        source = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        return dead_letter(msg.key(), msg.value() or b"", reason, detail, STAGE, source)

    def _write_with_retry(self, lines: list[str], stop: threading.Event, draining: bool) -> bool:
        delay, attempt, paused = 0.2, 0, False
        give_up_at = time.monotonic() + 30.0 if draining else None
        try:
            while True:
                try:
                    self.writer.write(lines)
                    return True
                except TransientWriteError as exc:
                    attempt += 1
                    self.stats.write_retries += 1
                    if attempt == 1 or attempt % 10 == 0:
                        log.warning("InfluxDB write failed (attempt %d), retrying: %s", attempt, exc)
                    if not paused:
                        self.consumer.pause(self.consumer.assignment())
                        paused = True
                    wait = delay * (0.5 + random.random())
                    end = time.monotonic() + wait
                    while time.monotonic() < end:
                        self.consumer.poll(0.1)  # keeps group membership alive while paused
                        if give_up_at is None and stop.is_set():
                            give_up_at = time.monotonic() + 30.0
                    if give_up_at is not None and time.monotonic() > give_up_at:
                        log.error("giving up on %d points at shutdown; they stay uncommitted in Kafka", len(lines))
                        return False
                    delay = min(delay * 2, 10.0)
        finally:
            if paused:
                self.consumer.resume(self.consumer.assignment())

    def _commit(self, messages: list[Message]) -> None:
        offsets: dict[tuple[str, int], int] = {}
        for msg in messages:
            key = (str(msg.topic()), int(msg.partition() or 0))
            offsets[key] = max(offsets.get(key, -1), int(msg.offset() or 0))
        try:
            self.consumer.commit(
                offsets=[TopicPartition(t, p, o + 1) for (t, p), o in offsets.items()], asynchronous=False
            )
            self.stats.commits += 1
        except Exception as exc:  # e.g. partitions revoked meanwhile: they will be re-read, and overwrite
            log.warning("offset commit failed (%s); those messages will be replayed idempotently", exc)
