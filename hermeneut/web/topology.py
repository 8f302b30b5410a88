"""A node's interconnect as a graph for the dashboard: GPUs, NVSwitch, PCIe switches, CPUs (NUMA nodes) and NICs,
with every edge sized by the traffic it carries now and flagged when data takes the wrong path.

Pure: it takes the node's :class:`NodeTopology` (from the topology topic) and the latest reading of each GPU and NIC,
and returns plain nodes and edges the browser draws. The flag the operator cares about: a GPU whose NVLink should
carry its peer traffic (the topology says it has NVLinks to its job's peers) but whose NVLink is down or idle while
its PCIe link is busy; its NVLink edge is drawn as down and its PCIe edge as ``fallback``.

PCIe switches are not in NVML's topology; they are inferred from the pairwise paths: GPUs (and NICs) whose path is
``PIX`` or ``PXB`` (one or several PCIe bridges, never the host bridge) share a switch; the switch hangs off the
CPU of their NUMA node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.topology import NodeTopology

#: NVLink traffic below this (bytes/s) counts as idle; PCIe traffic above it counts as busy
IDLE_BYTES_PER_SECOND = 50e6
BUSY_BYTES_PER_SECOND = 1e9


@dataclass(frozen=True, slots=True)
class GpuTraffic:
    """What the graph needs from a GPU's latest reading (None where the GPU does not report it)."""

    nvlink_bytes_per_second: float | None = None
    pcie_bytes_per_second: float | None = None
    nvlink_links_active: float | None = None
    nvlink_links_max: float | None = None
    #: how many GPUs the job on this GPU spans (peer traffic is only expected in a multi-GPU job)
    job_gpus: int | None = None
    verdict: str = "unscored"
    nvlink_finding: bool = False


@dataclass
class GraphNode:
    id: str
    kind: str  # gpu | nvswitch | pcie-switch | cpu | nic
    label: str
    numa: int | None = None
    verdict: str | None = None
    flags: list[str] = field(default_factory=list)
    detail: str = ""


@dataclass
class GraphEdge:
    a: str
    b: str
    kind: str  # nvlink | pcie | cpu-link | nic
    bytes_per_second: float | None = None
    state: str = "up"  # up | idle | down | fallback
    label: str = ""


@dataclass
class Graph:
    nodes: list[GraphNode]
    edges: list[GraphEdge]
    #: GPUs whose peer traffic goes over PCIe although NVLink should carry it
    fallback_gpus: list[str]


def _nvlink_state(t: GpuTraffic | None) -> str:
    if t is None:
        return "up"
    if t.nvlink_finding:
        return "down"
    if t.nvlink_links_max and t.nvlink_links_active is not None and t.nvlink_links_active < t.nvlink_links_max:
        return "down"
    if t.nvlink_bytes_per_second is not None and t.nvlink_bytes_per_second < IDLE_BYTES_PER_SECOND:
        return "idle"
    return "up"


def falls_back_to_pcie(t: GpuTraffic | None, has_nvlink: bool) -> bool:
    """NVLink should carry this GPU's peer traffic, but it is down/idle while PCIe is busy in a multi-GPU job."""
    if t is None or not has_nvlink:
        return False
    nvlink = _nvlink_state(t)
    pcie_busy = (t.pcie_bytes_per_second or 0.0) >= BUSY_BYTES_PER_SECOND
    multi = (t.job_gpus or 1) > 1
    return t.nvlink_finding or (nvlink in ("down", "idle") and pcie_busy and multi)


def _switch_groups(topo: NodeTopology, members: list[str]) -> list[list[str]]:
    """Endpoints joined by PIX/PXB paths share a PCIe switch (union-find over those pairs)."""
    parent = {m: m for m in members}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in topo.links:
        if link.kind in ("PIX", "PXB") and link.a in parent and link.b in parent:
            parent[root(link.a)] = root(link.b)
    groups: dict[str, list[str]] = {}
    for m in members:
        groups.setdefault(root(m), []).append(m)
    return sorted(groups.values(), key=sorted)


