"""What healthy GPUs show in the world: per feature and phase, the band public measurements and physical limits put
healthy work in, for judging by a prior (history from elsewhere: the simulator a new installation learned from,
another cluster, too few GPUs).

A prior is as narrow as the history it came from: the simulator's pre-training memory band starts at 74% of the
card, real pre-training runs hold half of it; its idle GPUs hold under a fifth of their memory, real resting servers
hold what their model needs. So a prior may speak only where the world does not: a feature inside its public band
is no evidence (marginalized out of the score, as a missing feature is) and only the features beyond it are scored
against the prior (:func:`beyond_world`). What the installation learned from its own cluster and enough GPUs is
judged as learned; these bands widen priors only.

Every band names its source (docs/baselines.md, "What a new installation judges by"):

- GPU utilization, any phase: 0-100% (AcmeTrace, Hu et al. NSDI'24, A100 LLM clusters Seren and Kalos: p5 0%, p99
  100%; tests/testdata/acmetrace-utilization-cdfs). Real training sits at 0% for seconds (input waits, rank 0 writing
  a checkpoint while the others wait): utilization alone says nothing a person should look at.
- SM active, any phase: 0-99.05% (AcmeTrace: p5 0%, p99 92.2% Seren, 99.05% Kalos).
- memory used, any phase: 0-98.9% of the card (AcmeTrace framebuffer used: p5 0%, p99 98.94% Seren, 97.28% Kalos;
  vLLM's default ``gpu_memory_utilization=0.9`` holds 90% of the card from start to end, TGI's
  ``--cuda-memory-fraction`` defaults to 1.0, PyTorch's caching allocator keeps what a job once used). How much a job
  holds is its configuration; growth is the memory-leak rule's, a loss memory-collapse's.
- power, every phase but idle: 13.4-110% of the power limit (Zeus, You et al. NSDI'23, average power of 218 DNN
  training runs at each GPU's maximum limit on V100, A40, P100 and RTX 6000: 13.4% (P100) to 97.1% (RTX 6000) of
  the limit; AcmeTrace power p99 439.7 W on 400 W A100s, 110%: readings above the limit are real, the limit holds
  an average; tests/testdata/zeus-gpu-power-profiles).
- temperature, any phase: up to the GPU's own slowdown threshold (a physical limit: NVML's
  ``NVML_TEMPERATURE_THRESHOLD_SLOWDOWN``, below which the board runs as designed; above it is the thermal
  detector's).
- SM clock in idle: 0-100% of its maximum (a physical limit: the driver picks a resting GPU's clock, and
  ``nvidia-smi --lock-gpu-clocks`` or application clocks hold it anywhere up to the maximum).

Features with no public band (clocks while busy, PCIe and NVLink traffic, memory bandwidth, tensor and DRAM
activity, idle power) are judged by the prior alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np

from pipeline.events import PHASES
from processors.features import FEATURE_INDEX, FEATURES


@dataclass(frozen=True, slots=True)
class WorldBand:
    """Healthy work keeps ``feature`` within [low, high] (the feature's units) in ``phases`` (empty: every phase)."""

    feature: str
    low: float
    high: float
    phases: frozenset[str] = frozenset()
    source: str = ""


_BUSY: Final = frozenset(PHASES) - {"idle"}

WORLD_BANDS: Final[tuple[WorldBand, ...]] = (
    WorldBand("utilization_gpu_percent", 0.0, 100.0, source="AcmeTrace NSDI'24: p5 0%, p99 100% (Seren, Kalos)"),
    WorldBand("sm_active_percent", 0.0, 99.05, source="AcmeTrace NSDI'24: p5 0%, p99 92.2% Seren, 99.05% Kalos"),
    WorldBand(
        "memory_used_ratio",
        0.0,
        0.9894,
        source="AcmeTrace NSDI'24 framebuffer used: p5 0%, p99 98.94% Seren; vLLM gpu_memory_utilization=0.9",
    ),
    WorldBand(
        "power_ratio_of_limit",
        0.134,
        1.10,
        _BUSY,
        source="Zeus NSDI'23: training average 13.4-97.1% of the max limit; AcmeTrace p99 439.7 W of 400 W",
    ),
    WorldBand("temperature_ratio_of_slowdown", 0.0, 1.0, source="physical: NVML's slowdown threshold"),
    WorldBand("sm_clock_ratio_of_max", 0.0, 1.0, frozenset({"idle"}), source="physical: the driver's clock range"),
)


@lru_cache(maxsize=len(PHASES) + 1)
def world_band(phase: str) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per FEATURES for ``phase``; a feature without a public band has an empty one (low > high)."""
    low, high = np.full(len(FEATURES), np.inf), np.full(len(FEATURES), -np.inf)
    for band in WORLD_BANDS:
        if not band.phases or phase in band.phases:
            low[FEATURE_INDEX[band.feature]], high[FEATURE_INDEX[band.feature]] = band.low, band.high
    low.flags.writeable = high.flags.writeable = False
    return low, high


def beyond_world(f: np.ndarray, phase: str) -> np.ndarray:
    """FEATURES rows of ``phase`` with every feature inside its public band set missing (NaN): what is left is what a
    prior may judge (pure; a copy)."""
    low, high = world_band(phase)
    with np.errstate(invalid="ignore"):
        inside = (f >= low) & (f <= high)
    return np.where(inside, np.nan, f)
