"""Calibration of the simulator against real fleet data: simulated quantiles next to the measured ones.

Pure functions over what the fleet emits (its samples), so the comparison sees exactly what the pipeline sees.
The references are passed in (tests and ``bench/simulator.py`` read them from ``tests/testdata``):

- AcmeTrace (NSDI'24) fleet quantiles of the A100 LLM clusters Seren and Kalos: GPU utilisation, SM active,
  framebuffer used (% of 80 GiB), power (W) and GPU temperature (C), against a ``mix="llm-a100"`` fleet;
- Zeus (NSDI'23) average power as a fraction of the power limit for BERT and ResNet training, against the
  simulator's training GPUs in the compute phase.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from pipeline.events import SampleBatch
from producers.simulator.fleet import Fleet

QUANTILES = (5, 25, 50, 75, 95, 99)

#: AcmeTrace series (``quantiles_summary.csv`` rows, without the cluster prefix) -> how to read it off a sample
ACME_SERIES: dict[str, str] = {
    "GPU_UTIL_pct": "utilization_gpu_percent",
    "SM_ACTIVE_pct": "sm_active_percent",
    "FB_USED_pct": "memory_used_percent",
    "GPU_POWER_W": "power_watts",
    "GPU_TEMP_C": "temperature_gpu_celsius",
}
#: how far (in the series' unit) a simulated quantile may lie outside the range of the two clusters' values
ACME_TOLERANCE: dict[str, float] = {
    "GPU_UTIL_pct": 10.0,
    "SM_ACTIVE_pct": 12.0,
    "FB_USED_pct": 15.0,
    "GPU_POWER_W": 45.0,
    "GPU_TEMP_C": 6.0,
}


@dataclass(frozen=True, slots=True)
class Comparison:
    series: str
    simulated: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    tolerance: float

    def misses(self) -> list[int]:
        """Quantiles (from QUANTILES) outside [low - tolerance, high + tolerance]."""
        return [
            q
            for q, s, lo, hi in zip(QUANTILES, self.simulated, self.low, self.high, strict=True)
            if not lo - self.tolerance <= s <= hi + self.tolerance
        ]


def llm_cluster_batches(
    day_ns: int,
    seed: int = 0,
    nodes: int = 128,
    windows: int = 8,
    warmup_s: int = 600,
    window_s: int = 1200,
    step_s: int = 30,
) -> list[SampleBatch]:
    """Samples of ``mix="llm-a100"`` fleets over windows spread evenly over one day (AcmeTrace covers months, so
    every hour counts: serving load follows the time of day), each after a warm-up, every ``step_s``."""
    out: list[SampleBatch] = []
    for w in range(windows):
        fleet = Fleet(nodes, 8, seed=seed + w, mix="llm-a100")
        start = day_ns + w * (86_400 // windows) * 1_000_000_000
        for s in range(0, warmup_s + window_s, step_s):
            batches = fleet.tick(start + s * 1_000_000_000)
            if s >= warmup_s:
                out += batches
    return out


def sample_values(batches: Iterable[SampleBatch], field: str) -> np.ndarray:
    """One field over every sample of the batches (``memory_used_percent``: used / total x 100)."""
    if field == "memory_used_percent":
        return np.array(
            [100 * s.metrics["memory_used_bytes"] / s.metrics["memory_total_bytes"] for b in batches for s in b.samples]
        )
    return np.array([s.metrics[field] for b in batches for s in b.samples if field in s.metrics])


def quantiles(values: np.ndarray) -> tuple[float, ...]:
    return tuple(float(v) for v in np.percentile(values, QUANTILES))


def compare_acme(batches: list[SampleBatch], reference: dict[str, tuple[float, ...]]) -> list[Comparison]:
    """Simulated quantiles per AcmeTrace series against the Seren and Kalos values (``reference`` is keyed like
    ``seren_GPU_POWER_W``, values at QUANTILES)."""
    out = []
    for series, field in ACME_SERIES.items():
        real = [reference[k] for k in reference if k.endswith(series) and k.split("_", 1)[0] in ("seren", "kalos")]
        low = tuple(min(v) for v in zip(*real, strict=True))
        high = tuple(max(v) for v in zip(*real, strict=True))
        out.append(Comparison(series, quantiles(sample_values(batches, field)), low, high, ACME_TOLERANCE[series]))
    return out


def format_comparison(rows: list[Comparison]) -> str:
    lines = [f"{'series':14} {'':10} " + " ".join(f"{'p' + str(q):>7}" for q in QUANTILES)]
    for row in rows:
        for label, values in (("simulated", row.simulated), ("real low", row.low), ("real high", row.high)):
            lines.append(f"{row.series:14} {label:10} " + " ".join(f"{v:7.1f}" for v in values))
    return "\n".join(lines)
