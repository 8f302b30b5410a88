"""What the fleet and the fault injector exchange every round: what the injector sees of each GPU
(:class:`GpuView`, static) and of the round (:class:`Now`), and what faults do to each GPU (:class:`Effects`: the
physics the fleet reads, and the health counters NVML would report as totals). Per GPU, as numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from producers.simulator.scheduler import Scheduler


@dataclass
class Effects:
    """Per-GPU state the fleet reads every round: what faults do to the physics, and the health counters."""

    n: int
    links: int
    thermal_k: np.ndarray = field(init=False)
    inlet_add: np.ndarray = field(init=False)
    cap_watts: np.ndarray = field(init=False)
    link_up: np.ndarray = field(init=False)
    link_exists: np.ndarray = field(init=False)
    nvlink_fallback: np.ndarray = field(init=False)
    gen_cap: np.ndarray = field(init=False)
    width_cap: np.ndarray = field(init=False)
    replay_rate: np.ndarray = field(init=False)
    leak_rate: np.ndarray = field(init=False)
    leak_bytes: np.ndarray = field(init=False)
    clock_factor: np.ndarray = field(init=False)
    duty: np.ndarray = field(init=False)
    wait: np.ndarray = field(init=False)
    wait_period: np.ndarray = field(init=False)
    xid_interval: np.ndarray = field(init=False)
    #: when each GPU's XID storm began (s into the run)
    xid_from_s: np.ndarray = field(init=False)
    stall_until: np.ndarray = field(init=False)
    lost: np.ndarray = field(init=False)
    restarted_at: np.ndarray = field(init=False)
    brake: np.ndarray = field(init=False)
    #: C the memory runs hotter at full power (a degraded thermal interface over the HBM)
    hbm_add: np.ndarray = field(init=False)
    #: storms: corrected errors per second (CRC per link)
    sbe_rate: np.ndarray = field(init=False)
    crc_rate: np.ndarray = field(init=False)
    #: AER correctable errors per second counted at the GPU's upstream port
    aer_rate: np.ndarray = field(init=False)
    # health counters (what NVML reports as totals)
    ecc_corrected: np.ndarray = field(init=False)
    ecc_uncorrected: np.ndarray = field(init=False)
    remap_correctable: np.ndarray = field(init=False)
    remap_uncorrectable: np.ndarray = field(init=False)
    remap_pending: np.ndarray = field(init=False)
    remap_failure: np.ndarray = field(init=False)
    retired_sbe: np.ndarray = field(init=False)
    retired_dbe: np.ndarray = field(init=False)
    retired_pending: np.ndarray = field(init=False)
    pcie_replay: np.ndarray = field(init=False)
    aer_correctable: np.ndarray = field(init=False)
    aer_uncorrectable: np.ndarray = field(init=False)
    nvl_crc: np.ndarray = field(init=False)
    nvl_replay: np.ndarray = field(init=False)
    nvl_recovery: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n, links = self.n, self.links
        self.link_exists = np.zeros((n, links), dtype=bool)  # set by the injector from each GPU's link count
        self.thermal_k = np.ones(n)
        self.inlet_add = np.zeros(n)
        self.cap_watts = np.full(n, np.inf)
        self.link_up = np.ones((n, links), dtype=bool)
        self.nvlink_fallback = np.zeros(n, dtype=bool)
        self.gen_cap = np.full(n, 99.0)
        self.width_cap = np.full(n, 99.0)
        self.replay_rate = np.zeros(n)
        self.leak_rate = np.zeros(n)
        self.leak_bytes = np.zeros(n)
        self.clock_factor = np.ones(n)
        self.duty = np.ones(n)
        self.wait = np.zeros(n)
        self.wait_period = np.ones(n, dtype=np.int64)
        self.xid_interval = np.zeros(n)
        self.xid_from_s = np.zeros(n)
        self.stall_until = np.full(n, -np.inf)
        self.lost = np.zeros(n, dtype=bool)
        self.restarted_at = np.full(n, -np.inf)
        self.brake = np.zeros(n, dtype=bool)
        self.hbm_add = np.zeros(n)
        self.sbe_rate = np.zeros(n)
        self.aer_rate = np.zeros(n)
        self.crc_rate = np.zeros((n, links))
        for name in (
            "ecc_corrected",
            "ecc_uncorrected",
            "remap_correctable",
            "remap_uncorrectable",
            "remap_pending",
            "remap_failure",
            "retired_sbe",
            "retired_dbe",
            "retired_pending",
            "pcie_replay",
            "aer_correctable",
            "aer_uncorrectable",
        ):
            setattr(self, name, np.zeros(n))
        self.nvl_crc = np.zeros((n, links))
        self.nvl_replay = np.zeros((n, links))
        self.nvl_recovery = np.zeros((n, links))


@dataclass(frozen=True, slots=True)
class GpuView:
    """What the injector needs to know about each GPU from the fleet (static, per GPU)."""

    cluster: str
    nodes: list[str]
    uuids: list[str]
    gpus_per_node: int
    has_nvlink: np.ndarray
    nvlink_count: np.ndarray
    ecc: list[str]
    default_watts: np.ndarray
    min_watts: np.ndarray
    gen_max: np.ndarray
    width_max: np.ndarray
    usable_bytes: np.ndarray
    thermal_rise_c: np.ndarray
    slowdown_c: np.ndarray
    pcie_bytes_per_s: np.ndarray
    nvlink_bytes_per_s: np.ndarray
    #: the memory's max operating temperature (NaN: no HBM, no memory temperature)
    memory_max_c: np.ndarray
    #: NVIDIA GPUs (NVML's readings and XIDs); the others are AMD Instinct, read through AMD's exporter
    nvidia: np.ndarray


@dataclass(frozen=True, slots=True)
class Now:
    """This round, as the injector sees it: time, the jobs, and each GPU's recent power and memory."""

    now_s: float
    ts_ns: int
    dt: float
    sched: Scheduler
    #: recent power as a fraction of the default limit (an EWMA over about a minute)
    busy_power: np.ndarray
    memory_frac: np.ndarray
    inlet_c: np.ndarray
    #: each GPU's power limit in force, as its operator set it (W)
    limit_w: np.ndarray
