"""Idle capacity: a GPU allocated to a job (a context source names the job) whose utilization stays under 5%.

A level condition (debounced, processors.detectors.debounce) with a time constant of 5 minutes: about 11.5 minutes
of idleness start it; an info finding that counts the GPU-hours held idle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from pipeline.events import Severity, Workload
from pipeline.kinds import IDLE
from pipeline.vocab import IDLE_UTIL_PERCENT
from processors.detectors.columns import S, col, fmt, lt
from processors.detectors.debounce import Level
from processors.detectors.gpus import GpuView
from processors.episodes import Description, Episode

LEVEL = Level(IDLE, tau_s=300.0, on=0.9, off=0.3)
_IDLE_UTIL = IDLE_UTIL_PERCENT


def allocated(workloads: Iterable[Workload | None]) -> np.ndarray:
    """Per row, whether a context source placed a job on the GPU (not idle, not an unknown application)."""
    return np.array(
        [wl is not None and wl.job_id is not None and wl.application not in ("idle", "unknown") for wl in workloads],
        dtype=bool,
    )


def condition(m: np.ndarray, allocated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: allocated but idle, and whether that can be told (utilization reported)."""
    util = col(m, "utilization_gpu_percent")
    return allocated & lt(util, _IDLE_UTIL), ~np.isnan(util)


class Idle:
    """The idle-capacity finding's wording (its rule is the level above)."""

    names = (IDLE,)

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, rel = gpu.row, gpu.rel
        # the score needs ~2.3 time constants (11.5 min) of idleness to start the finding: count them in
        hours = (ts_ns - episode.since_ns) / S / 3600 + 2.3 * LEVEL.tau_s / 3600
        what = (
            f"allocated but idle: util {fmt(row.get('utilization_gpu_percent', math.nan), '%')}, memory "
            f"{fmt(rel.get('memory_used_ratio', math.nan) * 100, '%')} for the last {hours * 60:.0f}+ min"
        )
        action = "release the GPU or give the job work: it holds a GPU that others could use"
        return Description(
            Severity.INFO,
            what,
            action,
            {
                "utilization_percent": row.get("utilization_gpu_percent", math.nan),
                "memory_used_ratio": rel.get("memory_used_ratio", math.nan),
                "idle_gpu_hours": hours,
            },
        )
