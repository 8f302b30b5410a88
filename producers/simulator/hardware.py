"""The simulated fleet's hardware: GPU models, node kinds (fabric, NICs, PCIe layout) and each node's topology.

Limits (memory, power limits, clocks, thermal thresholds, PCIe, NVLink) come from :mod:`pipeline.catalogue`;
this module adds only what a simulation needs beyond limits, each value with where it comes from:

- idle power: the real nvidia-smi captures where there is one (A10G 25.6 W, RTX 3090 27.2 W), AcmeTrace's A100
  fleet p5 (61.8 W) for A100, estimates from the same ratio of idle to TDP for the others;
- the temperature rise at the power limit: AcmeTrace A100 p99 69 C at ~430 W with a ~27 C idle (40 C per 400 W),
  the others chosen so a healthy GPU at its limit stays 12-20 C below its slowdown threshold (datasheet airflow);
- which optional fields a model reports: DCGM profiling (sm/tensor/dram active) only on data-centre GPUs, memory
  temperature only on HBM boards, fan speed on boards with fans (and the A10G, whose capture reports 0 %), ECC
  with row remapping on Ampere and later data-centre GPUs, page retirement on Volta, no ECC on GeForce;
- idle behaviour from the captures: P8 at 210 MHz SM and 405 MHz memory on GDDR boards, PCIe Gen1 at idle,
  P2 with the memory clock a notch under its maximum for CUDA work on GeForce (rtx-3080-v13: 9251 of 9501 MHz).

A node kind is a kind of server: 8-GPU HGX boards with NVSwitch (H100, H200, A100), a DGX-1 style V100 hybrid
cube mesh, PCIe servers (L40S, A10G) and workstations/rigs of consumer cards (RTX 3090, GTX 1080 Ti).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from pipeline.catalogue import GpuSpec, lookup
from pipeline.events import METRIC_NAMES
from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink, TopologyNic
from producers.amd.exporter import FIELDS as AMD_FIELDS


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A GPU model as simulated: its catalogue limits plus how it behaves and what it reports."""

    spec: GpuSpec
    idle_watts: float
    #: temperature rise over the inlet at the default power limit, C
    thermal_rise_c: float
    #: DCGM profiling fields (sm/tensor/dram active): data-centre GPUs only
    profiling: bool
    #: HBM: memory temperature reported, memory clock stays at its maximum
    hbm: bool
    #: "remap" (Ampere+ data centre), "retire" (Volta: page retirement), "counters" (ECC counted, nothing remapped
    #: as far as the source tells: AMD's exporter), "" (no ECC)
    ecc: str
    #: "curve" (fan follows temperature), "zero" (reported, always 0 %), "" (not reported)
    fan: str
    reserved_mib: float
    idle_sm_clock_mhz: float
    busy_pstate: int
    idle_pstate: int

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def nvlink(self) -> bool:
        return self.vendor == "nvidia" and self.spec.nvlink_links > 0

    @property
    def vendor(self) -> str:
        """``amd`` for AMD Instinct (read through AMD's device-metrics-exporter), else ``nvidia`` (NVML, DCGM)."""
        return "amd" if self.spec.name.startswith("AMD ") else "nvidia"

    @property
    def memory_bytes(self) -> int:
        return self.spec.memory_bytes

    @property
    def power_limit_watts(self) -> float:
        return float(self.spec.power_default_watts or 0.0)


