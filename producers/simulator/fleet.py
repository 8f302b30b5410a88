"""A simulated GPU fleet: N nodes x M GPUs running workload profiles, sampled as numpy arrays per round.

Seeded and reproducible: ``Fleet(seed=...)`` gives the same GPUs, the same workloads and, for the same
``ts_ns`` sequence, the same readings. One ``tick`` computes every GPU's reading with array operations and
returns one :class:`SampleBatch` per node, ready to publish.

GPU limits (memory, power limit, clocks, thermal thresholds, PCIe link) are those NVIDIA documents for each
model; workload levels are rough means of public measurements (Zeus power profiles, AcmeTrace utilization).
The fault injector and richer phases come with the producers issue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.events import GpuSample, SampleBatch

_GIB = 2**30


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_bytes: int
    power_limit_watts: float
    idle_watts: float
    sm_clock_max_mhz: float
    memory_clock_mhz: float
    slowdown_celsius: float
    shutdown_celsius: float
    pcie_gen: int
    pcie_width: int
    nvlink: bool


MODELS: dict[str, GpuModel] = {
    m.name: m
    for m in (
        GpuModel("NVIDIA H100 80GB HBM3", 80 * _GIB, 700, 70, 1980, 2619, 87, 92, 5, 16, True),
        GpuModel("NVIDIA A100-SXM4-40GB", 40 * _GIB, 400, 55, 1410, 1215, 85, 92, 4, 16, True),
        GpuModel("NVIDIA L40S", 48 * _GIB, 350, 35, 2520, 9001, 88, 93, 4, 16, False),
        GpuModel("NVIDIA GeForce RTX 3090", 24 * _GIB, 350, 20, 2100, 9751, 93, 98, 4, 16, False),
    )
}


@dataclass(frozen=True, slots=True)
class Profile:
    """Mean levels of a workload (fractions of the GPU's own capacity) and how much they wobble."""

    name: str
    util: float
    memory: float
    power: float
    clock: float
    pcie: float  # bytes/s at full activity
    nvlink: float
    jitter: float


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("llm-training", 0.97, 0.92, 0.86, 0.93, 2e9, 120e9, 0.03),
        Profile("llm-inference", 0.55, 0.75, 0.48, 0.85, 1e9, 10e9, 0.25),
        Profile("resnet-training", 0.90, 0.45, 0.75, 0.95, 6e9, 20e9, 0.05),
        Profile("stable-diffusion-inference", 0.70, 0.30, 0.62, 0.90, 0.5e9, 0.0, 0.20),
        Profile("idle", 0.0, 0.01, 0.0, 0.10, 0.0, 0.0, 0.0),
    )
}


