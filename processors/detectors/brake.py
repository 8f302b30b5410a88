"""Power brake: the board's clocks held down by its external power-brake signal (a power supply, a rack's or a
datacenter's power event), not by heat and not by a power limit.

A level condition (debounced, processors.detectors.debounce, with the thermal finding's constants so a brake that
comes and goes from one sample to the next is one finding): NVML's HW power brake reason (``0x80``), or HW slowdown
(``0x08``) with the GPU neither hot nor reporting HW thermal slowdown (the older drivers' only sign of a brake).
NVSentinel #1666: a datacenter power event left two GPUs on each of nine nodes braked 100% of the time for 36
hours, and no watch said so; DCGM's power watch reports the harmless power cap instead. A warning: the GPU still
works, at a fraction of its clocks, and the cause is outside it.
"""

from __future__ import annotations

import math

import numpy as np

from pipeline.events import Severity
from pipeline.kinds import BRAKE
from pipeline.vocab import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL
from processors.detectors.columns import bits, col, fmt, lt
from processors.detectors.debounce import Level
from processors.detectors.gpus import GpuView
from processors.detectors.thermal import HOT_WITHIN_C
from processors.episodes import Description, Episode

LEVEL = Level(BRAKE, tau_s=10.0, on=0.6, off=0.15, clear_tau_s=90.0)


def condition(m: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: braked, and whether that can be told from the row (a reasons mask)."""
    mask = col(m, "throttle_reasons_mask")
    temp, slowdown = col(m, "temperature_gpu_celsius"), col(m, "temperature_slowdown_celsius")
    cool = lt(temp, slowdown - HOT_WITHIN_C)
    braked = bits(mask, HW_POWER_BRAKE) | (bits(mask, HW_SLOWDOWN) & ~bits(mask, HW_THERMAL) & cool)
    return braked, ~np.isnan(mask)


class Brake:
    """The power-brake finding's wording (its rule is the level above)."""

    names = (BRAKE,)

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, rel, nan = gpu.row, gpu.rel, math.nan
        clock = rel.get("sm_clock_ratio_of_max", nan)
        mask = int(row.get("throttle_reasons_mask", 0))
        signal = "HW power brake" if mask & HW_POWER_BRAKE else "HW slowdown while cool"
        power, temp = rel.get("power_ratio_of_limit", nan), row.get("temperature_gpu_celsius", nan)
        what = (
            f"power brake: {signal} holds the SM clock at {fmt(clock * 100, '%')} of max, power "
            f"{fmt(power * 100, '%')} of limit at {fmt(temp, ' C')}"
        )
        action = (
            "the board's external power-brake signal is asserted: check the node's power supplies and the rack's "
            "power feed (not the GPU; several GPUs of a node braked together share the cause)"
        )
        evidence = {
            "sm_clock_ratio": clock,
            "power_ratio": power,
            "temperature_c": temp,
            "throttle_reasons_mask": float(mask),
        }
        return Description(Severity.WARNING, what, action, evidence)
