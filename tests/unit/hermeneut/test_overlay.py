"""Faults laid over a real trace (hermeneut/jobs/overlay.py): the trace read through the table importer, sampled as
a poller would read it, and each overlay changing exactly what its ground truth says, where and when it says so."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hermeneut.jobs.overlay import (
    BASE_DIP_SHARE,
    CLASSES,
    DIP_POWER,
    MEMORY,
    POWER,
    UTIL,
    Trace,
    Truth,
    busy_span,
    computing_from,
    invisible,
    overlay,
    plan,
    power_limit_w,
    read_trace,
    resample,
)
from producers.importers.rows import Rows
from tests import TESTDATA

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
_S = 1_000_000_000


@pytest.fixture(scope="module")
def trace() -> Trace:
    return read_trace(NANOGPT / "gpu_metrics_f4f827dd.csv", NANOGPT / "mapping.toml")


def _rows(ts_s: list[float], gpus: int = 2, util: float = 100.0, power: float = 600.0) -> Rows:
    """Hand-made rows: every GPU at every time, the same readings."""
    n = len(ts_s) * gpus
    uuids = tuple(f"g{i % gpus}" for i in range(n))
    return Rows(
        node=("n",) * n,
        gpu_uuid=uuids,
        gpu_index=tuple(i % gpus for i in range(n)),
        gpu_model=("NVIDIA H100 80GB HBM3",) * n,
        ts_ns=np.repeat(np.array([round(t * _S) for t in ts_s], dtype=np.int64), gpus),
        metrics={UTIL: np.full(n, util), POWER: np.full(n, power), MEMORY: np.full(n, 10e9)},
        origin=("x",) * n,
        original=(b"",) * n,
    )


def test_the_nanogpt_trace_is_read_through_the_importer_and_its_busy_span_found(trace: Trace) -> None:
    assert len(trace.rows) == 6240 and len(trace.gpus) == 8 and trace.job == "nanogpt-pr643"
    assert trace.median_interval_s() == pytest.approx(0.33, abs=0.01)
    start, end = busy_span(trace.rows)
    # README: all GPUs at 100% from 03:42:22 to 03:45:58 (first sample 03:41:43.487)
    first = int(trace.rows.ts_ns.min())
    assert 37 <= (start - first) / _S <= 40 and 214 <= (end - start) / _S <= 218
    assert power_limit_w(trace) == 700.0  # the H100 SXM datasheet default (pipeline.catalogue)


def test_a_job_computes_from_its_first_busy_second_not_its_longest_stretchs_start() -> None:
    """Busy 0-9 s, a dip at 10 s, busy 11-39 s: the longest stretch starts at 11 s, the job computes from 0 s (a GPU
    slow from its first sample is timed from there: nanoGPT's co-located run gave negative delays otherwise)."""
    ts = [float(t) for t in range(40)]
    rows = _rows(ts)
    rows = dataclasses.replace(rows, metrics={**rows.metrics, UTIL: np.where(np.repeat(ts, 2) == 10.0, 0.0, 100.0)})
    first = int(rows.ts_ns.min())
    assert (busy_span(rows)[0] - first) // _S == 11
    assert computing_from(rows) == first
    idle_first = dataclasses.replace(rows, metrics={**rows.metrics, UTIL: np.where(np.repeat(ts, 2) < 5, 0.0, 100.0)})
    assert (computing_from(idle_first) - first) // _S == 5


def test_resampling_reads_the_newest_reading_of_each_tick_and_leaves_a_gap_where_there_is_none() -> None:
    rows = _rows([0.0, 0.3, 0.6, 0.9, 1.2, 3.5], gpus=1)
    rows = dataclasses.replace(rows, metrics={**rows.metrics, UTIL: np.arange(6, dtype=float)})
    out = resample(rows, 1.0)
    assert (out.ts_ns // _S).tolist() == [0, 1, 2]  # tick 3 s has no reading in (2, 3]; 3.5 s is after the last tick
    assert out.metrics[UTIL].tolist() == [0.0, 3.0, 4.0]  # newest at or before each tick, after the previous one


def test_resampling_the_real_trace_gives_one_row_per_gpu_and_tick(trace: Trace) -> None:
    """The shell loop that wrote the trace stalled twice for over 2 s (gaps of 2.08 and 2.31 s): a 1 s poller finds
    nothing new at 4 of its 266 ticks; from 10 s on every tick has a reading."""
    for interval, missing in ((1.0, 4), (10.0, 0), (30.0, 0), (60.0, 0)):
        out = resample(trace.rows, interval)
        ticks = np.unique(out.ts_ns)
        assert len(out) == 8 * len(ticks)
        assert np.all(np.diff(ticks) % round(interval * _S) == 0)
        every = int((trace.rows.ts_ns.max() - trace.rows.ts_ns.min()) // round(interval * _S)) + 1
        assert every - len(ticks) == missing


def test_a_straggler_scales_one_gpus_utilization_and_power_in_its_window_only() -> None:
    rows = _rows([float(t) for t in range(100)])
    truth = Truth("straggler", False, "g1", "j", 20 * _S, 60 * _S, 0.8)
    out = overlay(rows, truth, (0, 99 * _S))
    hit = (np.array(rows.gpu_uuid) == "g1") & (rows.ts_ns >= 20 * _S) & (rows.ts_ns < 60 * _S)
    assert np.allclose(out.metrics[UTIL][hit], 80.0) and np.allclose(out.metrics[POWER][hit], 480.0)
    assert np.array_equal(out.metrics[UTIL][~hit], rows.metrics[UTIL][~hit])
    assert truth.slower_pct() == pytest.approx((25.0, 20.0))
    assert rows.metrics[UTIL].min() == 100.0  # the input is not changed


def test_a_brake_holds_every_gpu_at_full_utilization_and_the_given_power() -> None:
    rows = _rows([float(t) for t in range(100)], util=97.0)
    out = overlay(rows, Truth("job-power-brake", False, None, "j", 10 * _S, 50 * _S, 0.45, 315.0), (0, 99 * _S))
    inside = (rows.ts_ns >= 10 * _S) & (rows.ts_ns < 50 * _S)
    assert np.all(out.metrics[POWER][inside] == 315.0) and np.all(out.metrics[UTIL][inside] == 100.0)
    assert np.all(out.metrics[POWER][~inside] == 600.0)


def test_starvation_idles_the_drawn_share_of_seconds_on_every_gpu_together() -> None:
    rows = _rows([t / 3 for t in range(3 * 1000)])
    truth = Truth("starvation", False, None, "j", 100 * _S, 900 * _S, 0.6, 70.0, seed=5)
    out = overlay(rows, truth, (0, 1000 * _S))
    idle = out.metrics[UTIL] == 0.0
    inside = (rows.ts_ns >= 100 * _S) & (rows.ts_ns < 900 * _S)
    assert not idle[~inside].any()
    assert idle[inside].mean() == pytest.approx(0.6, abs=0.05)
    assert np.all(out.metrics[POWER][idle] == 70.0)
    by_gpu = [idle[np.array(rows.gpu_uuid) == g] for g in ("g0", "g1")]
    assert np.array_equal(*by_gpu)  # the job waits together


def test_a_leak_grows_at_its_rate_and_its_quiet_version_is_one_step_then_flat() -> None:
    rows = _rows([float(t) for t in range(600)], gpus=1)
    total = 80e9
    leak = overlay(rows, Truth("memory-leak", False, "g0", "j", 60 * _S, 600 * _S, 0.02, total), (0, 600 * _S))
    grown = leak.metrics[MEMORY] - rows.metrics[MEMORY]
    per_min = np.diff(grown[(rows.ts_ns >= 60 * _S)]).mean() * 60
    assert per_min == pytest.approx(0.02 * total) and grown[rows.ts_ns < 60 * _S].max() == 0
    step = overlay(rows, Truth("memory-leak", True, "g0", "j", 60 * _S, 600 * _S, 0.02, total), (0, 600 * _S))
    after = step.metrics[MEMORY][rows.ts_ns >= 60 * _S]
    assert np.all(after == after[0]) and after[0] - 10e9 == pytest.approx(grown.max(), rel=0.01)


def test_a_gpu_that_stops_reporting_has_no_row_from_then_on() -> None:
    rows = _rows([float(t) for t in range(100)])
    out = overlay(rows, Truth("stops-reporting", False, "g1", "j", 40 * _S, 101 * _S, 0.0), (0, 99 * _S))
    gone = out.ts_ns[np.array(out.gpu_uuid) == "g1"]
    assert gone.max() == 39 * _S and len(out) == 100 + 40


def test_the_phase_mix_change_dips_ten_times_as_much_power_time_after_it() -> None:
    rows = _rows([t / 3 for t in range(3 * 3000)], gpus=1)
    change = 1000 * _S
    out = overlay(rows, Truth("phase-mix", False, None, "j", change, 3000 * _S, 10.0, seed=2), (0, 3000 * _S))
    dipped = np.isclose(out.metrics[POWER], 600.0 * DIP_POWER)
    before, after = dipped[rows.ts_ns < change].mean(), dipped[rows.ts_ns >= change].mean()
    assert before == pytest.approx(BASE_DIP_SHARE, abs=0.005) and after == pytest.approx(10 * BASE_DIP_SHARE, abs=0.02)
    assert np.all(out.metrics[UTIL] == 100.0)  # utilization unchanged: a checkpoint's power dip


def test_the_plan_lays_every_visible_class_with_its_quiet_version_and_names_what_the_trace_cannot_show(
    trace: Trace,
) -> None:
    assert invisible(trace, 10.0) == {"memory-leak": "no column memory_used_bytes"}
    truths = plan(trace, 10.0)
    first, last = int(trace.rows.ts_ns.min()), int(trace.rows.ts_ns.max())
    for cls in CLASSES:
        faults = [t for t in truths if t.cls == cls and not t.quiet]
        quiet = [t for t in truths if t.cls == cls and t.quiet]
        if cls == "memory-leak":
            assert faults == quiet == []
            continue
        assert len(faults) >= 2 and quiet, cls
        assert all(first <= t.start_ns < t.end_ns and t.start_ns <= last for t in faults + quiet)
    assert len({(t.gpu_uuid, t.start_ns) for t in truths if t.cls == "straggler" and not t.quiet}) == 16
    # a trace sampled coarser than asked shows nothing at that interval, and says why
    assert set(invisible(trace, 0.1).values()) == {"the trace samples every 0.331 s, coarser than 0.1 s"}
