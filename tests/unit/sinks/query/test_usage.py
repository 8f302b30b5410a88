"""Right-sizing's inputs: usage statistics from GPU-minutes, and the query layer's validation of what a user can ask
(the advice itself: tests/unit/processors/test_rightsize.py)."""

from __future__ import annotations

import pytest

from pipeline.errors import InvalidQuery
from pipeline.usage import GpuLimits, UsageSample, usage_stats
from sinks.query.usage import UsageQuery

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"


def test_usage_stats_per_job_and_per_application() -> None:
    rows = [
        UsageSample(f"G{g}", H100, f"j{g % 2}", "bert-training", (10 + m % 10) * GIB, 40.0 + m % 20, 200.0 + m)
        for g in range(4)
        for m in range(120)
    ] + [UsageSample("G9", H100, None, "bert-training", 5 * GIB, 10.0, 100.0) for _ in range(60)]
    limits = {f"G{g}": GpuLimits(80.0 * GIB, 700.0) for g in (0, 1, 2, 3, 9)}
    jobs = usage_stats(rows, limits, "job")
    assert [(u.key, u.gpus, u.gpu_hours) for u in jobs] == [("j0", 2, 4.0), ("j1", 2, 4.0)]
    j0 = jobs[0]
    assert j0.memory_peak_bytes == 19 * GIB and j0.memory_total_bytes == 80 * GIB and j0.power_limit_watts == 700
    assert j0.utilization_p95_percent == pytest.approx(58.0, abs=0.1)
    (app,) = usage_stats(rows, limits, "application")
    assert app.key == "bert-training" and app.runs == 2 and app.gpus == 5 and app.gpu_hours == 9.0
    with pytest.raises(ValueError):
        usage_stats(rows, limits, "node")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (UsageQuery(range="7 days"), "not a duration"),
        (UsageQuery(job='x") |> drop()'), "job id"),
        (UsageQuery(application="crypto"), "not one of"),
        (UsageQuery(job="j", application="llm-serving"), "not both"),
    ],
)
def test_query_rejects_what_could_inject_flux(query: UsageQuery, message: str) -> None:
    with pytest.raises(InvalidQuery, match=message):
        query.minutes_flux("b")


def test_query_filters() -> None:
    flux = UsageQuery("2d", job="train-42").jobs_flux("telemetry")
    assert 'r._value == "train-42"' in flux and "range(start: -2d)" in flux
    flux = UsageQuery("1h", application="llm-serving").minutes_flux("telemetry")
    assert 'r.application == "llm-serving"' in flux and "aggregateWindow(every: 1m, fn: max" in flux


def test_a_row_stands_for_its_gpus_sampling_interval_when_that_is_longer_than_a_minute() -> None:
    # per-minute rows of a GPU sampled every 5 minutes: one row per 5 minutes, each 5 GPU-minutes; a GPU sampled
    # every 57 s has a row (almost) every minute, each one GPU-minute
    rows = [UsageSample("slow", H100, "j", "llm-serving", GIB, 50.0, 300.0) for _ in range(12)]
    rows += [UsageSample("fast", H100, "j", "llm-serving", GIB, 50.0, 300.0) for _ in range(60)]
    limits = {"slow": GpuLimits(80.0 * GIB, 700.0, 300.0), "fast": GpuLimits(80.0 * GIB, 700.0, 57.0)}
    (job,) = usage_stats(rows, limits, "job")
    assert job.gpu_hours == pytest.approx((12 * 5 + 60) / 60)


def test_one_gpu_hour_definition_minutes_with_a_sample() -> None:
    from pipeline.usage import gpu_hours, gpu_minutes

    assert gpu_minutes(None) == gpu_minutes(0.0) == gpu_minutes(1.0) == gpu_minutes(60.0) == 1.0
    assert gpu_minutes(300.0) == 5.0  # a row every 5 minutes stands for 5 of them
    assert gpu_hours(120, 10.0) == 2.0 and gpu_hours(12, 300.0) == 1.0


def test_the_job_summaries_count_minutes_not_samples() -> None:
    from sinks.query.flux import jobs_range_flux

    flux = jobs_range_flux("raw", "raw_jobs", "org", ("power_watts",), 1.0, 0, 600 * 10**9)
    # one per GPU and minute, then each minute times its GPU's interval where that is longer than 60 s
    assert 'unique(column: "m")' in flux and "date.truncate(t: r._time, unit: 1m)" in flux
    assert "if seconds > 60.0 then seconds else 60.0" in flux


def test_wasted_minutes_are_those_whose_peak_stayed_under_the_threshold() -> None:
    from sinks.query.model import AggRow
    from sinks.query.rank import _minutes_per_gpu

    tags = (("cluster", "c"), ("node", "n"), ("gpu", "G"), ("gpu_model", H100))
    peaks = [0.0, 4.0, 5.0, 80.0, None]
    rows = [AggRow(i, tags, (p, 0.5)) for i, p in enumerate(peaks)]
    minutes, low = _minutes_per_gpu(rows, 5.0)
    assert minutes == {"G": (dict(tags), 4.0, 0.5)}  # a window without a utilization is no minute
    assert low == {"G": 2.0}


def test_top_lists_read_the_rollups_beyond_three_hours() -> None:
    from sinks.query.model import TimeRange
    from sinks.query.rank import TOP_RAW_MAX_NS
    from sinks.query.store import Store

    store = Store("http://127.0.0.1:9", "token", "org", "b")  # connects to nothing until asked
    store._buckets_seen[store.buckets.rollup] = True
    now, hour = 1_800_000_000 * 10**9, 3600 * 10**9
    assert store.source(TimeRange(now - 2 * hour, now), now, None, TOP_RAW_MAX_NS) == "raw"
    assert store.source(TimeRange(now - 4 * hour, now), now, None, TOP_RAW_MAX_NS) == "1m"
    assert store.source(TimeRange(now - 4 * hour, now), now, None) == "raw"  # other questions: from 2 days on
    assert store.source(TimeRange(now - 4 * hour, now), now, "job ids", TOP_RAW_MAX_NS) == "raw"
    store.close()
