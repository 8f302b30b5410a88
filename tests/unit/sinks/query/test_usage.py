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
        UsageSample(
            f"G{g}", H100, f"j{g % 2}", "bert-training", (10 + m % 10) * GIB, 40.0 + m % 20, 200.0 + m, samples=60.0
        )  # 1 Hz: 60 samples a minute
        for g in range(4)
        for m in range(120)
    ] + [UsageSample("G9", H100, None, "bert-training", 5 * GIB, 10.0, 100.0, samples=60.0) for _ in range(60)]
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


def test_a_sample_stands_for_its_gpus_sampling_interval() -> None:
    """The one GPU-hour (pipeline.usage): samples times the GPU's interval, the setting where it stored none. A GPU
    sampled every 5 minutes has a minute row every 5 minutes with one sample: 300 s each; one sampled every 57 s
    has one sample in (almost) every minute: 57 s each, not a whole minute; a job that starts mid-minute counts
    its samples, not the whole first minute."""
    from pipeline.usage import gpu_hours

    assert gpu_hours(120, 30.0) == 1.0
    rows = [UsageSample("slow", H100, "j", "llm-serving", GIB, 50.0, 300.0) for _ in range(12)]
    rows += [UsageSample("fast", H100, "j", "llm-serving", GIB, 50.0, 300.0) for _ in range(60)]
    rows += [UsageSample("late", H100, "j", "llm-serving", GIB, 50.0, 300.0, samples=20.0)]  # started at :40
    limits = {"slow": GpuLimits(80.0 * GIB, 700.0, 300.0), "fast": GpuLimits(80.0 * GIB, 700.0, 57.0)}
    (job,) = usage_stats(rows, limits, "job", default_interval_s=1.0)
    assert job.gpu_hours == pytest.approx((12 * 300 + 60 * 57 + 20 * 1) / 3600)
    idle = [UsageSample("fast", H100, "j", "llm-serving", GIB, 1.0, 300.0, samples=2.0)] * 3
    (quiet,) = usage_stats(idle, limits, "job")
    assert quiet.idle_gpu_hours == quiet.gpu_hours == pytest.approx(3 * 2 * 57 / 3600)


def test_the_job_summaries_count_samples_times_their_interval() -> None:
    from sinks.query.flux import jobs_range_flux

    flux = jobs_range_flux("raw", "raw_jobs", "org", ("power_watts",), 1.0, 0, 600 * 10**9)
    assert "_value: 1.0, gpu: r.gpu" in flux and "l._value * (if exists r._value then r._value else 1.0)" in flux


def test_rightsize_reads_each_minutes_sample_count() -> None:
    from datetime import UTC, datetime

    from sinks.query.usage import samples_from_rows

    t = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
    minutes = [{"gpu": "G", "_time": t, "application": "llm-serving", "memory_used_bytes": 1.0,
                "utilization_gpu_percent": 50.0}]  # fmt: skip
    jobs = [{"gpu": "G", "_time": t, "_value": "j"}]
    counts = [{"gpu": "G", "_time": t, "application": "llm-serving", "_value": 37}]
    (row,) = samples_from_rows(minutes, jobs, True, counts)
    assert row.samples == 37.0 and row.job_id == "j"
    assert "fn: count" in UsageQuery("1h").counts_flux("b")


def test_wasted_samples_are_those_of_minutes_whose_peak_stayed_under_the_threshold() -> None:
    from sinks.query.model import AggRow
    from sinks.query.rank import _samples_per_gpu

    tags = (("cluster", "c"), ("node", "n"), ("gpu", "G"), ("gpu_model", H100))
    windows = [(0.0, 60.0), (4.0, 60.0), (5.0, 60.0), (80.0, 30.0), (None, 0.0)]
    rows = [AggRow(i, tags, (p, n, 0.5)) for i, (p, n) in enumerate(windows)]
    held, low = _samples_per_gpu(rows, 5.0)
    assert held == {"G": (dict(tags), 210.0, 0.5)}  # a window without a utilization holds no sample
    assert low == {"G": 120.0}


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
