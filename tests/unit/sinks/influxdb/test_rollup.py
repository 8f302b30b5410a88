"""1-minute rollups in the stream: the same points as a direct computation over every sample of each minute, the
same whether computed live (messages across partitions, minutes spanning messages) or over history, and whole
after a crash in the middle of a minute (resumed from the committed offset and metadata). The stream's points
against the InfluxDB task of the previous version, on a real influxd, are in tests/integration/test_retention.py."""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest

from pipeline.codec import encode_samples
from pipeline.config import ValidationSettings
from pipeline.events import METRIC_INDEX, InterpretedBatch, Verdict, Workload
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan
from sinks.influxdb.lines import series_tags
from sinks.influxdb.rollup import IDLE_MIN, MINUTE_NS, MinuteRollups, SeriesIndex, rollup_lines, rollup_values
from sinks.influxdb.schema import ROLLUP_FIELDS

T0 = 1_800_000_030_000_000_000  # half a minute past a whole minute
Points = dict[tuple[str, int], dict[str, float]]


def _messages(seconds: int = 200, nodes: int = 3) -> list[tuple[int, InterpretedBatch]]:
    """(partition, batch) per node and 1-3 rounds, as the processor sends them, with verdicts and scores."""
    fleet = Fleet(nodes, 4, seed=5, faults=FaultPlan.for_evaluation(nodes, seconds, 3))
    rng = np.random.default_rng(1)
    out: list[tuple[int, InterpretedBatch]] = []
    r = 0
    while r < seconds:
        take = int(rng.integers(1, 4))
        msgs = [
            RawMessage(b.kafka_key, encode_samples(b), "t", i % 2)
            for t in range(r, min(r + take, seconds))
            for i, b in enumerate(fleet.tick(T0 + t * 10**9))
        ]
        for part, b in process_raw(msgs, T0 + seconds * 10**9, ValidationSettings()).forward:
            verdicts = tuple(Verdict(v) for v in rng.choice(["normal", "unusual", "anomalous", "unscored"], len(b)))
            out.append((part, replace(b, verdict=verdicts, score=rng.uniform(0, 5, len(b)))))
        r += take
    return out


def _points(lines: list[str]) -> Points:
    """Later writes of the same series and time overwrite earlier ones, as in InfluxDB."""
    out: Points = {}
    for line in lines:
        head, rest = re.split(r"(?<!\\) ", line, maxsplit=1)
        fields, ts = rest.rsplit(" ", 1)
        out[(head, int(ts))] = {k: float(v) for k, v in (f.split("=") for f in fields.split(","))}
    return out


def _expected(messages: list[tuple[int, InterpretedBatch]]) -> Points:
    rows: dict[tuple[str, int], list[tuple[np.ndarray, float, Verdict]]] = defaultdict(list)
    for _, b in messages:
        values = rollup_values(b)
        mask = b.metrics[:, METRIC_INDEX["throttle_reasons_mask"]]
        for i in range(len(b)):
            wl = b.workload[i]
            tags = series_tags(b.cluster[i], b.node[i], b.gpu_uuid[i], b.gpu_index[i], b.gpu_model[i],
                               wl.application if wl else None)  # fmt: skip
            minute = int(b.ts_ns[i]) // MINUTE_NS * 60_000
            rows[(f"gpu,{tags}", minute)].append((values[i], float(mask[i]), b.verdict[i]))
    out: Points = {}
    for key, got in rows.items():
        values = np.vstack([v for v, _, _ in got])
        point: dict[str, float] = {}
        for j, name in enumerate(ROLLUP_FIELDS):
            column = values[:, j][~np.isnan(values[:, j])]
            if len(column):
                point |= {f"{name}_mean": float(np.mean(column)), f"{name}_max": float(column.max()),
                          f"{name}_min": float(column.min()), f"{name}_count": float(len(column))}  # fmt: skip
        masks = [int(m) for _, m, _ in got if m == m]  # noqa: PLR0124
        counts = {
            "throttle_samples": len(masks),
            "throttled_samples": sum((m & ~0x113) != 0 for m in masks),
            "verdict_unusual": sum(v is Verdict.UNUSUAL for _, _, v in got),
            "verdict_anomalous": sum(v is Verdict.ANOMALOUS for _, _, v in got),
        }
        point |= {k: float(v) for k, v in counts.items() if v}
        out[key] = point
    return out


def _same(got: Points, want: Points) -> None:
    assert got.keys() == want.keys()
    for key, point in want.items():
        assert got[key].keys() == point.keys(), key
        for name, value in point.items():
            assert got[key][name] == pytest.approx(value, rel=1e-12), (key, name)


