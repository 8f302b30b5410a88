"""A node's interconnect as a :class:`NodeTopology`: which GPUs talk over NVLink (and over how many links), the
PCIe path between every GPU pair and between GPUs and NICs, each GPU's NUMA node and CPU affinity, the NICs.

Emits one ``NodeTopology`` per call (the agent publishes it at start and whenever it changes). Link kinds use
``nvidia-smi topo -m``'s vocabulary: ``NV<n>`` for n NVLinks, direct or through NVSwitches (n = the smaller of
the two GPUs' switch links, as an HGX board shows ``NV18``), else the PCIe level of NVML's common ancestor
(``PIX`` one switch, ``PXB`` several, ``PHB`` host bridge, ``NODE`` host bridges of one NUMA node, ``SYS``
across NUMA nodes). GPU-to-NIC paths, which NVML does not know, are classified from the PCI device paths in
sysfs the same way (an approximation: a PCIe switch shows up as bridges in sysfs, and two devices behind the
same switch are ``PIX``). NUMA node and CPU list come from sysfs (``numa_node``, ``local_cpulist``), or NVML
when sysfs has nothing. A MIG instance is listed with its ``parent_uuid`` and no links of its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink, TopologyNic
from producers.infiniband import InfinibandReader
from producers.nvml.collector import Device

log = logging.getLogger(__name__)

#: NVML_TOPOLOGY_* level -> nvidia-smi topo's name (INTERNAL: two GPUs on one board, behind its own switch)
PCIE_LEVELS: Final[dict[int, str]] = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_SWITCH: Final = 0x02  # NVML_NVLINK_DEVICE_TYPE_SWITCH


def cpulist(masks: Sequence[int]) -> str:
    """NVML's CPU affinity (64-bit words, CPU 0 = bit 0 of word 0) as a Linux cpulist: ``0-31,64-95``."""
    cpus = [w * 64 + b for w, word in enumerate(masks) for b in range(64) if word >> b & 1]
    ranges: list[str] = []
    start = prev = None
    for cpu in [*cpus, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(ranges)


def _ancestors(device_path: Path) -> list[str]:
    """Host bridge and PCI bridges above a device, from its /sys/devices path."""
    parts = device_path.parts
    start = next((i for i, p in enumerate(parts) if p.startswith("pci")), None)
    return [] if start is None else list(parts[start:-1])


def pcie_path_kind(a: Path, b: Path, numa_a: int | None, numa_b: int | None) -> str:
    """The PCIe relation of two devices from their sysfs paths (see the module docstring)."""
    up_a, up_b = _ancestors(a), _ancestors(b)
    common = 0
    for x, y in zip(up_a, up_b, strict=False):
        if x != y:
            break
        common += 1
    if common == 0:
        return "NODE" if numa_a is not None and numa_a == numa_b else "SYS"
    if common == 1:
        return "PHB"
    return "PIX" if max(len(up_a), len(up_b)) - common <= 1 else "PXB"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class TopologyReader:
    """Builds the node's topology from NVML (injected), the collector's devices and sysfs."""

    def __init__(self, nvml: Any, sysfs_root: Path = Path("/sys"), ib: InfinibandReader | None = None) -> None:
        self._nvml = nvml
        self._sysfs = sysfs_root
        self._ib = ib

    def _pci_path(self, bus_id: str) -> Path | None:
        link = self._sysfs / "bus" / "pci" / "devices" / bus_id
        return Path(os.path.realpath(link)) if link.exists() else None

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _numa(self, device: Device) -> int | None:
        text = _read(self._sysfs / "bus" / "pci" / "devices" / device.pci_bus_id / "numa_node")
        if text is not None and text.lstrip("-").isdigit():
            return int(text) if int(text) >= 0 else None
        numa = self._call(self._nvml.nvmlDeviceGetNumaNodeId, device.handle)
        return numa if isinstance(numa, int) and numa >= 0 else None

    def _cpus(self, device: Device) -> str | None:
        text = _read(self._sysfs / "bus" / "pci" / "devices" / device.pci_bus_id / "local_cpulist")
        if text:
            return text
        words = ((os.cpu_count() or 64) + 63) // 64
        masks = self._call(self._nvml.nvmlDeviceGetCpuAffinity, device.handle, words)
        if masks is None:
            return None
        return cpulist([int(m) for m in masks]) or None

    def read(self, devices: Sequence[Device], cluster: str, node: str, ts_ns: int) -> NodeTopology:
        gpus = [d for d in devices if not d.is_mig and not d.lost]
        by_bus = {d.pci_bus_id: d for d in gpus}
        numa = {d.uuid: self._numa(d) for d in gpus}
        entries = [
            TopologyGpu(d.uuid, d.index, d.model, d.pci_bus_id, numa[d.uuid], self._cpus(d), len(d.links)) for d in gpus
        ]
        parents = {d.uuid: d for d in gpus}
        for mig in (d for d in devices if d.is_mig and not d.lost):
            parent = parents.get(mig.parent_uuid or "")
            entries.append(
                TopologyGpu(
                    mig.uuid,
                    mig.index,
                    mig.model,
                    mig.pci_bus_id,
                    numa.get(mig.parent_uuid or ""),
                    None if parent is None else self._cpus(parent),
                    0,
                    mig.parent_uuid,
                )
            )
        switch_links = {d.uuid: self._switch_links(d, by_bus) for d in gpus}
        switches = {bus for d in gpus for link, bus in d.remote_bus.items() if self._is_switch(d, link, by_bus)}
        links = [self._gpu_pair(a, b, switch_links, numa) for i, a in enumerate(gpus) for b in gpus[i + 1 :]]
        nics = self._ib.topology() if self._ib else ()
        links += self._nic_links(gpus, nics, numa)
        driver = self._call(self._nvml.nvmlSystemGetDriverVersion)
        return NodeTopology(
            cluster,
            node,
            ts_ns,
            tuple(entries),
            tuple(x for x in links if x is not None),
            nics,
            len(switches),
            driver.decode() if isinstance(driver, bytes) else str(driver or ""),
        )

    @staticmethod
    def _is_switch(device: Device, link: int, by_bus: dict[str, Device]) -> bool:
        kind = device.remote_type.get(link)
        if kind is not None:
            return kind == _SWITCH
        return device.remote_bus.get(link) not in by_bus  # no type: whatever is not one of our GPUs

    def _switch_links(self, device: Device, by_bus: dict[str, Device]) -> int:
        return sum(self._is_switch(device, link, by_bus) for link in device.links)

    def _gpu_pair(
        self, a: Device, b: Device, switch_links: dict[str, int], numa: dict[str, int | None]
    ) -> TopologyLink | None:
        direct = sum(1 for link in a.links if a.remote_bus.get(link) == b.pci_bus_id)
        if direct:
            return TopologyLink(a.uuid, b.uuid, f"NV{direct}", direct)
        through = min(switch_links[a.uuid], switch_links[b.uuid])
        if through:
            return TopologyLink(a.uuid, b.uuid, f"NV{through}", through)
        level = self._call(self._nvml.nvmlDeviceGetTopologyCommonAncestor, a.handle, b.handle)
        if isinstance(level, int) and level in PCIE_LEVELS:
            return TopologyLink(a.uuid, b.uuid, PCIE_LEVELS[level])
        path_a, path_b = self._pci_path(a.pci_bus_id), self._pci_path(b.pci_bus_id)
        if path_a is None or path_b is None:
            return None
        return TopologyLink(a.uuid, b.uuid, pcie_path_kind(path_a, path_b, numa[a.uuid], numa[b.uuid]))

    def _nic_links(
        self, gpus: Sequence[Device], nics: Sequence[TopologyNic], numa: dict[str, int | None]
    ) -> list[TopologyLink | None]:
        if self._ib is None:
            return []
        out: list[TopologyLink | None] = []
        seen = set()
        for nic in nics:
            if nic.name in seen:
                continue
            seen.add(nic.name)
            nic_path = self._ib.device_path(nic.name)
            for gpu in gpus:
                gpu_path = self._pci_path(gpu.pci_bus_id)
                if nic_path is None or gpu_path is None:
                    continue
                out.append(
                    TopologyLink(gpu.uuid, nic.name, pcie_path_kind(gpu_path, nic_path, numa[gpu.uuid], nic.numa_node))
                )
        return out
