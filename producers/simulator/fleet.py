"""A simulated GPU fleet: nodes of real GPU models running scheduled jobs with phases, sampled once per round.

``Fleet(nodes, gpus_per_node, cluster=..., seed=...)`` builds a mix of node kinds (:mod:`.hardware`), places jobs
on their GPUs (:mod:`.scheduler`, applications and phases from :mod:`.profiles`) and, when asked, injects faults
(:mod:`.faults`). ``round(ts_ns)`` advances everything to ``ts_ns`` and returns a :class:`SimRound`: one
:class:`SampleBatch` per node (every GPU read at the same ``ts_ns``; XID/ECC events and NIC ports when enabled),
the GPUs whose workload changed (:class:`GpuContext`; every GPU on the first round) and the faults that started
(:class:`FaultRecord`, ground truth). ``tick(ts_ns)`` is ``round(ts_ns).batches``. ``topologies(ts_ns)`` gives
every node's :class:`NodeTopology`.

Seeded and reproducible: the same seed and arguments give the same GPUs, jobs, faults and, for the same sequence
of ``ts_ns``, the same readings. Everything per GPU is computed with numpy over the whole fleet; only building the
sample objects touches each GPU in Python.

Physics, per GPU and round: levels of the job's application and phase (:func:`.profiles.level_table`) with a
per-GPU AR(1) wobble; power demand from the level, the GPU's default limit and a persistent efficiency offset
(silicon lottery); the enforced limit (an operator's cap, a fault's cap) clips it, with the SW power cap reason and
clocks scaled by (limit/demand)^0.45; temperature follows power with a first-order lag (tau 45 s) towards
``inlet + R_th * power``, with a persistent per-GPU cooling offset and inlet (node ambient, position in the
chassis); at the slowdown threshold a controller lowers clocks to hold it. Idle GPUs drop to P8 (GDDR boards),
their idle clocks and PCIe Gen1, as the real captures show. Energy integrates power over time.

Fields a model does not report are absent: NVLink fields on PCIe cards, DCGM profiling on GeForce, memory
temperature on GDDR boards, ECC counters on boards without ECC, fan speed on passively cooled boards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from pipeline.events import (
    METRIC_INDEX,
    METRIC_NAMES,
    PHASES,
    FaultRecord,
    GpuContext,
    GpuEvent,
    GpuProcess,
    GpuSample,
    SampleBatch,
)
from pipeline.topology import NodeTopology
from pipeline.vocab import CLOCK_REASONS, GPU_IDLE, HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from producers.simulator.effects import GpuView, Now
from producers.simulator.faults import FaultInjector
from producers.simulator.hardware import MODELS, GpuModel, assign_kinds, node_topology, reported_fields
from producers.simulator.hardware import nvlink_links as kind_nvlink_links
from producers.simulator.hardware import pci_bus_id as kind_pci_bus_id
from producers.simulator.links import NvLinkRows
from producers.simulator.nics import NicRails
from producers.simulator.plan import FaultPlan
from producers.simulator.profiles import (
    APP_INDEX,
    L_CLOCK,
    L_DRAM,
    L_IB,
    L_NVLINK,
    L_PCIE_RX,
    L_PCIE_TX,
    L_POWER,
    L_SM,
    L_TENSOR,
    L_UTIL,
    P_IDLE,
    PROFILES,
    SYNC_APPS,
    Profile,
    jitter_table,
    level_table,
    low_table,
)
from producers.simulator.scheduler import Scheduler

_MIB = 2**20
_GIB = 2**30
#: PCIe bandwidth per lane and direction, bytes/s, by generation (after encoding overhead)
_LANE_BYTES = np.array([0.0, 0.25e9, 0.5e9, 0.985e9, 1.969e9, 3.938e9, 7.563e9, 15.125e9])
_THERMAL_TAU_S = 45.0
#: the longest step the thermal controllers are integrated in (they act within a second)
_CONTROL_STEP_S = 1.0
#: where the simulated nodes sit: racks of 4 nodes (8-GPU servers at ~10 kW each, a 40 kW rack), 8 nodes per leaf
NODES_PER_RACK = 4
NODES_PER_SWITCH = 8
#: an HBM board's memory max operating temperature (NVML_TEMPERATURE_THRESHOLD_MEM_MAX); no capture here reports
#: one (every board in tests/testdata says N/A), 95 C is what nvidia-smi's "Memory Max Operating Temp" shows for HBM
#: boards in public reports and tools' fixtures: an assumption, used only by the simulator
_HBM_MAX_C = 95.0
_POWER_EWMA_S = 60.0
_BIT_IDLE = float(GPU_IDLE)
_BIT_APP_CLOCKS = float(next(r.bit for r in CLOCK_REASONS if r.name == "ApplicationsClocksSetting"))
_BIT_POWER_CAP = float(SW_POWER_CAP)
_BIT_SW_THERMAL = float(SW_THERMAL)
_BIT_HW_THERMAL = float(HW_THERMAL)
_BIT_BRAKE = float(HW_SLOWDOWN | HW_POWER_BRAKE)
_HASHING = APP_INDEX["hashing"]
_SERVING = APP_INDEX["llm-serving"]
_BURSTY = np.array([a in PROFILES and PROFILES[a].dynamics in ("bursty", "interactive") for a in APP_INDEX])
_SYNC = np.array([a in SYNC_APPS for a in APP_INDEX])
_INTERACTIVE = np.array([a in PROFILES and PROFILES[a].dynamics == "interactive" for a in APP_INDEX])
#: requests per second at full load (bursty) and of an interactive session, and how long one runs on average
_REQUEST_RATE, _SESSION_RATE, _REQUEST_S = 0.35, 0.01, 4.0
_XORG = "/usr/lib/xorg/Xorg"


def _col(name: str) -> int:
    return METRIC_INDEX[name]


@dataclass(frozen=True, slots=True)
class SimRound:
    """One round of the fleet: node batches, workload changes, faults that started."""

    ts_ns: int
    batches: list[SampleBatch]
    contexts: list[GpuContext]
    ground_truth: list[FaultRecord]


def _uuid(rng: np.random.Generator) -> str:
    h = rng.bytes(16).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Fleet:
    """N nodes x M GPUs of a realistic mix, running jobs; optionally with faults and per-link/process/NIC extras.

    ``faults``: a :class:`FaultPlan` (None: no faults). ``extras``: per-link NVLink samples, processes, NIC ports
    and the odd benign XID (off by default: the foundation's consumers count samples, not extras).
    ``mix``: a key of :data:`.hardware.MIXES`, or ``"seeded"`` (proportions drawn from the seed). ``multi_node``:
    reserve partitions for multi-node pre-training.
    """

    def __init__(
        self,
        nodes: int,
        gpus_per_node: int,
        cluster: str = "sim",
        seed: int = 0,
        *,
        faults: FaultPlan | None = None,
        extras: bool = False,
        mix: str = "default",
        multi_node: bool = True,
    ) -> None:
        if nodes < 1 or gpus_per_node < 1:
            raise ValueError("a fleet needs at least one node with one GPU")
        hw_rng, sched_rng, noise_rng, fault_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
        )
        self.cluster = cluster
        self.gpus_per_node = gpus_per_node
        self.extras = extras
        self.kinds = assign_kinds(nodes, gpus_per_node, mix, seed)
        self.nodes = [f"node-{i:04d}" for i in range(nodes)]
        n = nodes * gpus_per_node
        self.uuids = [_uuid(hw_rng) for _ in range(n)]
        self.model: list[GpuModel] = [MODELS[k.model] for k in self.kinds for _ in range(gpus_per_node)]
        self._rng = noise_rng
        self._static(hw_rng)
        self._sched = Scheduler(self.kinds, gpus_per_node, sched_rng, self._mem_total / _GIB, multi_node)
        self._injector = FaultInjector(faults or FaultPlan(rate_scale=0.0), self._view(), fault_rng, extras)
        self._levels, self._low, self._jitter = level_table(), low_table(), jitter_table()
        self._z = noise_rng.standard_normal(n)
        self._on = np.zeros(n, dtype=bool)
        self._f_thermal = np.ones(n)
        self._f_hbm = np.ones(n)
        self._temp = np.full(n, np.nan)
        self._hbm_excess = np.zeros(n)
        self._energy = noise_rng.uniform(1e7, 5e8, n).round(3)  # energy since the driver loaded, days ago
        self._power_ewma = np.zeros(n)
        self._memory_frac = np.zeros(n)
        self._t0_ns: int | None = None
        self._last_ns: int | None = None
        self._layouts = self._field_layouts()
        self._gpu_node = [node for node in self.nodes for _ in range(gpus_per_node)]
        self._model_name = [m.name for m in self.model]
        self._proc_key: np.ndarray | None = None
        self._proc_cache: list[tuple[GpuProcess, ...]] = [()] * n
        self._rails = NicRails(self.kinds, self.gpus_per_node)

    # --- construction -----------------------------------------------------------------------------------
    def _static(self, rng: np.random.Generator) -> None:
        """Per-GPU constants: limits from the catalogue, behaviour from the model, persistent offsets."""
        gpn, models = self.gpus_per_node, self.model
        n = len(models)
        col = np.array
        spec = [m.spec for m in models]
        self._mem_total = col([s.memory_bytes for s in spec], dtype=np.float64)
        self._reserved = col([m.reserved_mib * _MIB for m in models])
        self._usable = self._mem_total - self._reserved
        self._default_w = col([s.power_default_watts or 0.0 for s in spec])
        self._min_w = col([s.power_min_watts or 0.3 * (s.power_default_watts or 0.0) for s in spec])
        self._idle_w = col([m.idle_watts for m in models])
        self._clock_max = col([s.sm_clock_max_mhz or 0.0 for s in spec])
        self._idle_clock = col([m.idle_sm_clock_mhz for m in models])
        self._mclock_max = col([s.memory_clock_max_mhz or 0.0 for s in spec])
        # GeForce runs CUDA in P2 with memory a notch below max (rtx-3080-v13: 9251 of 9501 MHz); HBM never drops
        self._mclock_busy = np.where(
            col([m.busy_pstate == 2 for m in models]), self._mclock_max - 250, self._mclock_max
        )
        self._mclock_idle = np.where(col([m.hbm for m in models]), self._mclock_max, 405.0)
        self._slowdown = col([s.slowdown_celsius or 90.0 for s in spec])
        self._mem_max = np.where(col([m.hbm for m in models]), _HBM_MAX_C, np.nan)
        self._shutdown = col([s.shutdown_celsius or 95.0 for s in spec])
        self._gen_max = col([s.pcie_gen_max or 3 for s in spec], dtype=np.float64)
        self._width_max = col([s.pcie_width_max or 16 for s in spec], dtype=np.float64)
        self._busy_pstate = col([m.busy_pstate for m in models], dtype=np.float64)
        self._idle_pstate = col([m.idle_pstate for m in models], dtype=np.float64)
        self._fan = col([m.fan for m in models])
        self._nvidia = col([m.vendor == "nvidia" for m in models])
        self._workstation = col([k.fabric == "workstation" for k in self.kinds for _ in range(gpn)])
        # NVLink: remote ends per link as the node kind wires them
        self._link_remote: list[list[str | None]] = []
        for kind in self.kinds:
            self._link_remote += kind_nvlink_links(kind, gpn)
        self._nvlinks = col([len(r) for r in self._link_remote], dtype=np.float64)
        self._has_nvlink = self._nvlinks > 0
        self._link_rows = NvLinkRows(self._link_remote, self._has_nvlink)
        self._link_bytes = col([s.nvlink_gbytes_per_second * 1e9 for s in spec])
        self._bus_ids = [kind_pci_bus_id(k, g) for k in self.kinds for g in range(gpn)]
        # persistent offsets: power efficiency, cooling, inlet air by node and chassis position, boost clock
        self._efficiency = np.clip(rng.normal(1.0, 0.03, n), 0.92, 1.08)
        self._r_thermal = col([m.thermal_rise_c for m in models]) / self._default_w * rng.normal(1.0, 0.06, n)
        ambient = np.repeat(rng.normal(21.0, 1.5, len(self.kinds)), gpn)
        position = (np.arange(n) % gpn) / max(gpn - 1, 1) * 4.0  # GPUs further down the airflow run warmer
        self._inlet = ambient + position + rng.normal(0, 1.0, n)
        self._boost = np.clip(rng.normal(1.0, 0.01, n), 0.97, 1.0)
        # operators cap a pool of nodes for good (a state, set before the fleet's first round): one limit for every
        # node of a kind, as a power budget is set per pool, so the GPUs of a job (one kind) share it. Per-GPU
        # limits drawn at random made a job's lowest-capped GPU its straggler by construction (seed 10243's day one)
        pools = sorted({k.name for k in self.kinds})
        share = {name: float(rng.uniform(0.7, 0.85)) if rng.random() < 0.08 else 1.0 for name in pools}
        frac = np.repeat([share[k.name] for k in self.kinds], gpn)
        self._base_limit = np.where(
            frac < 1.0, np.maximum(np.round(self._default_w * frac), self._min_w), self._default_w
        )
        self._operator_limit = self._base_limit.copy()
        self._node_of = np.arange(n) // gpn

    def _view(self) -> GpuView:
        lanes = _LANE_BYTES[self._gen_max.astype(int)] * self._width_max
        return GpuView(
            self.cluster,
            self.nodes,
            self.uuids,
            self.gpus_per_node,
            self._has_nvlink,
            self._nvlinks.astype(int),
            [m.ecc for m in self.model],
            self._default_w,
            self._min_w,
            self._gen_max,
            self._width_max,
            self._usable,
            np.array([m.thermal_rise_c for m in self.model]),
            self._slowdown,
            lanes,
            self._nvlinks * self._link_bytes,
            self._mem_max,
            self._nvidia,
        )

    def _field_layouts(self) -> list[tuple[np.ndarray, np.ndarray, tuple[str, ...]]]:
        """GPUs grouped by the fields their model reports: (GPU indices, metric columns, field names)."""
        groups: dict[tuple[str, ...], list[int]] = {}
        for g, m in enumerate(self.model):
            groups.setdefault(reported_fields(m, bool(self._has_nvlink[g])), []).append(g)
        return [(np.array(members), np.array([_col(n) for n in names]), names) for names, members in groups.items()]

    # --- public API ---------------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.uuids)

    @property
    def profile(self) -> list[Profile]:
        """The application profile each GPU runs now ("idle" where no job runs)."""
        names = list(APP_INDEX)
        return [PROFILES[names[a]] for a in self._sched.gpu_app.tolist()]

    @property
    def injector(self) -> FaultInjector:
        return self._injector

    @property
    def scheduler(self) -> Scheduler:
        return self._sched

    def applications(self) -> list[str]:
        """The true application per GPU now (``idle`` where nothing runs)."""
        names = list(APP_INDEX)
        return [names[a] for a in self._sched.gpu_app.tolist()]

    def phases(self) -> list[str]:
        """The true phase per GPU now."""
        return [PHASES[p] for p in self._phase().tolist()]

    def tick(self, ts_ns: int) -> list[SampleBatch]:
        """One sampling round: one SampleBatch per node, every GPU read at ``ts_ns``."""
        return self.round(ts_ns).batches

    def contexts(self, ts_ns: int) -> list[GpuContext]:
        """Every GPU's current workload (None where nothing runs), for a full snapshot of the context topic."""
        return [
            GpuContext(self.cluster, self.nodes[g // self.gpus_per_node], uuid, ts_ns, self._sched.workload_of(g))
            for g, uuid in enumerate(self.uuids)
        ]

    def topologies(self, ts_ns: int) -> list[NodeTopology]:
        gpn = self.gpus_per_node
        return [
            replace(
                node_topology(kind, self.cluster, node, self.uuids[i * gpn : (i + 1) * gpn], ts_ns),
                rack=f"rack-{i // NODES_PER_RACK:03d}",
                switch=f"leaf-{i // NODES_PER_SWITCH:03d}",
            )
            for i, (kind, node) in enumerate(zip(self.kinds, self.nodes, strict=True))
        ]

    def round(self, ts_ns: int) -> SimRound:
        """Advance jobs, faults and physics to ``ts_ns`` and read every GPU."""
        first = self._t0_ns is None
        if self._t0_ns is None:
            self._t0_ns = ts_ns
        now_s = (ts_ns - self._t0_ns) / 1e9
        dt = 0.0 if self._last_ns is None else max((ts_ns - self._last_ns) / 1e9, 0.0)
        self._last_ns = ts_ns
        sched = self._sched
        changed = sched.fill(now_s) if first else []
        changed += sched.advance(now_s)
        inlet = self._inlet + self._injector.effects.inlet_add
        faults = self._injector.advance(
            Now(now_s, ts_ns, dt, sched, self._power_ewma, self._memory_frac, inlet, self._operator_limit)
        )
        changed += faults.changed
        if changed:
            self._on_job_change(np.unique(changed))
        values = self._physics(now_s, dt, first)
        batches = self._batches(values, ts_ns, faults.events)
        if first:
            contexts = self.contexts(ts_ns)
        else:
            contexts = [
                GpuContext(
                    self.cluster, self.nodes[g // self.gpus_per_node], self.uuids[g], ts_ns, sched.workload_of(g)
                )
                for g in dict.fromkeys(changed)
            ]
        return SimRound(ts_ns, batches, contexts, faults.records)

    # --- physics ------------------------------------------------------------------------------------------
    def _on_job_change(self, gpus: np.ndarray) -> None:
        # miners set a lower power limit when they start (a state, not a fault) and lock the core clock
        hashing = self._sched.gpu_app[gpus] == _HASHING
        capped = np.maximum(
            np.round(self._default_w[gpus] * self._rng.uniform(0.65, 0.8, len(gpus))), self._min_w[gpus]
        )
        self._operator_limit[gpus] = np.where(
            hashing, np.minimum(capped, self._base_limit[gpus]), self._base_limit[gpus]
        )

    def _phase(self) -> np.ndarray:
        sched = self._sched
        job = sched.gpu_job
        return np.where(job >= 0, sched.job_phase[np.maximum(job, 0)], P_IDLE)

    def _physics(self, now_s: float, dt: float, first: bool) -> dict[str, np.ndarray]:
        """Every GPU's readings this round: what its job asks of it (:meth:`_workload_levels`), then what the
        hardware makes of that (power, clocks and heat; memory; PCIe and NVLink; the clocks-event reasons)."""
        sched, e = self._sched, self._injector.effects
        n = self.size
        app, has_job = sched.gpu_app, sched.gpu_job >= 0
        lv, white = self._workload_levels(now_s, dt)
        util = lv[:, L_UTIL]
        active = (util > 0.005) | (lv[:, L_POWER] > 0.05)
        power, limit, capped, clock, temp, throttled = self._power_and_heat(lv, active, dt, first, white)
        memory = self._memory(now_s, has_job)
        gen, width, tx, rx, nvl, links_active = self._interconnect(lv, active)
        mask = self._clock_events(active, capped, throttled, app)
        fan = np.where(self._fan == "curve", np.where(temp < 45, 0.0, np.clip(30 + (temp - 45) * 2.0, 30, 100)), 0.0)
        self._ib = lv[:, L_IB] * sched.multi_node
        return {
            "utilization_gpu_percent": np.round(util * 100),
            "utilization_memory_percent": np.round(lv[:, L_DRAM] * 100),
            "memory_used_bytes": memory,
            "memory_total_bytes": self._mem_total,
            "memory_reserved_bytes": self._reserved,
            "sm_clock_mhz": np.round(clock),
            "sm_clock_max_mhz": self._clock_max,
            "graphics_clock_mhz": np.round(clock),
            "graphics_clock_max_mhz": self._clock_max,
            "memory_clock_mhz": np.where(has_job | active, self._mclock_busy, self._mclock_idle),
            "memory_clock_max_mhz": self._mclock_max,
            "temperature_gpu_celsius": np.round(temp),
            "temperature_memory_celsius": np.round(0.7 * temp + 21 + self._hbm_excess),
            "temperature_memory_max_celsius": self._mem_max,
            "temperature_slowdown_celsius": self._slowdown,
            "temperature_shutdown_celsius": self._shutdown,
            "power_watts": np.round(power, 2),
            "power_limit_watts": limit,
            "power_default_limit_watts": self._default_w,
            "energy_joules": np.round(self._energy, 3),
            "fan_speed_percent": np.round(fan),
            "performance_state": np.where(has_job | active, self._busy_pstate, self._idle_pstate),
            "throttle_reasons_mask": mask,
            "pcie_link_gen": gen,
            "pcie_link_gen_max": self._gen_max,
            "pcie_link_width": width,
            "pcie_link_width_max": self._width_max,
            "pcie_tx_bytes_per_second": np.round(tx),
            "pcie_rx_bytes_per_second": np.round(rx),
            "pcie_replay_total": e.pcie_replay,
            "pcie_aer_correctable_total": e.aer_correctable,
            "pcie_aer_uncorrectable_total": e.aer_uncorrectable,
            "nvlink_tx_bytes_per_second": np.round(nvl),
            "nvlink_rx_bytes_per_second": np.round(nvl * (1 + 0.01 * white[:, 1])).clip(0),
            "nvlink_links_active": links_active,
            "nvlink_links_max": self._nvlinks,
            "nvlink_crc_errors_total": e.nvl_crc.sum(axis=1),
            "nvlink_replay_errors_total": e.nvl_replay.sum(axis=1),
            "nvlink_recovery_errors_total": e.nvl_recovery.sum(axis=1),
            "sm_active_percent": np.round(lv[:, L_SM] * 100, 1),
            "tensor_active_percent": np.round(lv[:, L_TENSOR] * 100, 1),
            "dram_active_percent": np.round(lv[:, L_DRAM] * 100, 1),
            "ecc_corrected_total": e.ecc_corrected,
            "ecc_uncorrected_total": e.ecc_uncorrected,
            "row_remap_correctable_total": e.remap_correctable,
            "row_remap_uncorrectable_total": e.remap_uncorrectable,
            "row_remap_pending": e.remap_pending,
            "row_remap_failure": e.remap_failure,
            "retired_pages_sbe_total": e.retired_sbe,
            "retired_pages_dbe_total": e.retired_dbe,
            "retired_pages_pending": e.retired_pending,
            "process_count": has_job.astype(np.float64)
            + (self._workstation & (np.arange(n) % self.gpus_per_node == 0)),
        }

    def _workload_levels(self, now_s: float, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """What each GPU's job asks of it this round, as levels in [0, 1] per profile column (the phase's, the
        load curve's, the request bursts', its intensity and wobble, a straggler's peers waiting, a host-side
        straggler's duty, restarts), and the round's white noise (three draws per GPU)."""
        sched, e, rng = self._sched, self._injector.effects, self._rng
        n = self.size
        app, job = sched.gpu_app, sched.gpu_job
        has_job = job >= 0
        slot = np.maximum(job, 0)
        lv = self._levels[app, self._phase()]
        low = self._low[app]
        # serving follows a daily load curve plus request noise; bursty apps switch between requests and idle
        hour = (now_s / 3600.0 + (self._t0_ns or 0) / 3.6e12) % 24
        load = sched.job_load_mid[slot] + sched.job_load_amp[slot] * np.cos(
            2 * np.pi * (hour - sched.job_peak_hour[slot]) / 24
        )
        self._z = 0.9 * self._z + math.sqrt(1 - 0.81) * rng.standard_normal(n)
        white = rng.standard_normal((n, 3))
        load = np.clip(load + 0.12 * self._z, 0.02, 1.0)
        serving = app == _SERVING
        lv = np.where(serving[:, None], low + (lv - low) * load[:, None], lv)
        # continuous batching launches kernels whenever any request is in flight: utilisation saturates at
        # modest load while SM activity and power keep scaling with the batch
        busy_u = low[:, L_UTIL] + (self._levels[app, 0, L_UTIL] - low[:, L_UTIL]) * (1 - np.exp(-4 * load))
        lv[:, L_UTIL] = np.where(serving, busy_u, lv[:, L_UTIL])
        if dt > 0:
            rate = np.where(_INTERACTIVE[app], _SESSION_RATE, _REQUEST_RATE * load)
            start = rng.random(n) < rate * dt
            stop = rng.random(n) < dt / _REQUEST_S
            self._on = np.where(self._on, ~stop, start)
        bursty = _BURSTY[app] & has_job
        on_row = self._levels[app, 0]  # a request (or a notebook cell) runs at the compute levels
        lv = np.where(bursty[:, None], np.where(self._on[:, None], on_row, low), lv)
        # how hard this job drives the GPU, then its own wobble (AR(1), shared by its levels) and white noise
        intensity = np.where(has_job, sched.job_intensity[slot], 1.0)
        lv = lv.copy()
        idle_frac = self._idle_w / self._default_w
        lv[:, L_POWER] = np.where(
            lv[:, L_POWER] > idle_frac, idle_frac + (lv[:, L_POWER] - idle_frac) * intensity, lv[:, L_POWER]
        )
        for level in (L_TENSOR, L_DRAM, L_NVLINK, L_IB):
            lv[:, level] *= intensity
        lv[:, L_SM] *= np.sqrt(intensity)  # SMs stay occupied by slower, memory-bound kernels: activity drops less
        wobble = 1 + self._jitter[app] * self._z
        # the ranks of a synchronous job run every step together (each waits for the others): their pace wobbles as
        # one, only their power (each GPU's own efficiency) on its own
        sync = has_job & sched.multi & _SYNC[app]
        pace = wobble
        if sync.any():
            size = np.bincount(job[sync], minlength=len(sched.job_intensity))
            mean_z = np.bincount(job[sync], weights=self._z[sync], minlength=len(size)) / np.maximum(size, 1)
            pace = np.where(sync, 1 + self._jitter[app] * mean_z[slot], wobble)
        for level in (L_UTIL, L_SM, L_TENSOR, L_DRAM):
            lv[:, level] *= pace
        lv[:, L_POWER] *= wobble
        lv[:, L_POWER] *= 1 + 0.01 * white[:, 0]
        traffic = 1 + np.clip(2 * self._jitter[app] * self._z + 0.05 * white[:, 1], -0.5, 0.5)
        for level in (L_PCIE_TX, L_PCIE_RX, L_NVLINK, L_IB):
            lv[:, level] *= traffic
        # peers waiting on a straggler or on a slow NVLink fallback spin in NCCL kernels: a kernel runs all the time
        # (utilization stays), the SMs and tensor cores mostly wait (activity and power dip every step, deeper
        # every few seconds)
        wait = e.wait
        if wait.any():
            dip = (math.floor(now_s) % e.wait_period) == 0
            depth = wait * np.where(dip, 1.6, 0.7)
            for level in (L_SM, L_TENSOR, L_POWER, L_NVLINK, L_IB):
                lv[:, level] *= np.clip(1 - depth, 0.05, 1)
        # a host-side straggler waits for its input between steps: over a reading's second it runs kernels only a
        # `duty` share of the time (NVML's utilization is that share), with the steps' jitter
        slow = e.duty < 1.0
        if slow.any():
            share = np.clip(e.duty[slow] * (1 + 0.03 * white[slow, 2]), 0.0, 1.0)
            for level in (L_UTIL, L_SM, L_TENSOR, L_DRAM, L_POWER, L_NVLINK, L_IB):
                lv[slow, level] *= share
        # restarts (XID, out of memory) idle the GPU
        stalled = now_s < e.stall_until
        if stalled.any():
            clock = lv[:, L_CLOCK].copy()
            lv = np.where(stalled[:, None], 0.0, lv)
            lv[:, L_CLOCK] = np.where(stalled, 0.0, clock)
        return np.clip(lv, 0.0, 1.0), white

    def _power_and_heat(
        self, lv: np.ndarray, active: np.ndarray, dt: float, first: bool, white: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """Power (against the limits in force), SM clock, die temperature and the thermal controllers (die and
        memory) this round: (power, limit, capped, clock, temperature as read, throttled). A round longer than
        :data:`_CONTROL_STEP_S` is integrated in steps of at most that: the controllers act within seconds, and
        one 60 s step of theirs swung a degraded HBM's memory to 158 C (seed 33445 of the offline evaluation), and the
        readings of a GPU must not depend on how often it is read."""
        steps = max(1, math.ceil(dt / _CONTROL_STEP_S))
        for k in range(steps):
            out = self._heat_step(lv, active, dt / steps, first and k == 0, white)
        return out

    def _heat_step(
        self, lv: np.ndarray, active: np.ndarray, dt: float, first: bool, white: np.ndarray
    ) -> tuple[np.ndarray, ...]:
        """One step of :meth:`_power_and_heat`."""
        e = self._injector.effects
        # power, limits, clocks
        demand = np.maximum(self._idle_w, lv[:, L_POWER] * self._default_w * self._efficiency)
        demand *= e.clock_factor**2  # a GPU held at a lower clock also runs at a lower voltage
        heat = self._f_thermal * self._f_hbm  # the clocks the thermal controllers (die, memory) allow
        demand = np.maximum(demand * heat**1.5, self._idle_w)
        limit = np.minimum(self._operator_limit, e.cap_watts)
        capped = demand > limit
        # at the limit the controller swings around it: NVML's readings overshoot by a few percent now and then
        power = np.where(capped, limit * np.clip(1 + 0.03 * white[:, 1], 0.94, 1.1), demand)
        cap_factor = np.where(capped, (limit / demand) ** 0.45, 1.0)
        clock_frac = np.where(active, lv[:, L_CLOCK], 0.0)
        clock = np.maximum(
            self._clock_max * clock_frac * self._boost * cap_factor * heat * e.clock_factor, self._idle_clock
        )
        clock = np.minimum(clock, self._clock_max)
        # temperature: first-order lag towards inlet + R * power; the slowdown controller holds the threshold
        inlet = self._inlet + e.inlet_add
        equilibrium = inlet + self._r_thermal * e.thermal_k * power
        if first or np.isnan(self._temp).any():
            self._temp = np.where(np.isnan(self._temp), equilibrium, self._temp)
        else:
            self._temp += (equilibrium - self._temp) * (1 - math.exp(-dt / _THERMAL_TAU_S))
        temp = self._temp + 0.3 * white[:, 2]
        over = self._temp - (self._slowdown - 1)
        if dt > 0:
            self._f_thermal = np.clip(
                np.where(over > 0, self._f_thermal - 0.03 * over * dt, self._f_thermal + 0.01 * dt), 0.3, 1.0
            )
        # the memory: ~0.7 of the die's rise; a degraded interface over the stacks (a fault) adds heat with power;
        # above its max operating temperature the driver slows the clocks (SW thermal slowdown) to hold it there
        mem_add = e.hbm_add * np.clip(power / np.maximum(self._default_w, 1.0), 0.2, 1.0)
        if dt > 0:
            self._hbm_excess += (mem_add - self._hbm_excess) * (1 - math.exp(-dt / _THERMAL_TAU_S))
            over_mem = np.nan_to_num(0.7 * self._temp + 21 + self._hbm_excess - (self._mem_max - 1), nan=-1.0)
            self._f_hbm = np.clip(
                np.where(over_mem > 0, self._f_hbm - 0.03 * over_mem * dt, self._f_hbm + 0.01 * dt), 0.3, 1.0
            )
        throttled = (self._f_thermal < 0.999) | (self._f_hbm < 0.999)
        self._energy += power * dt
        alpha = 1 - math.exp(-dt / _POWER_EWMA_S) if dt > 0 else 1.0
        self._power_ewma += (power / self._default_w - self._power_ewma) * alpha
        return power, limit, capped, clock, temp, throttled

    def _memory(self, now_s: float, has_job: np.ndarray) -> np.ndarray:
        """Memory used: ramps to the job's level after it (re)starts, plus a leak; a few MiB when nothing runs."""
        sched, e, n = self._sched, self._injector.effects, self.size
        since = now_s - np.maximum(sched.job_start, e.restarted_at)
        ramp = 1 - np.exp(-np.maximum(since, 0) / sched.mem_tau)
        job_mem = self._usable * sched.mem_target * ramp + e.leak_bytes
        idle_mem = np.where(self._workstation & (np.arange(n) % self.gpus_per_node == 0), 22, 3) * _MIB
        wanted = np.where(has_job, np.maximum(job_mem, 300 * _MIB), idle_mem)
        memory: np.ndarray = np.minimum(np.floor(wanted / _MIB) * _MIB, self._usable)
        self._memory_frac = memory / self._usable
        return memory

    def _interconnect(self, lv: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, ...]:
        """PCIe (Gen1 at idle for link power saving; a fault may have trained it lower or narrower) and NVLink
        traffic, NVLink falling back to PCIe where its links are down: (gen, width, tx, rx, nvlink, links up)."""
        sched, e, n = self._sched, self._injector.effects, self.size
        gen = np.where(active, np.minimum(self._gen_max, e.gen_cap), 1.0)
        width = np.minimum(self._width_max, e.width_cap)
        full_bw = _LANE_BYTES[self._gen_max.astype(int)] * self._width_max
        now_bw = _LANE_BYTES[gen.astype(int)] * width
        nvl_wanted = lv[:, L_NVLINK] * self._nvlinks * self._link_bytes * sched.multi
        fallback = np.where(e.nvlink_fallback, nvl_wanted, 0.0)
        background = self._rng.uniform(0, 1e6, (n, 2))
        tx = np.minimum(lv[:, L_PCIE_TX] * full_bw + fallback, 0.9 * now_bw) + background[:, 0]
        rx = np.minimum(lv[:, L_PCIE_RX] * full_bw + fallback, 0.9 * now_bw) + background[:, 1]
        nvl = np.where(e.nvlink_fallback, 0.0, nvl_wanted)
        links_active = (e.link_up & e.link_exists).sum(axis=1) if e.links else np.zeros(n)
        return gen, width, tx, rx, nvl, links_active

    def _clock_events(
        self, active: np.ndarray, capped: np.ndarray, throttled: np.ndarray, app: np.ndarray
    ) -> np.ndarray:
        """NVML's clocks-event reasons as a mask per GPU."""
        e = self._injector.effects
        mask = np.where(active, 0.0, _BIT_IDLE)
        mask += np.where(capped & active, _BIT_POWER_CAP, 0.0)
        mask += np.where(throttled, _BIT_SW_THERMAL, 0.0)
        mask += np.where(self._temp >= self._slowdown, _BIT_HW_THERMAL, 0.0)
        mask += np.where((app == _HASHING) & active, _BIT_APP_CLOCKS, 0.0)
        mask += np.where(e.brake, _BIT_BRAKE, 0.0)
        return mask

    # --- assembly -----------------------------------------------------------------------------------------
    def _batches(
        self, values: dict[str, np.ndarray], ts_ns: int, events: list[tuple[int, GpuEvent]]
    ) -> list[SampleBatch]:
        n, gpn, cluster = self.size, self.gpus_per_node, self.cluster
        matrix = np.empty((n, len(METRIC_NAMES)))
        for name, column in values.items():
            matrix[:, METRIC_INDEX[name]] = column
        lost = self._injector.effects.lost
        links = self._link_rows.samples(self._injector.effects) if self.extras else [None] * n
        procs: list[tuple[GpuProcess, ...]] | list[None] = (
            self._processes(values["memory_used_bytes"]) if self.extras else [None] * n
        )
        samples: list[GpuSample | None] = [None] * n
        gpu_node, model_name, uuids = self._gpu_node, self._model_name, self.uuids
        for members, cols, names in self._layouts:
            rows = matrix[np.ix_(members, cols)].tolist()
            for g, row in zip(members.tolist(), rows, strict=True):
                samples[g] = GpuSample(
                    cluster,
                    gpu_node[g],
                    uuids[g],
                    g % gpn,
                    model_name[g],
                    ts_ns,
                    dict(zip(names, row, strict=True)),
                    links[g],
                    procs[g] if self._nvidia[g] else None,  # AMD's exporter lists no processes
                )
        for g in np.flatnonzero(lost).tolist():  # fallen off the bus: no reading
            samples[g] = None
        by_node: dict[int, list[GpuEvent]] = {}
        for at, event in events:
            by_node.setdefault(at, []).append(event)
        nics = (
            self._rails.samples(self._ib, self._rng, self.cluster, self.nodes, ts_ns)
            if self.extras
            else [()] * len(self.nodes)
        )
        batches = []
        for i, name in enumerate(self.nodes):
            mine = samples[i * gpn : (i + 1) * gpn]
            node_events = by_node.get(i)
            batches.append(
                SampleBatch(
                    cluster,
                    name,
                    tuple(s for s in mine if s is not None) if None in mine else tuple(mine),  # type: ignore[arg-type]
                    tuple(sorted(node_events, key=lambda e: (e.ts_ns, e.gpu_index))) if node_events else (),
                    nics[i],
                )
            )
        return batches

    def _processes(self, memory: np.ndarray) -> list[tuple[GpuProcess, ...]]:
        """Processes per GPU (Xorg on a workstation's first GPU, one per rank of a job); reused while unchanged."""
        sched, gpn = self._sched, self.gpus_per_node
        key = np.stack([sched.gpu_job.astype(np.float64), memory], axis=1)
        changed = np.flatnonzero((key != self._proc_key).any(axis=1)) if self._proc_key is not None else None
        self._proc_key = key
        gpus = range(self.size) if changed is None else changed.tolist()
        used_all = memory.astype(np.int64)
        for g in gpus:
            procs: list[GpuProcess] = []
            xorg = bool(self._workstation[g]) and g % gpn == 0
            if xorg:
                procs.append(GpuProcess(1200 + int(self._node_of[g]), _XORG, 22 * _MIB, "graphics"))
            job = sched.job_of(g)
            if job is not None:
                name = job.profile.process[job.workload.framework or ""]
                used = int(used_all[g]) - (22 * _MIB if xorg else 0)
                procs.append(GpuProcess(job.pid + job.gpus.index(g), name, used, "compute"))
            self._proc_cache[g] = tuple(procs)
        return self._proc_cache
