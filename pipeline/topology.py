"""A node's interconnect as its collector reports it (the topology topic): its GPUs and NICs, every pairwise path in
nvidia-smi topo's vocabulary, measured copy timings, and the facts its GPUs share (driver, rack, switch, whether
the scheduler holds it out of service)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.events import node_key


@dataclass(frozen=True, slots=True)
class TopologyGpu:
    """A GPU (or MIG instance, with ``parent_uuid``) in a node's topology."""

    uuid: str
    index: int
    model: str
    pci_bus_id: str
    numa_node: int | None = None
    cpu_affinity: str | None = None
    nvlink_links: int = 0
    parent_uuid: str | None = None


@dataclass(frozen=True, slots=True)
class TopologyLink:
    """How two endpoints (GPU uuids or NIC names) are connected.

    ``kind`` is nvidia-smi topo's vocabulary: ``NV<n>`` (n NVLinks, direct or through NVSwitch), ``PIX`` (one
    PCIe switch), ``PXB`` (several PCIe switches), ``PHB`` (a PCIe host bridge), ``NODE`` (host bridges of one
    NUMA node), ``SYS`` (across NUMA nodes, over the CPU interconnect); ``XGMI`` is AMD's Infinity Fabric
    between two Instinct GPUs (simulated nodes; priced as the slowest posted link, having no published figures).
    """

    a: str
    b: str
    kind: str
    nvlinks: int = 0


@dataclass(frozen=True, slots=True)
class TopologyNic:
    """A NIC port of the node (InfiniBand/RoCE): where it sits and how fast it is."""

    name: str
    port: int = 1
    pci_bus_id: str | None = None
    numa_node: int | None = None
    link_layer: str = "InfiniBand"
    rate_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class LinkTiming:
    """A measured path between two GPUs (``a``, ``b``: uuids; the same for host-staged copies on one GPU or the
    host): how long a synchronised copy takes, fitted over sizes (``producers.linkprobe``). ``path``: ``d2d`` (peer
    copy), ``d2h2d`` (through host memory, as a framework hands a tensor on without peer access) or ``host`` (a
    host-staged copy); ``kind``: the link kind it travels (``nvlink``, ``pcie``, ``sys``, ``pcie-staged``)."""

    a: str
    b: str
    path: str
    kind: str
    bytes_per_second: float
    latency_s: float
    #: the cost of issuing and synchronising a copy of nothing: the per-hand-off overhead
    overhead_s: float
    sizes: int = 0
    source: str = ""


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """A node's interconnect: GPUs, NICs and every pairwise path. Published when a producer starts or it changes."""

    cluster: str
    node: str
    ts_ns: int
    gpus: tuple[TopologyGpu, ...]
    links: tuple[TopologyLink, ...] = ()
    nics: tuple[TopologyNic, ...] = ()
    nvswitches: int = 0
    #: the NVIDIA driver the node runs ("": not known): a factor its GPUs share (pipeline.health's incidents)
    driver_version: str = ""
    #: where the node sits, as its operator names it ("": not known): its rack (power, cooling) and the leaf switch
    #: its NICs hang off; factors its GPUs share with the rack's or the switch's other nodes
    rack: str = ""
    switch: str = ""
    #: why the node's scheduler holds it out of service on purpose ("": in service): a Slurm drain, maintenance
    #: reservation or reboot, a Kubernetes cordon (producers.context.nodestate). A maintenance window is not a fault
    maintenance: str = ""
    #: measured GPU-to-GPU copy timings (``hermeneut probe links``): the link figures right-sizing prices a split with
    link_timings: tuple[LinkTiming, ...] = ()

    @property
    def kafka_key(self) -> bytes:
        return node_key(self.cluster, self.node)