#: the fields every simulated GPU reports, whatever its model
_ALWAYS: Final = (
    "utilization_gpu_percent", "utilization_memory_percent", "memory_used_bytes", "memory_total_bytes",
    "memory_reserved_bytes", "sm_clock_mhz", "sm_clock_max_mhz", "graphics_clock_mhz", "graphics_clock_max_mhz",
    "memory_clock_mhz", "memory_clock_max_mhz", "temperature_gpu_celsius", "temperature_slowdown_celsius",
    "temperature_shutdown_celsius", "power_watts", "power_limit_watts", "power_default_limit_watts", "energy_joules",
    "performance_state", "throttle_reasons_mask", "pcie_link_gen", "pcie_link_gen_max", "pcie_link_width",
    "pcie_link_width_max", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second", "pcie_replay_total",
    "pcie_aer_correctable_total", "pcie_aer_uncorrectable_total", "process_count",
)  # fmt: skip
#: the limit fields a source fills from the catalogue (absent where the catalogue has no figure)
_LIMITS: Final = frozenset(
    {
        "power_limit_watts",
        "power_default_limit_watts",
        "temperature_slowdown_celsius",
        "temperature_shutdown_celsius",
        "pcie_link_gen_max",
        "pcie_link_width_max",
        "memory_clock_max_mhz",
        "sm_clock_max_mhz",
        "graphics_clock_max_mhz",
    }
)
_ECC: Final = {
    "remap": "row_remap_correctable_total row_remap_uncorrectable_total row_remap_pending row_remap_failure",
    "retire": "retired_pages_sbe_total retired_pages_dbe_total retired_pages_pending",
    "": "",
}
_NVLINK: Final = """nvlink_tx_bytes_per_second nvlink_rx_bytes_per_second nvlink_links_active nvlink_links_max
    nvlink_crc_errors_total nvlink_replay_errors_total nvlink_recovery_errors_total"""


def reported_fields(model: GpuModel, nvlink: bool) -> tuple[str, ...]:
    """The sample fields a GPU of this model reports (wired with NVLink or not), in schema order. An AMD GPU
    reports what AMD's exporter source gives for its model (producers.amd.exporter.FIELDS, the catalogue's
    limits where it has them): no NVLink, PCIe width, fan, row remapping, performance state or processes."""
    if model.vendor == "amd":
        limits = model.spec.limit_metrics()
        missing = {name for name in _LIMITS if name not in limits}
        if model.spec.memory_clock_max_mhz is None:  # the memory clock means nothing without its maximum
            missing.add("memory_clock_mhz")
        return tuple(n for n in METRIC_NAMES if n in AMD_FIELDS and n not in missing)
    names = set(_ALWAYS)
    names |= {"fan_speed_percent"} if model.fan else set()
    names |= {"temperature_memory_celsius", "temperature_memory_max_celsius"} if model.hbm else set()
    names |= {"sm_active_percent", "tensor_active_percent", "dram_active_percent"} if model.profiling else set()
    names |= {"ecc_corrected_total", "ecc_uncorrected_total"} if model.ecc else set()
    names |= set(_ECC[model.ecc].split())
    names |= set(_NVLINK.split()) if nvlink else set()
    return tuple(n for n in METRIC_NAMES if n in names)


def _model(
    name: str, idle: float, rise: float, *, dc: bool, hbm: bool, ecc: str, fan: str, reserved: float, idle_clock: float
) -> GpuModel:
    spec = lookup(name)
    if spec is None or spec.power_default_watts is None or spec.sm_clock_max_mhz is None:
        raise LookupError(f"{name} is not in the GPU catalogue with its limits")
    return GpuModel(spec, idle, rise, dc, hbm, ecc, fan, reserved, idle_clock, 0 if dc else 2, 0 if hbm else 8)


