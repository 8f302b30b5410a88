"""Notification history: what the alert manager did with each notification, as records on a topic.

Every delivery attempt and every notification held back becomes a :class:`NotificationRecord` on
``topics.notification_history``; the InfluxDB sink stores them (measurement ``notification``,
``sinks/influxdb/lines.py``) like everything else, committing after its flush. One record per alert per attempt.

Points of one series that would share a millisecond are merged by InfluxDB, so the manager moves each record 1 ms
after the last one of its series (:class:`UniqueTimes`) before it publishes it: the record carries the time it is
stored at, and a record read again is the same point.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

#: what became of a notification: ``receiver_kind`` is ``-`` for the held ones (all but the first three)
OUTCOMES: Final = (
    "delivered", "retrying", "failed", "suppressed-silence", "suppressed-inhibited", "suppressed-maintenance", "damped"
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class NotificationRecord:
    """One attempt to deliver a notification of one alert, or one notification held back (``outcome``).

    Stored with tags ``cluster``, ``receiver_kind`` (webhook/slack/email/kafka, ``-``), ``subscription`` (id),
    ``detector``, ``status`` (firing/resolved) and ``outcome``, all bounded; the rest are fields. ``receiver``
    names who was told without secrets or URL paths; ``reason``: firing/resolved/repeat/flap-summary, or why it
    was held."""

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

    @property
    def series(self) -> tuple[str, ...]:
        """The tags that make its InfluxDB series."""
        return (self.cluster, self.receiver_kind, self.subscription, self.detector, self.status, self.outcome)


class UniqueTimes:
    """Records moved to a millisecond of their own within their series (1 ms after its last one where they would
    share it), so InfluxDB keeps every attempt."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], int] = {}

    def __call__(self, records: list[NotificationRecord]) -> list[NotificationRecord]:
        out = []
        for r in records:
            ms = max(r.ts_ns // 1_000_000, self._last.get(r.series, -1) + 1)
            self._last[r.series] = ms
            out.append(r if ms == r.ts_ns // 1_000_000 else dataclasses.replace(r, ts_ns=ms * 1_000_000))
        if len(self._last) > 100_000:
            self._last.clear()  # only neighbours within a millisecond matter
        return out