def build_graph(topo: NodeTopology, gpus: dict[str, GpuTraffic], nics: dict[str, float] | None = None) -> Graph:
    """The node's graph; ``gpus`` maps uuid -> latest traffic, ``nics`` maps NIC name -> bytes/s (rx + tx)."""
    nics = nics or {}
    nodes: list[GraphNode] = []
    edges: list[GraphEdge] = []
    fallback: list[str] = []
    numa_of: dict[str, int] = {}
    for g in topo.gpus:
        numa_of[g.uuid] = g.numa_node if g.numa_node is not None else 0
    for n in topo.nics:
        numa_of[n.name] = n.numa_node if n.numa_node is not None else 0
    for numa in sorted(set(numa_of.values()) or {0}):
        nodes.append(GraphNode(f"cpu{numa}", "cpu", f"CPU / NUMA {numa}", numa))
    for a, b in zip(sorted(set(numa_of.values())), sorted(set(numa_of.values()))[1:], strict=False):
        edges.append(GraphEdge(f"cpu{a}", f"cpu{b}", "cpu-link", label="SYS"))

    has_nvlink = {g.uuid: g.nvlink_links > 0 for g in topo.gpus}
    for g in topo.gpus:
        t = gpus.get(g.uuid)
        node = GraphNode(g.uuid, "gpu", f"GPU {g.index}", numa_of[g.uuid], t.verdict if t else None)
        if falls_back_to_pcie(t, has_nvlink[g.uuid]):
            node.flags.append("pcie-fallback")
            fallback.append(g.uuid)
        nodes.append(node)
    for n in topo.nics:
        speed = f"{n.rate_gbps:g} Gb/s " if n.rate_gbps else ""
        nodes.append(GraphNode(n.name, "nic", n.name, numa_of[n.name], detail=f"{speed}{n.link_layer}"))

    # NVLink: through NVSwitch when the node has them, else direct GPU-GPU links
    if topo.nvswitches:
        nodes.append(GraphNode("nvswitch", "nvswitch", f"NVSwitch x{topo.nvswitches}"))
        for g in topo.gpus:
            if g.nvlink_links:
                t = gpus.get(g.uuid)
                state = _nvlink_state(t)
                edges.append(
                    GraphEdge(
                        g.uuid,
                        "nvswitch",
                        "nvlink",
                        t.nvlink_bytes_per_second if t else None,
                        state,
                        f"NV{g.nvlink_links}",
                    )
                )
    else:
        for link in topo.links:
            if link.kind.startswith("NV") and link.a in has_nvlink and link.b in has_nvlink:
                ta, tb = gpus.get(link.a), gpus.get(link.b)
                states = {_nvlink_state(ta), _nvlink_state(tb)}
                state = "down" if "down" in states else ("idle" if "idle" in states else "up")
                rates = [t.nvlink_bytes_per_second for t in (ta, tb) if t and t.nvlink_bytes_per_second is not None]
                edges.append(GraphEdge(link.a, link.b, "nvlink", min(rates) if rates else None, state, link.kind))

    # PCIe: endpoints -> their switch -> their CPU
    members = [g.uuid for g in topo.gpus] + [n.name for n in topo.nics]
    for i, group in enumerate(_switch_groups(topo, members)):
        switch = f"pcie{i}"
        numa = numa_of[group[0]]
        nodes.append(GraphNode(switch, "pcie-switch", "PCIe switch" if len(group) > 1 else "PCIe root port", numa))
        total = 0.0
        for member in group:
            if member in has_nvlink:
                t = gpus.get(member)
                rate = t.pcie_bytes_per_second if t else None
                state = "fallback" if member in fallback else ("idle" if (rate or 0) < IDLE_BYTES_PER_SECOND else "up")
                edges.append(GraphEdge(member, switch, "pcie", rate, state))
            else:
                rate = nics.get(member)
                edges.append(GraphEdge(member, switch, "nic", rate, "up" if rate else "idle"))
            total += rate or 0.0
        edges.append(GraphEdge(switch, f"cpu{numa}", "pcie", total, "up" if total else "idle"))
    return Graph(nodes, edges, fallback)