MODELS: Final[dict[str, GpuModel]] = {
    m.name: m
    for m in (
        _model("NVIDIA H100 80GB HBM3", 70, 40, dc=True, hbm=True, ecc="remap", fan="", reserved=551, idle_clock=345),
        _model("NVIDIA H200", 75, 40, dc=True, hbm=True, ecc="remap", fan="", reserved=563, idle_clock=345),
        _model("NVIDIA A100-SXM4-80GB", 60, 40, dc=True, hbm=True, ecc="remap", fan="", reserved=531, idle_clock=210),
        _model("NVIDIA A100-SXM4-40GB", 55, 40, dc=True, hbm=True, ecc="remap", fan="", reserved=487, idle_clock=210),
        _model("Tesla V100-SXM2-32GB", 42, 40, dc=True, hbm=True, ecc="retire", fan="", reserved=306, idle_clock=135),
        _model("NVIDIA L40S", 35, 45, dc=True, hbm=False, ecc="remap", fan="", reserved=531, idle_clock=210),
        _model("NVIDIA A10G", 25.6, 42, dc=True, hbm=False, ecc="remap", fan="zero", reserved=435, idle_clock=210),
        _model(
            "NVIDIA GeForce RTX 3090", 27.2, 45, dc=False, hbm=False, ecc="", fan="curve", reserved=450, idle_clock=210
        ),
        _model(
            "NVIDIA GeForce GTX 1080 Ti", 14, 48, dc=False, hbm=False, ecc="", fan="curve", reserved=180, idle_clock=139
        ),
        # an MI300X idles at 191 W socket power, 39 C junction, its engine clock held at 2105 MHz (rocm-smi in
        # ROCm/legacy-rocm-build#5231): rise 60 C at 750 W is that 15 C over the inlet at 191 W, scaled; ECC
        # counted, no row remapping in what the exporter reports; driver-reserved memory assumed as an H100's
        _model(
            "AMD Instinct MI300X", 191, 60, dc=True, hbm=True, ecc="counters", fan="", reserved=551, idle_clock=2100
        ),
    )
}


@dataclass(frozen=True, slots=True)
class NodeKind:
    """A kind of server: its GPU model, how its GPUs are connected, its RDMA NICs and what runs on it."""

    name: str
    model: str
    #: "nvswitch", "cube-mesh" (DGX-1 V100, exactly 8 GPUs), "pcie" (2 sockets), "workstation" (1 socket),
    #: "xgmi" (AMD's Infinity Fabric between every pair; its traffic is not simulated: no source reports it)
    fabric: str
    nvswitches: int
    nic_count: int
    nic_rate_gbps: float
    nic_link_layer: str
    bus_ids: tuple[str, ...]
    #: application -> weight of the single-node jobs the scheduler starts on this kind of node
    apps: tuple[tuple[str, float], ...]
    #: share of these nodes reserved for multi-node LLM pre-training partitions
    pretraining_share: float = 0.0
    #: mean idle time before a freed GPU gets its next job, seconds
    idle_gap_s: float = 1500.0


# Bus ids as nvidia-smi prints them on such servers (DGX H100 / DGX A100 / DGX-1 layouts; PCIe servers' slots).
_HGX_H100_BUS = ("1B", "43", "52", "61", "9D", "C3", "D1", "DF")
_HGX_A100_BUS = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
_DGX1_BUS = ("06", "07", "0A", "0B", "85", "86", "89", "8A")
_PCIE_BUS = ("17", "31", "4B", "65", "98", "B1", "CA", "E3")
_WS_BUS = ("01", "21", "41", "61", "81", "A1", "C1", "E1")

