"""A healthy GPU's reading as a collector sends it, with a little noise: the starting point the detector tests (unit
and integration) rewrite into each fault's physical signature."""

from __future__ import annotations

import numpy as np

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"


def busy_h100(rng: np.random.Generator) -> dict[str, float]:
    """An H100 of an LLM pre-training job: ~96% busy, 56 of 80 GiB, ~1830 of 1980 MHz, ~68 C, ~610 of 700 W,
    PCIe Gen5 x16 and 18 NVLinks carrying traffic, error counters where a healthy GPU has them."""
    return {
        "utilization_gpu_percent": float(np.clip(96 + rng.normal(0, 1.5), 0, 100)),
        "memory_used_bytes": float(round(56 * GIB * (1 + rng.normal(0, 0.002)))),
        "memory_total_bytes": 80.0 * GIB,
        "sm_clock_mhz": float(round(1830 + rng.normal(0, 8))),
        "sm_clock_max_mhz": 1980.0,
        "temperature_gpu_celsius": float(round(68 + rng.normal(0, 0.7))),
        "temperature_slowdown_celsius": 90.0,
        "temperature_shutdown_celsius": 92.0,
        "power_watts": float(610 + rng.normal(0, 10)),
        "power_limit_watts": 700.0,
        "power_default_limit_watts": 700.0,
        "throttle_reasons_mask": 0.0,
        "pcie_link_gen": 5.0,
        "pcie_link_gen_max": 5.0,
        "pcie_link_width": 16.0,
        "pcie_link_width_max": 16.0,
        "pcie_tx_bytes_per_second": 2e9,
        "pcie_rx_bytes_per_second": 2e9,
        "nvlink_tx_bytes_per_second": 120e9,
        "nvlink_rx_bytes_per_second": 120e9,
        "nvlink_links_active": 18.0,
        "nvlink_links_max": 18.0,
        "nvlink_crc_errors_total": 3.0,
        "nvlink_recovery_errors_total": 0.0,
        "ecc_uncorrected_total": 0.0,
        "row_remap_uncorrectable_total": 0.0,
        "row_remap_pending": 0.0,
        "row_remap_failure": 0.0,
        "pcie_replay_total": 10.0,
    }
