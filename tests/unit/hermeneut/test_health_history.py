"""``hermeneut health`` of the past: the time grammar of --at / --range, the findings open at or over a time from
stored finding points (pure), and an empty selection that says it is empty instead of 'every GPU is healthy'."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from hermeneut.views.health import HealthQuery, health_json, past_of
from pipeline.errors import InvalidQuery
from pipeline.health.fold import assess
from sinks.query.fleet import findings_open

S = 10**9
NOW = 1_800_000_000 * S
T0 = 1_750_000_000 * S  # 2025-06-15T15:06:40Z


def test_at_and_range_take_times_and_durations_ago() -> None:
    assert past_of(None, None, NOW) == (None, None)
    assert past_of("2025-06-15T15:06:40Z", None, NOW) == (None, T0)
    assert past_of("3d", None, NOW) == (None, NOW - 3 * 86_400 * S)
    assert past_of(None, "7d..6d", NOW) == (NOW - 7 * 86_400 * S, NOW - 6 * 86_400 * S)
    assert past_of(None, "2025-06-15T15:06:40Z..2025-06-15T16:06:40Z", NOW) == (T0, T0 + 3600 * S)
    assert past_of(None, "6h", NOW) == (NOW - 6 * 3600 * S, NOW)
    for at, range_, message in [("1d", "2d", "not both"), (None, "1d..2d", "before its end"), ("soon", None, "--at")]:
        with pytest.raises(InvalidQuery, match=message):
            past_of(at, range_, NOW)


@pytest.mark.parametrize(
    ("at", "range_", "message"),
    [
        ("", None, "at '' is not a duration"),
        ("3d\n", None, "white space around it"),
        (" 3d", None, "white space around it"),
        ("2025-06-15T15:06:40Z\n", None, "is not a time like"),  # fullmatch: a trailing line break is refused
        ("2025-06-15T15:06:40+0200", None, "is not a time like"),
        ("2025-W24-1", None, "is not a time like"),
        ("2025-13-40T99:99:99Z", None, "is not a time like"),
        ("0001-01-01", None, "not between 1970 and 2262"),
        ("9999-12-31T23:59:59Z", None, "not between 1970 and 2262"),
        ("3d", "1d", "not both"),
        (None, "", "range '' is not a duration"),
        (None, "6h\n", "white space around it"),
        (None, "1d..", "range end '' is not a duration"),
        (None, "2025-06-15..2025-06-14", "its start must be before its end"),
        (None, "7d..6d..5d", "range end '6d..5d' is not a duration"),
    ],
)  # fmt: skip
def test_the_http_names_and_strict_grammar(at: str | None, range_: str | None, message: str) -> None:
    """The HTTP API's ``at``/``range`` take the same grammar, named as the API names them, matched whole."""
    with pytest.raises(InvalidQuery, match=message) as refused:
        past_of(at, range_, NOW, ("at", "range"))
    assert "--" not in str(refused.value)


def test_an_instant_and_a_span_in_the_http_names() -> None:
    assert past_of("2025-06-15T17:06:40+02:00", None, NOW, ("at", "range")) == (None, T0)
    assert past_of("2025-06-15 15:06:40.5", None, NOW, ("at", "range")) == (None, T0 + S // 2)
    assert past_of(None, "2025-06-15T15:06:40Z..1h", NOW, ("at", "range")) == (T0, NOW - 3600 * S)


def point(
    t_s: int, active: bool, since_s: int, detector: str = "ecc-uncorrectable", gpu: str = "GPU-a"
) -> dict[str, Any]:
    return {"_time": datetime.fromtimestamp(T0 / S + t_s, UTC), "cluster": "c", "node": "n1", "gpu": gpu,
            "detector": detector, "severity": "critical", "active": float(active), "since_ns": float(T0 + since_s * S),
            "summary": f"{detector} on {gpu}"}  # fmt: skip


def test_findings_open_at_an_instant_and_over_a_range() -> None:
    points = [
        point(0, True, 0), point(60, True, 0),  # ECC: open, then its node went dark (no clear)
        point(100, True, 100, "thermal-throttling", "GPU-b"), point(400, False, 100, "thermal-throttling", "GPU-b"),
        point(500, True, 500, "xid", "GPU-c"),
    ]  # fmt: skip
    at_300 = findings_open(points[:4], T0 + 300 * S, T0 + 300 * S, 180 * S)
    assert sorted(f.labels["detector"] for f in at_300) == ["ecc-uncorrectable", "thermal-throttling"]
    ecc = next(f for f in at_300 if f.labels["detector"] == "ecc-uncorrectable")
    assert ecc.stale_since_ns == T0 + 60 * S  # silent since its last point: stale, still open
    # at 450 the throttling had cleared (its clear is the last point before): no longer open
    at_450 = findings_open(points[:4], T0 + 450 * S, T0 + 450 * S, 180 * S)
    assert [f.labels["detector"] for f in at_450] == ["ecc-uncorrectable"]
    # over 200..450 it was open for a while: it counts, and says when it cleared
    over = findings_open(points[:4], T0 + 200 * S, T0 + 450 * S, 180 * S)
    throttled = next(f for f in over if f.labels["detector"] == "thermal-throttling")
    assert "(cleared at " in throttled.summary and throttled.stale_since_ns == 0
    # a cleared episode that closed before the range is not in it
    assert [f.labels["detector"] for f in findings_open(points, T0 + 450 * S, T0 + 600 * S, 180 * S)] == [
        "ecc-uncorrectable", "xid"
    ]  # fmt: skip


def test_an_empty_selection_says_so() -> None:
    q = HealthQuery(cluster="c", start_ns=T0, stop_ns=T0 + 3600 * S)
    data = health_json(assess([], [], T0 + 3600 * S), q)
    assert data["empty"] is True and data["gpus_by_state"]["healthy"] == 0
    assert data["empty_selection"] == q.describe(T0 + 3600 * S)
    now = health_json(assess([], [], T0), HealthQuery(lookback_s=3600.0))
    assert now["empty_selection"] == "no GPU of the fleet reported in the last 3600 s, and no finding names one"
    assert q.describe(T0 + 3600 * S) == (
        "no GPU of cluster c reported between 2025-06-15T15:06:40Z and 2025-06-15T16:06:40Z, and no finding names one"
    )
    one = health_json(assess([], [("c", "n1", "GPU-a", T0 + 3500 * S)], T0 + 3600 * S), q)
    assert one["empty"] is False and one["empty_selection"] is None and one["gpus_by_state"]["healthy"] == 1
    with pytest.raises(InvalidQuery, match="range is empty"):
        HealthQuery(start_ns=T0, stop_ns=T0).validate()