_DC_SHARED = (
    ("llm-finetuning", 0.32),
    ("llm-serving", 0.25),
    ("bert-training", 0.12),
    ("resnet-training", 0.12),
    ("stable-diffusion-inference", 0.07),
    ("idle", 0.05),
)
NODE_KINDS: Final[dict[str, NodeKind]] = {
    k.name: k
    for k in (
        NodeKind(
            "hgx-h100",
            "NVIDIA H100 80GB HBM3",
            "nvswitch",
            4,
            8,
            400,
            "InfiniBand",
            _HGX_H100_BUS,
            _DC_SHARED,
            pretraining_share=0.5,
        ),
        NodeKind(
            "hgx-h200",
            "NVIDIA H200",
            "nvswitch",
            4,
            8,
            400,
            "InfiniBand",
            _HGX_H100_BUS,
            _DC_SHARED,
            pretraining_share=0.5,
        ),
        NodeKind(
            "hgx-a100-80",
            "NVIDIA A100-SXM4-80GB",
            "nvswitch",
            6,
            8,
            200,
            "InfiniBand",
            _HGX_A100_BUS,
            _DC_SHARED,
            pretraining_share=0.5,
        ),
        NodeKind(
            "hgx-a100-40",
            "NVIDIA A100-SXM4-40GB",
            "nvswitch",
            6,
            8,
            200,
            "InfiniBand",
            _HGX_A100_BUS,
            _DC_SHARED,
            pretraining_share=0.3,
        ),
        NodeKind(
            "dgx1-v100",
            "Tesla V100-SXM2-32GB",
            "cube-mesh",
            0,
            4,
            100,
            "InfiniBand",
            _DGX1_BUS,
            (("bert-training", 0.35), ("resnet-training", 0.35), ("llm-finetuning", 0.15), ("idle", 0.15)),
        ),
        NodeKind(
            "pcie-l40s",
            "NVIDIA L40S",
            "pcie",
            0,
            2,
            100,
            "Ethernet",
            _PCIE_BUS,
            (
                ("llm-serving", 0.3),
                ("stable-diffusion-inference", 0.25),
                ("rendering", 0.2),
                ("llm-finetuning", 0.1),
                ("bert-training", 0.05),
                ("resnet-training", 0.05),
                ("idle", 0.05),
            ),
        ),
        NodeKind(
            "pcie-a10g",
            "NVIDIA A10G",
            "pcie",
            0,
            1,
            100,
            "Ethernet",
            _PCIE_BUS,
            (
                ("llm-serving", 0.35),
                ("stable-diffusion-inference", 0.3),
                ("bert-training", 0.1),
                ("resnet-training", 0.1),
                ("llm-finetuning", 0.05),
                ("idle", 0.1),
            ),
        ),
        NodeKind(
            "ws-rtx3090",
            "NVIDIA GeForce RTX 3090",
            "workstation",
            0,
            0,
            0,
            "",
            _WS_BUS,
            (
                ("hashing", 0.3),
                ("rendering", 0.25),
                ("stable-diffusion-inference", 0.25),
                ("resnet-training", 0.1),
                ("idle", 0.1),
            ),
            idle_gap_s=2400.0,
        ),
        NodeKind(
            "ws-1080ti",
            "NVIDIA GeForce GTX 1080 Ti",
            "workstation",
            0,
            0,
            0,
            "",
            _WS_BUS,
            (("hashing", 0.45), ("rendering", 0.3), ("resnet-training", 0.15), ("idle", 0.1)),
            idle_gap_s=2400.0,
        ),
        # an 8-GPU MI300X OAM platform: the GPUs fully connected over Infinity Fabric (XGMI), RoCE NICs
        NodeKind(
            "oam-mi300x",
            "AMD Instinct MI300X",
            "xgmi",
            0,
            8,
            400,
            "Ethernet",
            _PCIE_BUS,
            _DC_SHARED,
            pretraining_share=0.5,
        ),
        # AcmeTrace's clusters: A100-SXM4-80GB HGX nodes used for LLM development only (calibration mix)
        NodeKind(
            "acme-a100",
            "NVIDIA A100-SXM4-80GB",
            "nvswitch",
            6,
            8,
            200,
            "InfiniBand",
            _HGX_A100_BUS,
            (("llm-finetuning", 0.35), ("llm-serving", 0.35), ("idle", 0.3)),
            pretraining_share=0.4,
            idle_gap_s=7200.0,
        ),
    )
}

#: Fleet mixes: node kind -> share of nodes. "default" is a mixed GPU cloud; "llm-a100" mimics AcmeTrace's clusters.
MIXES: Final[dict[str, tuple[tuple[str, float], ...]]] = {
    "default": (
        ("hgx-h100", 0.28),
        ("hgx-h200", 0.05),
        ("hgx-a100-80", 0.14),
        ("hgx-a100-40", 0.05),
        ("dgx1-v100", 0.05),
        ("pcie-l40s", 0.15),
        ("pcie-a10g", 0.10),
        ("ws-rtx3090", 0.12),
        ("ws-1080ti", 0.06),
    ),
    "llm-a100": (("acme-a100", 1.0),),
    # a mixed-vendor cloud: NVIDIA HGX beside AMD Instinct nodes
    "nvidia-amd": (("hgx-h100", 0.4), ("hgx-a100-80", 0.2), ("oam-mi300x", 0.4)),
    "amd": (("oam-mi300x", 1.0),),
}

