"""Thermal throttling: clocks held down by heat, told from an idle GPU's low clocks and from a power brake; and the
HBM's own slowdown, told from the die's.

Two level conditions (debounced, processors.detectors.debounce):

- ``thermal-throttling``: NVML's thermal slowdown reasons (HW or SW); HW slowdown with the GPU within 3 C of its
  slowdown temperature (HW slowdown alone can be a power brake); and, where a source sends no reasons mask, the GPU
  at its slowdown temperature with SM clocks under 90% of max. Critical within 3 C of the shutdown temperature.
- ``hbm-thermal``: SW thermal slowdown (no HW bit) where the memory is the part nearer its limit: closer to its max
  operating temperature (``NVML_TEMPERATURE_THRESHOLD_MEM_MAX``, DCGM's ``DCGM_FI_DEV_MEM_MAX_OP_TEMP``) than the die
  is to its slowdown temperature; without a mask, the memory at or above that maximum (DCGM's
  ``VerifyHBMTemperature`` and gpud's temperature component raise it on the memory temperature alone). NVML's SW
  thermal reason covers both the die's max operating temperature and the memory's, so the die's reading would blame
  the wrong part: the memory stacks (their cold plate, their thermal interface) overheat while the die is cool. The
  controller that holds the memory there lowers the clocks in steps, so a sample may find the memory well under its
  maximum while the slowdown holds (the clocks and with them the heat are down): which part is nearer its limit says
  whose slowdown it is, not one threshold (a board that reports a memory temperature is a data-center one, whose
  die's max operating temperature sits a few degrees under its slowdown). Such rows are not ``thermal-throttling``,
  unless the die's finding is open (processors.detectors.stage: then they are its slowdown going on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipeline.events import Severity
from pipeline.kinds import HBM, THERMAL
from pipeline.vocab import HW_SLOWDOWN, HW_THERMAL, SW_THERMAL
from processors.detectors.columns import REL, S, bits, col, fmt, lt
from processors.detectors.debounce import Level
from processors.detectors.gpus import GpuView
from processors.episodes import Description, Episode
from processors.state import GpuSlots, column

#: the reasons are the instant's (processors.detectors.debounce): a row without them is at most 10 s of their absence
LEVEL = Level(THERMAL, tau_s=10.0, on=0.6, off=0.15, clear_tau_s=90.0, snapshot_s=10.0)
HBM_LEVEL = Level(HBM, tau_s=10.0, on=0.6, off=0.15, clear_tau_s=90.0, snapshot_s=10.0)
#: HW slowdown this close to the slowdown temperature is heat (farther away it is a power brake)
HOT_WITHIN_C = 3.0


def conditions(m: np.ndarray, rel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: thermally throttled (the die), and whether that can be told from the row (a mask or a temperature);
    the same for the HBM's slowdown (module docstring)."""
    mask = col(m, "throttle_reasons_mask")
    temp, slowdown = col(m, "temperature_gpu_celsius"), col(m, "temperature_slowdown_celsius")
    mem, mem_max = col(m, "temperature_memory_celsius"), col(m, "temperature_memory_max_celsius")
    clock = rel[:, REL["sm_clock_ratio_of_max"]]
    hot = ~lt(temp, slowdown - HOT_WITHIN_C)
    mem_known = ~np.isnan(mem) & ~np.isnan(mem_max)
    mem_margin, die_margin = mem_max - mem, np.where(np.isnan(temp) | np.isnan(slowdown), np.inf, slowdown - temp)
    hbm = bits(mask, SW_THERMAL) & ~bits(mask, HW_THERMAL | HW_SLOWDOWN) & ~hot & mem_known
    hbm &= lt(mem_margin, die_margin)
    hbm |= np.isnan(mask) & mem_known & ~lt(mem, mem_max)
    thermal = bits(mask, HW_THERMAL | SW_THERMAL) | (bits(mask, HW_SLOWDOWN) & hot)
    thermal |= np.isnan(mask) & ~lt(temp, slowdown) & lt(clock, 0.9)
    return thermal & ~hbm, ~np.isnan(mask) | ~np.isnan(temp), hbm, ~np.isnan(mask) | mem_known


#: how long after the die's own slowdown a slowdown that looks like the memory's is still the die's: as the
#: controller gives the clocks back the die cools faster than the memory, which then looks the part nearer its
#: limit; a die cools from its slowdown within a few of its thermal time constants (tens of seconds)
DIE_TAIL_S = 120.0


@dataclass(eq=False)
class _DieSeen:
    #: the time of each GPU's latest row where the die's own slowdown showed (-1: never)
    ns: np.ndarray = column(-1, dtype=np.int64)


