"""The dashboard's topology graph: switches inferred from PIX paths, edges sized by traffic, and the PCIe-fallback
flag raised only where NVLink should carry a multi-GPU job's traffic but PCIe does."""

from __future__ import annotations

from hermeneut.web.topology import GpuTraffic, build_graph, falls_back_to_pcie
from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink, TopologyNic


def _hgx(nvswitches: int = 4) -> NodeTopology:
    gpus = tuple(TopologyGpu(f"GPU-{i}", i, "H100", f"0000:{i:02x}:00.0", i // 4, None, 18) for i in range(8))
    links = [TopologyLink(f"GPU-{a}", f"GPU-{b}", "NV18", 18) for a in range(8) for b in range(a + 1, 8)]
    # two GPUs and one NIC per PCIe switch
    links += [TopologyLink(f"GPU-{2 * s}", f"GPU-{2 * s + 1}", "PIX") for s in range(4)]
    links += [TopologyLink(f"GPU-{2 * s}", f"mlx5_{s}", "PIX") for s in range(4)]
    nics = tuple(TopologyNic(f"mlx5_{s}", 1, None, s // 2, "InfiniBand", 400) for s in range(4))
    return NodeTopology("c", "n", 1, gpus, tuple(links), nics, nvswitches)


def _busy(**kw: object) -> GpuTraffic:
    base = {"nvlink_bytes_per_second": 80e9, "pcie_bytes_per_second": 2e9, "nvlink_links_active": 18.0,
            "nvlink_links_max": 18.0, "job_gpus": 16, "verdict": "normal"}  # fmt: skip
    return GpuTraffic(**(base | kw))  # type: ignore[arg-type]


def test_pcie_switches_are_inferred_from_pix_paths() -> None:
    graph = build_graph(_hgx(), {})
    switches = [n for n in graph.nodes if n.kind == "pcie-switch"]
    assert len(switches) == 4
    members = {e.a for e in graph.edges if e.b == switches[0].id}
    assert members == {"GPU-0", "GPU-1", "mlx5_0"}
    nic = next(n for n in graph.nodes if n.id == "mlx5_0")
    assert (nic.label, nic.detail) == ("mlx5_0", "400 Gb/s InfiniBand")
    assert {n.id for n in graph.nodes if n.kind == "cpu"} == {"cpu0", "cpu1"}


def test_a_link_down_gpu_whose_traffic_moved_to_pcie_is_flagged() -> None:
    gpus = {f"GPU-{i}": _busy() for i in range(8)}
    gpus["GPU-3"] = _busy(nvlink_links_active=0.0, nvlink_bytes_per_second=0.0, pcie_bytes_per_second=24e9)
    graph = build_graph(_hgx(), gpus)
    assert graph.fallback_gpus == ["GPU-3"]
    edges = {(e.kind, e.a): e for e in graph.edges}
    assert edges[("nvlink", "GPU-3")].state == "down"
    assert edges[("pcie", "GPU-3")].state == "fallback"
    assert edges[("pcie", "GPU-3")].bytes_per_second == 24e9
    assert edges[("nvlink", "GPU-2")].state == "up" and edges[("pcie", "GPU-2")].state == "up"
    assert "pcie-fallback" in next(n for n in graph.nodes if n.id == "GPU-3").flags


def test_idle_or_single_gpu_work_is_not_a_fallback() -> None:
    assert not falls_back_to_pcie(_busy(nvlink_bytes_per_second=0.0, pcie_bytes_per_second=0.0), True)
    # a single-GPU job has no peer traffic for NVLink to carry, however busy its PCIe
    assert not falls_back_to_pcie(_busy(nvlink_bytes_per_second=0.0, pcie_bytes_per_second=20e9, job_gpus=1), True)
    # a card without NVLink cannot fall back from it
    assert not falls_back_to_pcie(_busy(nvlink_bytes_per_second=0.0, pcie_bytes_per_second=20e9), False)
    assert falls_back_to_pcie(_busy(nvlink_bytes_per_second=1e6, pcie_bytes_per_second=20e9), True)
    assert falls_back_to_pcie(_busy(nvlink_finding=True), True)


def test_without_nvswitch_nvlinks_are_drawn_pairwise() -> None:
    gpus = (
        TopologyGpu("GPU-a", 0, "A100", "0000:01:00.0", 0, None, 12),
        TopologyGpu("GPU-b", 1, "A100", "0000:02:00.0", 0, None, 12),
    )
    topo = NodeTopology("c", "n", 1, gpus, (TopologyLink("GPU-a", "GPU-b", "NV12", 12),))
    graph = build_graph(
        topo, {"GPU-a": _busy(nvlink_bytes_per_second=5e9), "GPU-b": _busy(nvlink_bytes_per_second=7e9)}
    )
    (nvlink,) = [e for e in graph.edges if e.kind == "nvlink"]
    assert (nvlink.a, nvlink.b, nvlink.label, nvlink.bytes_per_second) == ("GPU-a", "GPU-b", "NV12", 5e9)
    assert not any(n.kind == "nvswitch" for n in graph.nodes)
    # no PIX path between them: each GPU hangs off its own root port
    assert sum(1 for n in graph.nodes if n.kind == "pcie-switch") == 2