def _stream(messages: list[tuple[int, InterpretedBatch]]) -> tuple[list[str], MinuteRollups]:
    rollups, index, lines = MinuteRollups(), SeriesIndex(), []
    offsets: dict[int, int] = defaultdict(int)
    for part, b in messages:
        lines += rollups.add(b, index.of(b, rollups), part, offsets[part])
        offsets[part] += 1
    return lines, rollups


def test_stream_and_history_give_every_minute_of_every_series_exactly() -> None:
    messages = _messages()
    want = _expected(messages)
    _same(_points(rollup_lines(b for _, b in messages)), want)
    lines, rollups = _stream(messages)
    closed = _points(lines)
    # live, a minute is written once its partition is a minute further: all but the last two minutes
    newest = max(t for _, t in want)
    assert {k for k in want if k[1] < newest - 60_000} == set(closed)
    _same(closed, {k: v for k, v in want.items() if k in closed})
    _same(closed | _points(rollups.close_all()), want)
    assert rollups.stats.late_rows == 0


def test_a_restart_in_the_middle_of_a_minute_rebuilds_it_whole() -> None:
    messages = _messages()
    want = _expected(messages)
    offsets: dict[int, int] = defaultdict(int)
    positions = []
    for part, _ in messages:
        positions.append(offsets[part])
        offsets[part] += 1
    replayed = 0
    for crash_at in (7, len(messages) // 2, len(messages) - 5):
        # the first run: what it wrote until the crash, and what the runner committed (offset and metadata)
        written, first = _stream(messages[:crash_at])
        marks = first.mark()
        # the second run: each partition resumed, read again from its committed offset
        second, index = MinuteRollups(), SeriesIndex()
        for part in (0, 1):
            second.resume(part, marks[part][1] if part in marks else None)
        for (part, b), offset in zip(messages, positions, strict=True):
            if offset >= (marks[part][0] if part in marks else 0):
                written += second.add(b, index.of(b, second), part, offset)
        _same(_points(written + second.close_all()), want)
        assert second.stats.late_rows == 0
        replayed += second.stats.replayed_rows
    assert replayed  # rows of minutes written before the crash were read again, and skipped


def test_a_row_of_a_minute_already_written_is_counted_not_merged() -> None:
    messages = _messages(seconds=150, nodes=1)
    _, rollups = _stream(messages)
    part, last = messages[-1]
    stale = last.take(slice(0, 1))
    stale = replace(stale, ts_ns=stale.ts_ns - 120 * 10**9)
    assert rollups.add(stale, SeriesIndex().of(stale, rollups), part, 10_000) == []
    assert rollups.stats.late_rows == 1


def test_series_of_jobs_gone_by_are_released_and_their_indices_reused() -> None:
    """A GPU's series changes with its application: with a new application every minute for 25 minutes, the
    accumulators hold the series of the last minutes only (the soak's sink grew with every job a GPU ran), and
    every minute of every series is still written exactly."""
    messages = []
    for part, b in _messages(seconds=1500, nodes=1):
        apps = [f"app-{int(t) // MINUTE_NS}" for t in b.ts_ns]
        workload = tuple(Workload(application=a, source="manual") for a in apps)
        messages.append((part, replace(b, workload=workload)))
    want = _expected(messages)
    gpus = {uuid for _, b in messages for uuid in b.gpu_uuid}
    assert len({k[0] for k in want}) > 20 * len(gpus)  # a new series per GPU and minute
    lines, rollups = _stream(messages)
    assert 0 < rollups.live <= len(gpus) * (IDLE_MIN + 4)
    assert len(rollups._tags) <= len(gpus) * (IDLE_MIN + 4)  # indices reused, not appended
    _same(_points(lines + rollups.close_all()), want)


def test_a_gap_of_years_is_jumped_not_walked_and_the_minutes_before_it_are_written_whole() -> None:
    """A partition's next row 30 years on (a clock gone wrong that passed every check, or a partition quiet for
    long): the open minutes close in the time of a few, not one step per minute of the gap (walked, 30 days took
    4.3 s), their points are exact, and rows after the gap are rolled up, not counted late."""
    messages = _messages(seconds=130, nodes=1)
    lines, rollups = _stream(messages)
    part, last = messages[-1]
    ahead = replace(last, ts_ns=last.ts_ns + 30 * 365 * 86_400 * 10**9)
    index = SeriesIndex()
    started = time.perf_counter()
    lines += rollups.add(ahead, index.of(ahead, rollups), part, 10_000)
    took = time.perf_counter() - started
    assert took < 0.5, f"{took:.2f} s for a gap of 15.8 million minutes"
    _same(_points(lines), _expected(messages))  # every minute before the gap, written whole
    after = replace(ahead, ts_ns=ahead.ts_ns + 61 * 10**9)
    rollups.add(after, index.of(after, rollups), part, 10_001)
    assert rollups.stats.late_rows == 0
    assert len(_points(rollups.close_all())) == 2 * len(set(last.gpu_uuid))  # both minutes after the gap
