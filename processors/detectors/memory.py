"""Memory leaks: memory used that keeps growing at the same pace, told from a cache filling towards a plateau and
from a job's start-up allocations, by two routes (docs/detectors.md gives the numbers):

- *slow*: per-minute means of the memory used ratio, the growth of the last 4 minutes against the 4 before (a cache
  filling towards a plateau decelerates; a leak does not), held for ``leak_confirm_s``;
- *fast*: 10-s means on a straight line for 2 minutes (:func:`fast_leak`), not slowing down, full within
  ``leak_fast_full_s`` (at that pace the process runs out of memory before the slow route could confirm); the first
  minute after a job starts is start-up and not judged.

A leak is growth still going on when it is found: the slow route also needs the last 2 minutes to have grown at
half the 4-minute pace at least (a model loaded in stages a few minutes apart and then flat is a step followed by a
plateau, not a leak: two false warnings in 22.8 h of real Stable Diffusion serving, issue 38). The rate a finding
states is the pace of its latest minute (or 4 minutes), its age from when that pace met the level before the growth,
and "full in" is said only while memory still grows.

A job change or an OOM restart (memory falls well below its peak) starts a new history; the finding clears then,
or once the growth stopped for 2 minutes. A leak that ends in a fall says where memory fell to in its cleared record
(:meth:`Memory.step` returns which rows ended so): the fall is how the leak ended (the process out of memory,
killed or restarted), so ``memory-collapse`` (processors/detectors/changes.py) does not tell it a second time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.config import DetectorSettings
from pipeline.events import Finding, Severity
from pipeline.kinds import LEAK
from processors.detectors.columns import REL, S, col, fmt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import GpuView
from processors.detectors.jobs import Boundaries
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
#: the slow route's growth goes on: the last 2 minutes grew at >= half the pace of the last 4 (a linear leak grows
#: at 1x; a step 2+ minutes back then flat at 0x; allocators grow in chunks, so a minute may show nothing)
_ONGOING_PACE: Final = 0.5


def fast_leak(
    ring: np.ndarray, full: np.ndarray, min_slope: float, max_full_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU, whether its memory is leaking fast: the 10-s means of the memory used ratio in ``ring`` (oldest
    first, the window complete) rise along a straight line that does not slow down and reaches ``full`` within
    ``max_full_s``. Returns (leaking, the pace of the window's last minute per second: a leak that began inside
    the window grows at that pace, the whole window's line is lower, and projected seconds to full).

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
    return leaking, np.where(complete, second, np.nan), to_full


def onset_s(ring: np.ndarray, pace: np.ndarray, bucket_s: float) -> np.ndarray:
    """Per GPU, how many seconds before the middle of the last bucket of ``ring`` (means, oldest first) its growth
    began: where a line back from the last mean at ``pace`` (per second) meets the window's first mean, at most the
    whole window (growth older than the window is told as old as the window: its age is then at least that). Pure."""
    k = ring.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        back = (ring[:, -1] - ring[:, 0]) / pace
    return np.asarray(np.clip(np.where(np.isfinite(back), back, (k - 1) * bucket_s), 0.0, (k - 1) * bucket_s))


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

    def step(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, rel: np.ndarray, out: list[Finding]) -> np.ndarray:
        """One row per GPU ``g``; returns, per row, whether an open leak ended there because memory fell."""
        h = self.history
        y = rel[:, REL["memory_used_ratio"]]
        ok = ~np.isnan(y)
        fell = np.zeros(len(g), dtype=bool)
        rows = np.flatnonzero(ok)
        g, ts, y, m = g[ok], ts[ok], y[ok], m[ok]
        if not len(g):
            return fell
        peak = h.peak[g].copy()
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
        dropped = clear & (y < peak - 0.1)
        fell[rows[dropped]] = True
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
                ongoing = r[:, 8] - r[:, 6] >= _ONGOING_PACE * recent / 2
                still = growing | (last_minute[:, -1] - last_minute[:, -7] >= floor / 4)
            rg, rts = g[rolled], ts[rolled]
            growing_since = h.growing_since[rg]
            h.growing_since[rg] = np.where(growing, np.where(growing_since < 0, rts, growing_since), -1)
            stopped_since = h.stopped_since[rg]
            h.stopped_since[rg] = np.where(still, -1, np.where(stopped_since < 0, rts, stopped_since))
            confirmed = growing & ongoing & (rts - h.growing_since[rg] >= self.settings.leak_confirm_s * S)
            stopped = ~still & (rts - h.stopped_since[rg] >= 120 * S)
            idx = np.flatnonzero(rolled)
            start[idx] = confirmed
            rate[idx] = recent / 4
            # the trend needs 8 minutes of growth before it holds: it began at least that long before
            since[idx] = np.maximum(h.growing_since[rg] - 8 * 60 * S, h.origin[rg])
            clear[idx] |= stopped & active[rolled]
            # sampled less often than every 10 s: the minute means tell whether an open leak still grows
            coarse = np.isnan(last_minute[:, -6:]).any(axis=1) & active[rolled]
            minute_mid = (rts // (60 * S) - 1) * 60 * S + 30 * S
            self._follow(rg[coarse], minute_mid[coarse], r[coarse, 8], (r[coarse, 8] - r[coarse, 6]) / 2)
        if fast.any():
            fg = g[fast]
            hit, pace, _to_full = fast_leak(
                h.tens[fg], usable_ratio(m[fast]), _FAST_MIN_SLOPE, self.settings.leak_fast_full_s
            )
            # the middle of the window's last 10 s (the row is in the next 10 s)
            last_mid = (ts[fast] // (_FAST_BUCKET_S * S) - 1) * _FAST_BUCKET_S * S + _FAST_BUCKET_S * S // 2
            window_start = last_mid - (_FAST_RING * _FAST_BUCKET_S * S - _FAST_BUCKET_S * S // 2)
            hit &= window_start - h.origin[fg] >= _FAST_STARTUP_S * S
            idx = np.flatnonzero(fast)[hit]
            start[idx] = True
            rate[idx] = pace[hit] * 60
            began = last_mid - (onset_s(h.tens[fg], pace, _FAST_BUCKET_S) * S).astype(np.int64)
            since[idx] = began[hit]
            on = active[fast]
            self._follow(fg[on], last_mid[on], h.tens[fg[on], -1], pace[on] * 60)
        start &= ~active
        for i in np.flatnonzero(start | clear).tolist():
            if start[i]:
                used = float(y[i])
                detail = {
                    "slope_per_min": float(rate[i]),
                    "growing_since_ns": float(since[i]),
                    "pace_now_per_min": float(rate[i]),
                    "top_ratio": used,
                    "top_ns": float(ts[i]),
                }
            else:  # memory freed (a drop, a new job) or growth stopped: no longer growing
                detail = {"pace_now_per_min": 0.0}
                if dropped[i]:
                    detail |= {"fell_from_ratio": float(peak[i]), "fell_to_ratio": float(y[i])}
            self.report.transition(int(g[i]), LEAK, bool(start[i]), int(ts[i]), out, detail)
        return fell

    def _follow(self, g: np.ndarray, mid: np.ndarray, mean: np.ndarray, pace: np.ndarray) -> None:
        """Open leaks' latest period (10 s, or a minute when sampled less often): the pace of the last minute or two
        (per minute; kept where unknown) and the highest mean and when it was seen, for the wording (a finding says
        whether memory still grows)."""
        for i in range(len(g)):
            detail = self.report.gpus.get(int(g[i]), LEAK).detail
            if not math.isnan(pace[i]):
                detail["pace_now_per_min"] = float(pace[i])
            if mean[i] > detail.get("top_ratio", -math.inf):
                detail["top_ratio"], detail["top_ns"] = float(mean[i]), float(mid[i])

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, d, nan = gpu.row, episode.detail, math.nan
        used = gpu.rel.get("memory_used_ratio", nan)
        total = row.get("memory_total_bytes", nan)
        full = 1.0 - row.get("memory_reserved_bytes", 0.0) / total if total > 0 else 1.0
        since = d.get("growing_since_ns", ts_ns)
        pace = d.get("pace_now_per_min", nan)
        # still growing at the slow route's floor (per minute): only then is there a time to full
        growing = pace >= _LEAK_MIN_SLOPE * 60
        slope = pace if growing else d.get("slope_per_min", nan)
        rate = f"{fmt(slope * 100, '%', 2)} of {fmt(total / 2**30, ' GiB')} per minute"
        mib_s = fmt(slope * total / 60 / 2**20, " MiB/s", 1)
        if growing:
            minutes_left = max(full - used, 0.0) / slope
            grown_for = (ts_ns - since) / S / 60
            what = (
                f"memory leak: memory used grows {rate} ({mib_s}), steadily for {fmt(grown_for, ' min', 1)}, now "
                f"{fmt(used * 100, '%')}; full in ~{fmt(minutes_left, ' min', 1)}"
            )
        else:
            minutes_left = nan
            grown_for = (d.get("top_ns", ts_ns) - since) / S / 60
            grew = (
                f"memory leak: memory used grew {rate} ({mib_s}) for {fmt(grown_for, ' min', 1)}, to "
                f"{fmt(d.get('top_ratio', nan) * 100, '%')}"
            )
            if "fell_to_ratio" in d:  # ended in a fall: the process let its memory go
                what = (
                    f"{grew}; then fell from {fmt(d['fell_from_ratio'] * 100, '%')} to "
                    f"{fmt(d['fell_to_ratio'] * 100, '%')} at once: the process freed it (ended, killed or restarted; "
                    "out of memory if it had reached the top)"
                )
            else:
                what = f"{grew}; not growing now, {fmt(used * 100, '%')} used"
        action = (
            "tell the job's owner: the process keeps allocating without freeing (caches, tensors kept alive); "
            "it will hit OOM"
        )
        severity = Severity.CRITICAL if minutes_left < 15 else Severity.WARNING
        return Description(
            severity,
            what,
            action,
            {
                "memory_used_ratio": used,
                "growth_per_min": slope,
                "minutes_to_full": minutes_left,
                "growing_min": grown_for,
            },
        )