class DieTail:
    """Rows that look like the HBM's slowdown right after the die's, while its finding is open, are the die's going
    on (the offline evaluation's seed 43331: two false HBM findings 30 s after die faults ended); later ones are the
    memory's own (seed 33445 at 60 s: an HBM fault 12 minutes after a die's, which the die's finding had swallowed
    for 70 minutes)."""

    def __init__(self, slots: GpuSlots) -> None:
        self._seen = slots.attach(_DieSeen())

    def step(self, g: np.ndarray, ts: np.ndarray, die: np.ndarray, hbm: np.ndarray, die_open: np.ndarray) -> np.ndarray:
        """One row per GPU ``g``: which of its HBM-looking rows are the die's tail."""
        self._seen.ns[g[die]] = ts[die]
        last = self._seen.ns[g]
        tail: np.ndarray = hbm & die_open & (last >= 0) & (ts - last <= DIE_TAIL_S * S)
        return tail


class Thermal:
    """The thermal-throttling finding's wording (its rule is the level above)."""

    names = (THERMAL,)

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, rel, nan = gpu.row, gpu.rel, math.nan
        temp, slowdown = row.get("temperature_gpu_celsius", nan), row.get("temperature_slowdown_celsius", nan)
        shutdown = row.get("temperature_shutdown_celsius", nan)
        clock = rel.get("sm_clock_ratio_of_max", nan)
        reported = row.get("throttle_reasons_mask", nan)
        mask = 0 if reported != reported else int(reported)  # noqa: PLR0124
        why = _why(mask, reported == reported)  # noqa: PLR0124
        severity = Severity.CRITICAL if temp >= shutdown - 3 else Severity.WARNING
        what = (
            f"thermal throttling: SM clock at {fmt(clock * 100, '%')} of max by {why} at {fmt(temp, ' C')} "
            f"(slowdown {fmt(slowdown, ' C')}), power {fmt(rel.get('power_ratio_of_limit', nan) * 100, '%')} of "
            f"limit, util {fmt(row.get('utilization_gpu_percent', nan), '%')}"
        )
        fan = row.get("fan_speed_percent")
        action = (
            f"check cooling and fans ({f'fan {fan:.0f}%, ' if fan is not None else ''}inlet air, airflow); clocks "
            f"held at {fmt(clock * 100, '%')} by {why} at {fmt(temp, ' C')}"
        )
        evidence = {
            "temperature_c": temp,
            "slowdown_c": slowdown,
            "sm_clock_ratio": clock,
            "power_ratio": rel.get("power_ratio_of_limit", nan),
            "utilization_percent": row.get("utilization_gpu_percent", nan),
            "throttle_reasons_mask": reported,
        }
        return Description(severity, what, action, evidence)


def _why(mask: int, reported: bool) -> str:
    """What holds the clocks, as the latest row says: a debounced episode goes on through samples without the
    reason (a controller holding the GPU at its threshold), and the wording must not name one it does not show."""
    if not reported:
        return "heat"  # no reasons mask: at the slowdown temperature with low clocks
    if mask & (HW_THERMAL | HW_SLOWDOWN):
        return "HW thermal slowdown"
    if mask & SW_THERMAL:
        return "SW thermal slowdown"
    return "thermal slowdown on and off (not in the latest sample)"


class HbmThermal:
    """The HBM slowdown finding's wording (its rule is the level above)."""

    names = (HBM,)

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, rel, nan = gpu.row, gpu.rel, math.nan
        mem, mem_max = row.get("temperature_memory_celsius", nan), row.get("temperature_memory_max_celsius", nan)
        temp, slowdown = row.get("temperature_gpu_celsius", nan), row.get("temperature_slowdown_celsius", nan)
        clock = rel.get("sm_clock_ratio_of_max", nan)
        what = (
            f"HBM temperature slowdown: memory at {fmt(mem, ' C')} against its max operating {fmt(mem_max, ' C')} "
            f"while the die is at {fmt(temp, ' C')} (slowdown {fmt(slowdown, ' C')}); SM clock at "
            f"{fmt(clock * 100, '%')} of max, power {fmt(rel.get('power_ratio_of_limit', nan) * 100, '%')} of limit"
        )
        action = (
            "the memory stacks overheat, not the die: check the cold plate and thermal interface over the HBM and the "
            "airflow across the board; memory this hot wears out (corrected ECC errors, row remaps follow)"
        )
        evidence = {
            "memory_temperature_c": mem,
            "memory_max_c": mem_max,
            "temperature_c": temp,
            "sm_clock_ratio": clock,
            "throttle_reasons_mask": row.get("throttle_reasons_mask", nan),
        }
        return Description(Severity.WARNING, what, action, evidence)