def _uuid(rng: np.random.Generator) -> str:
    h = rng.bytes(16).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Fleet:
    """N nodes x M GPUs; node i gets one GPU model and one workload profile (jobs take whole nodes)."""

    def __init__(self, nodes: int, gpus_per_node: int, cluster: str = "sim", seed: int = 0) -> None:
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError("a fleet needs at least one node with one GPU")
        rng = np.random.default_rng(seed)
        self.cluster = cluster
        self.nodes = [f"node-{i:04d}" for i in range(nodes)]
        self.gpus_per_node = gpus_per_node
        model_names = list(MODELS)
        profile_names = list(PROFILES)
        node_models = rng.choice(len(model_names), size=nodes, p=[0.45, 0.3, 0.15, 0.1])
        node_profiles = rng.choice(len(profile_names), size=nodes, p=[0.35, 0.2, 0.15, 0.15, 0.15])
        n = nodes * gpus_per_node
        self.uuids = [_uuid(rng) for _ in range(n)]
        self.model = [MODELS[model_names[node_models[i // gpus_per_node]]] for i in range(n)]
        self.profile = [PROFILES[profile_names[node_profiles[i // gpus_per_node]]] for i in range(n)]
        self._rng = np.random.default_rng(seed + 1)
        col = np.array
        self._mem_total = col([m.memory_bytes for m in self.model], dtype=np.float64)
        self._plimit = col([m.power_limit_watts for m in self.model], dtype=np.float64)
        self._pidle = col([m.idle_watts for m in self.model], dtype=np.float64)
        self._clock_max = col([m.sm_clock_max_mhz for m in self.model], dtype=np.float64)
        self._mclock = col([m.memory_clock_mhz for m in self.model], dtype=np.float64)
        self._slowdown = col([m.slowdown_celsius for m in self.model], dtype=np.float64)
        self._shutdown = col([m.shutdown_celsius for m in self.model], dtype=np.float64)
        self._gen = col([m.pcie_gen for m in self.model], dtype=np.float64)
        self._width = col([m.pcie_width for m in self.model], dtype=np.float64)
        self._nvlink = col([m.nvlink for m in self.model], dtype=bool)
        self._util = col([p.util for p in self.profile])
        self._mem = col([p.memory for p in self.profile])
        self._power = col([p.power for p in self.profile])
        self._clock = col([p.clock for p in self.profile])
        self._pcie = col([p.pcie for p in self.profile])
        self._nvl = col([p.nvlink for p in self.profile])
        self._jitter = col([p.jitter for p in self.profile])
        self._energy = np.zeros(n)
        self._last_ts: int | None = None

    @property
    def size(self) -> int:
        return len(self.uuids)

    def readings(self, ts_ns: int) -> dict[str, np.ndarray]:
        """Every GPU's metrics at ``ts_ns`` as arrays (one entry per canonical field)."""
        n, rng = self.size, self._rng
        wobble = 1 + self._jitter * rng.standard_normal(n)
        util = np.clip(self._util * wobble, 0, 1)
        power_frac = np.clip(self._power * wobble, 0, 1.02)
        power = self._pidle + (self._plimit - self._pidle) * power_frac
        dt = 0.0 if self._last_ts is None else (ts_ns - self._last_ts) / 1e9
        self._energy += power * max(dt, 0.0)
        self._last_ts = ts_ns
        temp = 30 + (self._slowdown - 30 - 8) * power_frac + rng.normal(0, 0.7, n)
        activity = np.clip(util * 1.05, 0, 1)
        mem_used = np.round(self._mem_total * np.clip(self._mem * (1 + 0.01 * rng.standard_normal(n)), 0.005, 1))
        return {
            "utilization_gpu_percent": np.round(util * 100),
            "utilization_memory_percent": np.round(util * 100 * 0.6),
            "memory_used_bytes": mem_used,
            "memory_total_bytes": self._mem_total,
            "sm_clock_mhz": np.round(self._clock_max * np.clip(self._clock + 0.01 * rng.standard_normal(n), 0.05, 1)),
            "sm_clock_max_mhz": self._clock_max,
            "memory_clock_mhz": self._mclock,
            "temperature_gpu_celsius": np.round(temp),
            "temperature_slowdown_celsius": self._slowdown,
            "temperature_shutdown_celsius": self._shutdown,
            "power_watts": np.round(power, 2),
            "power_limit_watts": self._plimit,
            "energy_joules": np.round(self._energy, 3),
            "performance_state": np.where(util > 0.05, 0.0, 8.0),
            "throttle_reasons_mask": np.where(util > 0.05, 0.0, 1.0),
            "pcie_link_gen": np.where(util > 0.05, self._gen, 1.0),
            "pcie_link_gen_max": self._gen,
            "pcie_link_width": self._width,
            "pcie_link_width_max": self._width,
            "pcie_tx_bytes_per_second": np.round(self._pcie * activity * np.abs(wobble)),
            "pcie_rx_bytes_per_second": np.round(self._pcie * activity * np.abs(wobble) * 1.1),
            "nvlink_tx_bytes_per_second": np.where(self._nvlink, np.round(self._nvl * activity), np.nan),
            "nvlink_rx_bytes_per_second": np.where(self._nvlink, np.round(self._nvl * activity), np.nan),
            "ecc_corrected_total": np.zeros(n),
            "ecc_uncorrected_total": np.zeros(n),
        }

    def tick(self, ts_ns: int) -> list[SampleBatch]:
        """One sampling round: one SampleBatch per node. Fields a model lacks (NVLink on PCIe cards) are absent."""
        values = self.readings(ts_ns)
        names = list(values)
        rows = np.column_stack([values[k] for k in names]).tolist()
        per_node = self.gpus_per_node
        batches = []
        for ni, node in enumerate(self.nodes):
            samples = []
            for gi in range(per_node):
                i = ni * per_node + gi
                # absent fields are NaN in the arrays; `v == v` drops them
                metrics = {k: v for k, v in zip(names, rows[i], strict=True) if v == v}  # noqa: PLR0124
                samples.append(GpuSample(self.cluster, node, self.uuids[i], gi, self.model[i].name, ts_ns, metrics))
            batches.append(SampleBatch(self.cluster, node, tuple(samples)))
        return batches
