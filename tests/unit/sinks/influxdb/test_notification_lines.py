"""Notification history records: what the alert manager publishes and the InfluxDB sink stores as ``notification``
points, every attempt kept."""

from __future__ import annotations

import dataclasses

from pipeline.codec import decode_record, encode_record
from pipeline.notifications import NotificationRecord, UniqueTimes
from sinks.influxdb.lines import notification_line


def _record(ts_ns: int = 1_700_000_000_123_456_789) -> NotificationRecord:
    return NotificationRecord(
        ts_ns,
        "c1",
        "webhook",
        "sub1",
        "thermal-throttling",
        "firing",
        "retrying",
        "thermal-throttling/c1/n1/GPU-1",
        "abcd",
        '{cluster="c1"}',
        'GPU "1" hot',
        "webhook http://127.0.0.1:9",
        "alice",
        "firing",
        attempt=2,
        http_status=503,
        error="HTTP 503",
        latency_ms=1.5,
    )


def test_records_of_one_series_in_one_millisecond_each_get_their_own_and_keep_it_on_the_wire() -> None:
    rec = _record()
    times = UniqueTimes()
    first, second = times([rec, rec])
    third = times([_record(rec.ts_ns + 500_000)])[0]  # later in the same millisecond: after the second
    assert [r.ts_ns // 1_000_000 for r in (first, second, third)] == [1700000000123, 1700000000124, 1700000000125]
    other = times([dataclasses.replace(rec, outcome="delivered")])[0]
    assert other.ts_ns == rec.ts_ns  # another series: its own time
    assert decode_record(NotificationRecord, encode_record(second)) == second


def test_a_record_is_one_notification_point_at_its_time() -> None:
    line = notification_line(UniqueTimes()([_record()])[0])
    assert line.startswith(
        "notification,cluster=c1,detector=thermal-throttling,outcome=retrying,receiver_kind=webhook,"
        "status=firing,subscription=sub1 "
    )
    assert 'summary="GPU \\"1\\" hot"' in line and "attempt=2i" in line and "http_status=503i" in line
    assert line.endswith(" 1700000000123")