# DGX-1 (V100) hybrid cube mesh as `nvidia-smi topo -m` shows it: NVLinks between GPU pairs, SYS elsewhere.
_CUBE_MESH: Final[dict[tuple[int, int], int]] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2, (1, 2): 2, (1, 3): 1, (1, 5): 2, (2, 3): 2, (2, 6): 1,
    (3, 7): 1, (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
}  # fmt: skip


def kind_fits(kind: NodeKind, gpus_per_node: int) -> bool:
    """The DGX-1 cube mesh only exists with 8 GPUs; every other kind takes any count."""
    return kind.fabric != "cube-mesh" or gpus_per_node == 8


def pci_bus_id(kind: NodeKind, index: int) -> str:
    base = kind.bus_ids[index % len(kind.bus_ids)]
    return f"00000000:{base}:{index // len(kind.bus_ids):02X}.0"


def numa_of(kind: NodeKind, index: int, gpus: int) -> int:
    return 0 if kind.fabric == "workstation" else int(index >= (gpus + 1) // 2)


def nvlink_links(kind: NodeKind, gpus: int) -> list[list[str | None]]:
    """Per GPU, the remote end (PCI bus id) of each of its NVLinks; empty lists on PCIe-only kinds."""
    model = MODELS[kind.model]
    if kind.fabric == "nvswitch":
        per_switch = [model.spec.nvlink_links // kind.nvswitches] * kind.nvswitches
        for s in range(model.spec.nvlink_links - sum(per_switch)):
            per_switch[s] += 1  # H100: 18 links over 4 NVSwitches as 5/4/4/5 (first ones here)
        switches = [f"00000000:{0x05 + s:02X}:00.0" for s in range(kind.nvswitches)]
        ends: list[str | None] = [switches[s] for s, count in enumerate(per_switch) for _ in range(count)]
        return [list(ends) for _ in range(gpus)]
    if kind.fabric == "cube-mesh":
        out: list[list[str | None]] = [[] for _ in range(gpus)]
        for (a, b), count in _CUBE_MESH.items():
            out[a] += [pci_bus_id(kind, b)] * count
            out[b] += [pci_bus_id(kind, a)] * count
        return out
    return [[] for _ in range(gpus)]


def _pair_kind(kind: NodeKind, a: int, b: int, gpus: int) -> tuple[str, int]:
    if kind.fabric == "nvswitch":
        links = MODELS[kind.model].spec.nvlink_links
        return f"NV{links}", links
    if kind.fabric == "cube-mesh" and (count := _CUBE_MESH.get((min(a, b), max(a, b)), 0)):
        return f"NV{count}", count
    if kind.fabric == "workstation":
        return "PHB", 0
    if kind.fabric == "xgmi":
        return "XGMI", 0
    if a // 2 == b // 2:
        return "PIX", 0
    return ("NODE" if numa_of(kind, a, gpus) == numa_of(kind, b, gpus) else "SYS"), 0


def _nic_kind(kind: NodeKind, gpu: int, nic: int, gpus: int) -> str:
    nic_gpu = nic * gpus // kind.nic_count  # the GPU whose PCIe switch the NIC shares (rail-optimised layout)
    if gpu == nic_gpu:
        return "PXB" if kind.fabric == "nvswitch" else "PIX"
    return "NODE" if numa_of(kind, gpu, gpus) == numa_of(kind, nic_gpu, gpus) else "SYS"


def nic_names(kind: NodeKind) -> list[str]:
    return [f"mlx5_{i}" for i in range(kind.nic_count)]


def node_topology(kind: NodeKind, cluster: str, node: str, uuids: list[str], ts_ns: int) -> NodeTopology:
    """The node's topology as ``nvidia-smi topo -m`` and the NICs' sysfs would describe it."""
    gpus = len(uuids)
    model = MODELS[kind.model]
    links = nvlink_links(kind, gpus)
    sockets = 1 if kind.fabric == "workstation" else 2
    cores = 16 if sockets == 1 else 64
    topo_gpus = tuple(
        TopologyGpu(
            uuid=uuid,
            index=i,
            model=model.name,
            pci_bus_id=pci_bus_id(kind, i),
            numa_node=numa_of(kind, i, gpus),
            cpu_affinity=_affinity(numa_of(kind, i, gpus), cores, sockets),
            nvlink_links=len(links[i]),
        )
        for i, uuid in enumerate(uuids)
    )
    pairs = []
    for a in range(gpus):
        for b in range(a + 1, gpus):
            path, count = _pair_kind(kind, a, b, gpus)
            pairs.append(TopologyLink(uuids[a], uuids[b], path, count))
    names = nic_names(kind)
    nics = tuple(
        TopologyNic(
            name=name,
            port=1,
            pci_bus_id=f"00000000:{0x0C + 0x10 * i:02X}:00.0",
            numa_node=numa_of(kind, i * gpus // kind.nic_count, gpus),
            link_layer=kind.nic_link_layer,
            rate_gbps=kind.nic_rate_gbps,
        )
        for i, name in enumerate(names)
    )
    for n, name in enumerate(names):
        for g in range(gpus):
            pairs.append(TopologyLink(uuids[g], name, _nic_kind(kind, g, n, gpus)))
    return NodeTopology(cluster, node, ts_ns, topo_gpus, tuple(pairs), nics, kind.nvswitches)


def _affinity(numa: int, cores: int, sockets: int) -> str:
    per = cores // sockets
    lo = numa * per
    # hyperthread siblings follow all physical cores, as Linux numbers them
    return f"{lo}-{lo + per - 1},{cores + lo}-{cores + lo + per - 1}"


#: the mix whose proportions the fleet's seed draws: node kinds and each kind's applications around the defaults
SEEDED: Final = "seeded"


def seeded_mix(seed: int) -> tuple[tuple[NodeKind, float], ...]:
    """Node kinds with weights drawn around the default mix, each kind's application weights drawn around its
    own (Dirichlet, concentration 4 times the default weights: every kind and application stays possible, the
    proportions change from seed to seed), so each evaluation seed judges another fleet."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
    kinds = MIXES["default"]
    weights = rng.dirichlet([4 * 10 * w for _, w in kinds])
    out = []
    for (name, _), weight in zip(kinds, weights, strict=True):
        kind = NODE_KINDS[name]
        apps = rng.dirichlet([4 * 10 * w for _, w in kind.apps])
        out.append(
            (replace(kind, apps=tuple((a, float(w)) for (a, _), w in zip(kind.apps, apps, strict=True))), float(weight))
        )
    return tuple(out)


def assign_kinds(nodes: int, gpus_per_node: int, mix: str, seed: int = 0) -> list[NodeKind]:
    """Node kinds in contiguous racks, in the mix's proportions (largest remainder, so small fleets are mixed);
    ``mix="seeded"`` draws the proportions from ``seed`` (:func:`seeded_mix`)."""
    if mix == SEEDED:
        drawn = seeded_mix(seed)
    elif mix in MIXES:
        drawn = tuple((NODE_KINDS[k], w) for k, w in MIXES[mix])
    else:
        raise ValueError(f"unknown fleet mix {mix!r}; known: {', '.join((*MIXES, SEEDED))}")
    entries = [(kind, w) for kind, w in drawn if kind_fits(kind, gpus_per_node)]
    total = sum(w for _, w in entries)
    exact = [nodes * w / total for _, w in entries]
    counts = [math.floor(x) for x in exact]
    for i in sorted(range(len(entries)), key=lambda i: counts[i] - exact[i])[: nodes - sum(counts)]:
        counts[i] += 1
    return [kind for (kind, _), count in zip(entries, counts, strict=True) for _ in range(count)]
