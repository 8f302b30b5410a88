"""Node topology from NVML (fake, real captures' devices) and a sysfs tree built like the kernel's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pynvml

from pipeline.codec import decode_record, encode_record
from pipeline.topology import NodeTopology
from producers.infiniband import InfinibandReader
from producers.nvml import NvmlCollector
from producers.nvml.capture import CapturedGpu, CapturedLink, CapturedMig
from producers.nvml.replay import ReplayNvml
from producers.nvml.topology import TopologyReader, cpulist, pcie_path_kind
from tests.fakes.nvml import load_capture
from tests.fakes.sysfs import ib_port, pci_device

T0 = 1_700_000_000_000_000_000


def test_cpulist() -> None:
    assert cpulist([0xFFFFFFFF, 0, 0xF]) == "0-31,128-131"
    assert cpulist([0b1011]) == "0-1,3"
    assert cpulist([0]) == ""


def test_pcie_path_kinds() -> None:
    root = Path("/sys/devices")
    switch = root / "pci0000:17/0000:17:00.0/0000:18:00.0"
    gpu = switch / "0000:19:00.0/0000:1a:00.0"
    nic_same_switch = switch / "0000:19:04.0/0000:1b:00.0"
    gpu_behind_two_switches = switch / "0000:19:08.0/0000:20:00.0/0000:21:00.0/0000:22:00.0"
    other_root_port = root / "pci0000:17/0000:17:02.0/0000:23:00.0"
    other_bridge = root / "pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    assert pcie_path_kind(gpu, nic_same_switch, 0, 0) == "PIX"
    assert pcie_path_kind(gpu, gpu_behind_two_switches, 0, 0) == "PXB"
    assert pcie_path_kind(gpu, other_root_port, 0, 0) == "PHB"
    assert pcie_path_kind(gpu, other_bridge, 0, 0) == "NODE"
    assert pcie_path_kind(gpu, other_bridge, 0, 1) == "SYS"
    assert pcie_path_kind(gpu, other_bridge, None, None) == "SYS"


def _copies(name: str, count: int, buses: list[str]) -> list[CapturedGpu]:
    """``count`` GPUs answering like the capture's first GPU, each with its own uuid and PCI address."""
    base = load_capture(name)[0]
    return [
        dataclasses.replace(
            base, uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", pci_bus_id=bus, values=dict(base.values)
        )
        for i, bus in zip(range(count), buses, strict=True)
    ]


def _read(fake: ReplayNvml, sysfs: Path, ib: bool = False) -> NodeTopology:
    collector = NvmlCollector(fake, "dc1", "n1")
    collector.open()
    reader = TopologyReader(fake, sysfs, InfinibandReader(sysfs) if ib else None)
    return reader.read(collector.devices, "dc1", "n1", T0)


def test_pcie_levels_from_nvml_numa_and_cpus_from_sysfs_nics_by_pci_path(tmp_path: Path) -> None:
    chain = ["pci0000:17", "0000:17:00.0", "0000:18:00.0"]
    pci_device(tmp_path, [*chain, "0000:19:00.0", "0000:1a:00.0"], 0, "0-31,64-95")
    pci_device(tmp_path, [*chain, "0000:19:08.0", "0000:20:00.0", "0000:21:00.0", "0000:22:00.0"], 0, "0-31,64-95")
    pci_device(tmp_path, ["pci0000:9a", "0000:9a:00.0", "0000:9b:00.0"], 1, "32-63,96-127")
    nic = pci_device(tmp_path, [*chain, "0000:19:04.0", "0000:1b:00.0"], 0, "0-31,64-95")
    ib_port(tmp_path, "mlx5_0", nic)
    gpus = _copies("rtx-3080-v13.xml", 3, ["00000000:1A:00.0", "00000000:22:00.0", "00000000:9B:00.0"])
    fake = ReplayNvml(
        gpus,
        topology={(0, 1): pynvml.NVML_TOPOLOGY_MULTIPLE, (0, 2): pynvml.NVML_TOPOLOGY_SYSTEM},
    )
    topology = _read(fake, tmp_path, ib=True)
    assert [(g.pci_bus_id, g.numa_node, g.cpu_affinity) for g in topology.gpus] == [
        ("0000:1a:00.0", 0, "0-31,64-95"),
        ("0000:22:00.0", 0, "0-31,64-95"),
        ("0000:9b:00.0", 1, "32-63,96-127"),
    ]
    u = [g.uuid for g in topology.gpus]
    links = {(link.a, link.b): link.kind for link in topology.links}
    assert links[(u[0], u[1])] == "PXB"  # NVML's level
    assert links[(u[0], u[2])] == "SYS"
    assert links[(u[1], u[2])] == "SYS"  # NVML did not say: from the sysfs paths and NUMA nodes
    assert links[(u[0], "mlx5_0")] == "PIX" and links[(u[1], "mlx5_0")] == "PXB"
    assert links[(u[2], "mlx5_0")] == "SYS"
    assert topology.nics[0].numa_node == 0
    assert decode_record(NodeTopology, encode_record(topology)) == topology


def test_direct_nvlinks_between_a_pair(tmp_path: Path) -> None:
    gpus = load_capture("dual_2080-v13.xml")
    gpus[0].links = [CapturedLink(gpus[1].pci_bus_id), CapturedLink(gpus[1].pci_bus_id)]
    gpus[1].links = [CapturedLink(gpus[0].pci_bus_id), CapturedLink(gpus[0].pci_bus_id)]
    topology = _read(ReplayNvml(gpus), tmp_path)
    assert [(link.kind, link.nvlinks) for link in topology.links] == [("NV2", 2)]
    assert [g.nvlink_links for g in topology.gpus] == [2, 2]
    assert topology.nvswitches == 0


def test_nvswitch_board_shows_nv18_and_counts_the_switches(tmp_path: Path) -> None:
    buses = [f"00000000:{b:02X}:00.0" for b in (0x18, 0x2A, 0x3A, 0x5D)]
    gpus = _copies("a10g.xml", 4, buses)  # an HGX-like board described here: 18 links per GPU over 4 switches
    switches = [f"00000000:{b:02X}:00.0" for b in (0x05, 0x06, 0x07, 0x08)]
    for gpu in gpus:
        gpu.links = [
            CapturedLink(switches[link % 4], remote_type=pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH) for link in range(18)
        ]
    topology = _read(ReplayNvml(gpus), tmp_path)
    assert len(topology.links) == 6
    assert {(link.kind, link.nvlinks) for link in topology.links} == {("NV18", 18)}
    assert topology.nvswitches == 4


def test_mig_instances_are_listed_with_their_parent(tmp_path: Path) -> None:
    base = load_capture("a10g.xml")[0]
    parent = CapturedGpu(
        "NVIDIA A100-SXM4-40GB", "GPU-0c1f3a2e-aaaa-bbbb-cccc-000000000001", "00000000:07:00.0",
        base.values | {"mig.current": 1},
        migs=[CapturedMig("MIG-11111111-2222-3333-4444-555555555555", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 1, 0,
                      20 * 2**30, 0)],
    )  # fmt: skip
    topology = _read(ReplayNvml([parent]), tmp_path)
    assert [(g.uuid, g.parent_uuid) for g in topology.gpus] == [
        (parent.uuid, None),
        ("MIG-11111111-2222-3333-4444-555555555555", parent.uuid),
    ]
    assert topology.links == ()
