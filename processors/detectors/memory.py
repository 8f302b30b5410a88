"""Memory leaks: memory used that keeps growing at the same pace, told from a cache filling towards a plateau and
from a job's start-up allocations, by two routes (docs/detectors.md gives the numbers):

- *slow*: per-minute means of the memory used ratio, the growth of the last 4 minutes against the 4 before (a cache
  filling towards a plateau decelerates; a leak does not), held for ``leak_confirm_s``;
- *fast*: 10-s means on a straight line for 2 minutes (:func:`fast_leak`), not slowing down, full within
  ``leak_fast_full_s`` (at that pace the process runs out of memory before the slow route could confirm); the first
  minute after a job starts is start-up and not judged.

A job change or an OOM restart (memory falls well below its peak) starts a new history; the finding clears then,
or once the growth stopped for 2 minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.config import DetectorSettings
from pipeline.events import Finding, Severity
from processors.detectors.columns import REL, S, col, fmt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import GpuView
from processors.detectors.jobs import Boundaries
from processors.detectors.names import LEAK
from processors.episodes import Description, Episode
from processors.state import GpuSlots, column

#: slow leaks: 9 per-minute means (two 4-minute growths), at least 0.2% of the GPU's memory per minute
_MEM_RING: Final = 9
_LEAK_MIN_SLOPE: Final = 0.002 / 60
#: fast leaks: 12 means of 10 s (a 2-minute straight line), at least 1% of the GPU's memory per minute
_FAST_BUCKET_S: Final = 10
_FAST_RING: Final = 12
_FAST_MIN_SLOPE: Final = 0.01 / 60
#: the line must explain the growth (R^2), the second minute must grow at >= 0.95x the first (a cache filling
#: towards a plateau with a time constant under ~20 minutes slows down more than that; one with a longer time
#: constant is never projected full within 10 minutes), and no 10 s may fall
_FAST_R2: Final = 0.98
_FAST_KEEP_PACE: Final = 0.95
_FAST_MAX_DIP: Final = 0.002
#: the first minute after a job starts (or the GPU is first seen) is start-up: its allocations are not judged
_FAST_STARTUP_S: Final = 60


def fast_leak(
    ring: np.ndarray, full: np.ndarray, min_slope: float, max_full_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU, whether its memory is leaking fast: the 10-s means of the memory used ratio in ``ring`` (oldest
    first, the window complete) rise along a straight line that does not slow down and reaches ``full`` within
    ``max_full_s``. Returns (leaking, slope per second, projected seconds to full).

    Pure: a table of windows in, three arrays out.
    """
    k = ring.shape[1]
    x = np.arange(k, dtype=np.float64) * _FAST_BUCKET_S
    complete = ~np.isnan(ring).any(axis=1)
    y = np.where(complete[:, None], ring, 0.0)

    def slopes(part: np.ndarray, xs: np.ndarray) -> np.ndarray:
        xc = xs - xs.mean()
        return np.asarray((part - part.mean(axis=1, keepdims=True)) @ xc / (xc @ xc))

    slope = slopes(y, x)
    fitted = y.mean(axis=1, keepdims=True) + slope[:, None] * (x - x.mean())
    ss_tot = ((y - y.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    ss_res = ((y - fitted) ** 2).sum(axis=1)
    half = k // 2
    first, second = slopes(y[:, :half], x[:half]), slopes(y[:, half:], x[half:])
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = np.where(ss_tot > 0, 1.0 - ss_res / ss_tot, 0.0)
        to_full = np.where(slope > 0, (full - y[:, -1]) / slope, np.inf)
    leaking = (
        complete
        & (slope >= min_slope)
        & (r2 >= _FAST_R2)
        & (second >= _FAST_KEEP_PACE * first)
        & (np.diff(y, axis=1) > -_FAST_MAX_DIP).all(axis=1)
        & (to_full > 0)
        & (to_full <= max_full_s)
    )
    return leaking, np.where(complete, slope, np.nan), to_full


def accumulate(
    ring: np.ndarray,
    acc: np.ndarray,
    period: np.ndarray,
    g: np.ndarray,
    now: np.ndarray,
    y: np.ndarray,
    reset: np.ndarray,
) -> np.ndarray:
    """Add ``y`` to each GPU's sum for its current period (a minute, 10 s); a GPU entering a new period first
    closes its previous one into ``ring`` (missing periods as NaN). Returns which rows closed a period."""
    rolled = (period[g] >= 0) & (now > period[g]) & ~reset
    if rolled.any():
        rg = g[rolled]
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = acc[rg, 0] / acc[rg, 1]
        size = ring.shape[1]
        steps = np.clip(now[rolled] - period[rg], 1, size)
        window = ring[rg]
        for k in np.unique(steps).tolist():
            rows = steps == k
            shifted = np.full((int(rows.sum()), size), np.nan)
            keep = size - k
            shifted[:, :keep] = window[rows, k:]
            shifted[:, keep] = mean[rows]
            window[rows] = shifted
        ring[rg] = window
        acc[rg] = 0.0
    period[g] = now
    acc[g] += np.column_stack([y, np.ones_like(y)])
    return np.asarray(rolled)


def usable_ratio(m: np.ndarray) -> np.ndarray:
    """The share of each GPU's memory that processes can use (the driver reserves the rest; 1 where unknown)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        usable = 1.0 - col(m, "memory_reserved_bytes") / col(m, "memory_total_bytes")
    return np.where(np.isnan(usable), 1.0, usable)


@dataclass(eq=False)
class _History:
    """Per GPU: per-minute and 10-s means of its memory used ratio (oldest first) with the period being summed,
    and where its history and its growth began."""

    minutes: np.ndarray = column(np.nan, _MEM_RING)
    minute_sum: np.ndarray = column(0.0, 2)
    minute: np.ndarray = column(-1, dtype=np.int64)
    tens: np.ndarray = column(np.nan, _FAST_RING)
    ten_sum: np.ndarray = column(0.0, 2)
    ten: np.ndarray = column(-1, dtype=np.int64)
    origin: np.ndarray = column(-1, dtype=np.int64)
    peak: np.ndarray = column(0.0)
    growing_since: np.ndarray = column(-1, dtype=np.int64)
    stopped_since: np.ndarray = column(-1, dtype=np.int64)


class Memory:
    """The memory-leak finding per GPU (see module docstring)."""

    names = (LEAK,)

    def __init__(self, slots: GpuSlots, settings: DetectorSettings, jobs: Boundaries, report: Reporter) -> None:
        self.settings = settings
        self.jobs = jobs
        self.report = report
        self.history = slots.attach(_History())

    def step(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, rel: np.ndarray, out: list[Finding]) -> None:
        """One row per GPU ``g``."""
        h = self.history
        y = rel[:, REL["memory_used_ratio"]]
        ok = ~np.isnan(y)
        g, ts, y, m = g[ok], ts[ok], y[ok], m[ok]
        if not len(g):
            return
        reset = (self.jobs.job_ts[g] > h.origin[g]) | (y < h.peak[g] - 0.1)
        h.origin[g] = np.where(reset | (h.origin[g] < 0), ts, h.origin[g])
        h.minutes[g[reset]] = np.nan
        h.minute_sum[g[reset]] = 0.0
        h.tens[g[reset]] = np.nan
        h.ten_sum[g[reset]] = 0.0
        h.growing_since[g[reset]] = -1
        h.peak[g] = np.where(reset, y, np.maximum(h.peak[g], y))
        rolled = accumulate(h.minutes, h.minute_sum, h.minute, g, ts // (60 * S), y, reset)
        fast = accumulate(h.tens, h.ten_sum, h.ten, g, ts // (_FAST_BUCKET_S * S), y, reset)
        active = self.report.gpus.active(g, LEAK)
        clear = active & reset
        start = np.zeros(len(g), dtype=bool)
        rate = np.full(len(g), np.nan)  # growth per minute, of the route that found it
        since = np.full(len(g), -1, dtype=np.int64)  # when the growth it saw began
        if rolled.any():
            r = h.minutes[g[rolled]]
            recent, before = r[:, 8] - r[:, 4], r[:, 4] - r[:, 0]
            floor = 4 * _LEAK_MIN_SLOPE * 60
            # the last minute of 10-s means still grew: a fast leak found early keeps its finding
            last_minute = h.tens[g[rolled]]
            with np.errstate(invalid="ignore"):
                steady = (np.diff(r[:, 4:], axis=1) > -0.005).all(axis=1)
                growing = (recent >= floor) & (before >= floor) & (recent >= 0.8 * before) & steady & (r[:, 8] >= 0.15)
                still = growing | (last_minute[:, -1] - last_minute[:, -7] >= floor / 4)
            rg, rts = g[rolled], ts[rolled]
            growing_since = h.growing_since[rg]
            h.growing_since[rg] = np.where(growing, np.where(growing_since < 0, rts, growing_since), -1)
            stopped_since = h.stopped_since[rg]
            h.stopped_since[rg] = np.where(still, -1, np.where(stopped_since < 0, rts, stopped_since))
            confirmed = growing & (rts - h.growing_since[rg] >= self.settings.leak_confirm_s * S)
            stopped = ~still & (rts - h.stopped_since[rg] >= 120 * S)
            idx = np.flatnonzero(rolled)
            start[idx] = confirmed
            rate[idx] = recent / 4
            # the trend needs 8 minutes of growth before it holds
            since[idx] = h.growing_since[rg] - 8 * 60 * S
            clear[idx] |= stopped & active[rolled]
        if fast.any():
            hit, slope, _to_full = fast_leak(
                h.tens[g[fast]], usable_ratio(m[fast]), _FAST_MIN_SLOPE, self.settings.leak_fast_full_s
            )
            window_start = ts[fast] - (_FAST_RING + 1) * _FAST_BUCKET_S * S
            hit &= window_start - h.origin[g[fast]] >= _FAST_STARTUP_S * S
            idx = np.flatnonzero(fast)[hit]
            start[idx] = True
            rate[idx] = slope[hit] * 60
            since[idx] = window_start[hit]
        start &= ~active
        for i in np.flatnonzero(start | clear).tolist():
            detail = {"slope_per_min": float(rate[i]), "growing_since_ns": float(since[i])} if start[i] else {}
            self.report.transition(int(g[i]), LEAK, bool(start[i]), int(ts[i]), out, detail)

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, nan = gpu.row, math.nan
        used = gpu.rel.get("memory_used_ratio", nan)
        total = row.get("memory_total_bytes", nan)
        full = 1.0 - row.get("memory_reserved_bytes", 0.0) / total if total > 0 else 1.0
        slope = episode.detail.get("slope_per_min", nan)
        minutes_left = max(full - used, 0.0) / slope if slope > 0 else nan
        grown_for = (ts_ns - episode.detail.get("growing_since_ns", ts_ns)) / S / 60
        what = (
            f"memory leak: memory used grows {fmt(slope * 100, '%', 2)} of {fmt(total / 2**30, ' GiB')} per minute "
            f"({fmt(slope * total / 60 / 2**20, ' MiB/s', 1)}), steadily for {fmt(grown_for, ' min', 1)}, now "
            f"{fmt(used * 100, '%')}; full in ~{fmt(minutes_left, ' min', 1)}"
        )
        action = (
            "tell the job's owner: the process keeps allocating without freeing (caches, tensors kept alive); "
            "it will hit OOM"
        )
        severity = Severity.CRITICAL if minutes_left < 15 else Severity.WARNING
        return Description(severity, what, action, {
            "memory_used_ratio": used, "growth_per_min": slope, "minutes_to_full": minutes_left,
            "growing_min": grown_for,
        })  # fmt: skip
