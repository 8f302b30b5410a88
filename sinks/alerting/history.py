"""Notification history: every delivery attempt and every suppressed notification, as InfluxDB points.

Measurement ``notification``:
  tags   ``cluster``, ``receiver_kind`` (webhook/slack/email/kafka, ``-`` for suppressed ones), ``subscription``
         (id), ``detector``, ``status`` (firing/resolved), ``outcome`` (delivered / retrying / failed /
         suppressed-silence / suppressed-inhibited / suppressed-maintenance / damped). All bounded.
  fields ``dedup_key``, ``fingerprint``, ``attempt``, ``http_status``, ``error``, ``latency_ms``, ``group_key``,
         ``summary``, ``receiver`` (who was told, without secrets or URL paths), ``owner``, ``delivery_id``,
         ``reason`` (firing/resolved/repeat/flap-summary).
One point per alert per attempt. Points of one series that would share a millisecond are moved apart by 1 ms
(InfluxDB would merge them), so every attempt is kept.

The writer is a thread with a bounded queue; InfluxDB being down is retried with backoff (history waits,
notifications do not).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Final

from pipeline.errors import PermanentWriteError, TransientWriteError
from sinks.influxdb.lines import string_field, tag
from sinks.influxdb.write import InfluxWriter

log = logging.getLogger(__name__)

MEASUREMENT: Final = "notification"
OUTCOMES: Final = (
    "delivered", "retrying", "failed", "suppressed-silence", "suppressed-inhibited", "suppressed-maintenance", "damped"
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class NotificationRecord:
    ts_ns: int
    cluster: str
    receiver_kind: str
    subscription: str
    detector: str
    status: str
    outcome: str
    dedup_key: str
    fingerprint: str
    group_key: str
    summary: str
    receiver: str
    owner: str
    reason: str
    attempt: int = 0
    http_status: int = 0
    error: str = ""
    latency_ms: float = 0.0
    delivery_id: str = ""


def notification_line(r: NotificationRecord, ts_ms: int) -> str:
    tags = (
        f"cluster={tag(r.cluster) or '-'},detector={tag(r.detector) or '-'},outcome={r.outcome},"
        f"receiver_kind={tag(r.receiver_kind)},status={r.status},subscription={tag(r.subscription)}"
    )
    fields = (
        f"dedup_key={string_field(r.dedup_key)},fingerprint={string_field(r.fingerprint)},attempt={r.attempt}i,"
        f"http_status={r.http_status}i,error={string_field(r.error)},latency_ms={float(r.latency_ms)!r},"
        f"group_key={string_field(r.group_key)},summary={string_field(r.summary)},receiver={string_field(r.receiver)},"
        f"owner={string_field(r.owner)},delivery_id={string_field(r.delivery_id)},reason={string_field(r.reason)}"
    )
    return f"{MEASUREMENT},{tags} {fields} {ts_ms}"


class UniqueTimes:
    """Millisecond timestamps, moved 1 ms later when a series already has a point at that millisecond."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], int] = {}

    def lines(self, records: list[NotificationRecord]) -> list[str]:
        out = []
        for r in records:
            series = (r.cluster, r.receiver_kind, r.subscription, r.detector, r.status, r.outcome)
            ts = max(r.ts_ns // 1_000_000, self._last.get(series, -1) + 1)
            self._last[series] = ts
            out.append(notification_line(r, ts))
        if len(self._last) > 100_000:
            self._last.clear()  # only neighbours within a millisecond matter
        return out


class HistoryWriter:
    """Writes records in batches from a thread; ``close`` flushes (giving up after ``grace_s``)."""

    def __init__(self, writer: InfluxWriter, max_queue: int = 100_000) -> None:
        self._writer = writer
        self._queue: queue.Queue[NotificationRecord] = queue.Queue(max_queue)
        self._times = UniqueTimes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="alert-history", daemon=True)
        self.written = 0
        self.dropped = 0
        self.retries = 0
        self._give_up = float("inf")
        self._thread.start()

    def add(self, records: list[NotificationRecord]) -> None:
        for r in records:
            try:
                self._queue.put_nowait(r)
            except queue.Full:
                self.dropped += 1  # counted and logged; notifications themselves are never held up by history
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.error("history queue full: %d notification records dropped", self.dropped)

    def pending(self) -> int:
        return self._queue.qsize()

    def _run(self) -> None:
        delay = 0.2
        batch: list[NotificationRecord] = []
        while True:
            if not batch:
                try:
                    batch.append(self._queue.get(timeout=0.2))
                except queue.Empty:
                    if self._stop.is_set():
                        return
                    continue
                while len(batch) < 5000:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
            lines = self._times.lines(batch)
            try:
                self._writer.write(lines)
                self.written += len(batch)
                batch, delay = [], 0.2
            except PermanentWriteError as exc:
                log.error("InfluxDB rejected %d history points: %s", len(batch), exc)
                self.dropped += len(batch)
                batch = []
            except TransientWriteError as exc:
                self.retries += 1
                if self._stop.is_set() and time.monotonic() > self._give_up:
                    log.error("InfluxDB unreachable at shutdown: %d history points not written (%s)", len(batch), exc)
                    self.dropped += len(batch) + self._queue.qsize()
                    return
                if self.retries == 1 or self.retries % 10 == 0:
                    log.warning("history write failed, retrying: %s", exc)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 10.0)

    def close(self, grace_s: float = 10.0) -> None:
        self._give_up = time.monotonic() + grace_s
        self._stop.set()
        self._thread.join(grace_s + 15)
