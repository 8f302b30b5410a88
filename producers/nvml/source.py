"""The NVML node source (registered as ``nvml``): the collector, NVML events, topology and InfiniBand ports of
this node, per round.

Emits one :class:`SampleBatch` per round (every GPU and MIG instance, the GPU events since the last round, every
InfiniBand/RoCE port) with :data:`FIELDS`, and, on request, the node's :class:`NodeTopology`. A MIG
reconfiguration event makes it re-read the MIG layout, which changes the topology the agent publishes next.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pipeline.config import CollectorSettings, Settings
from pipeline.events import METRIC_NAMES, EventKind, GpuEvent, SampleBatch
from pipeline.registry import from_section, section_config, section_default
from pipeline.topology import NodeTopology
from producers.infiniband import InfinibandReader
from producers.nvml.aer import AerReader
from producers.nvml.collector import Costly, NvmlCollector
from producers.nvml.events import EventWatcher
from producers.nvml.topology import TopologyReader
from producers.source import check_names

#: every field but DCGM's profiling activity ratios (DCP), which NVML does not expose
FIELDS: Final = frozenset(METRIC_NAMES) - {"sm_active_percent", "tensor_active_percent", "dram_active_percent"}


@dataclass(frozen=True, slots=True)
class NvmlConfig:
    """The ``nvml`` source's settings (defaults: this node as ``hermeneut collect`` sees it; those of the
    ``collector`` section are declared there, with their bounds)."""

    cluster: str = from_section(Settings, "cluster")
    #: the node name samples carry; empty: this host's name
    node: str = ""
    sysfs_root: Path = from_section(CollectorSettings, "sysfs_root")
    pcie_throughput_fallback: bool = from_section(CollectorSettings, "pcie_throughput_fallback")
    infiniband: bool = True
    costly_read_us: float = from_section(CollectorSettings, "costly_read_us")
    #: rounds between reads of a costly reading (``collector.costly_read_interval_s`` in rounds; 1: every round)
    costly_every: int = max(
        1,
        round(
            section_default(CollectorSettings, "costly_read_interval_s")
            / section_default(Settings, "sample_interval_s")
        ),
    )


class NvmlSource:
    """This node's GPUs through NVML (``nvml``: the ``pynvml`` module, or a fake in tests)."""

    name = "nvml"
    fields = FIELDS
    Config = NvmlConfig

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> NvmlConfig:
        c = settings.collector
        every = max(1, round(c.costly_read_interval_s / settings.sample_interval_s))  # as the default's
        given = {"cluster": settings.cluster, "node": c.node or "", "costly_every": every}
        given |= {k: v for k, v in options.items() if v is not None}
        return section_config(NvmlConfig, c, "the nvml source", **given)

    @classmethod
    def validate(cls, config: NvmlConfig) -> None:
        """Names that fit a Kafka key (``cluster/node``); nothing is opened."""
        check_names("nvml", config.cluster, config.node)

    @classmethod
    def from_config(cls, config: NvmlConfig, nvml: Any = None) -> NvmlSource:
        """Built, not opened (``nvml``: default the ``pynvml`` module, loaded here without initialising it)."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        return cls(
            nvml,
            config.cluster,
            config.node or socket.gethostname(),
            sysfs_root=config.sysfs_root,
            pcie_throughput_fallback=config.pcie_throughput_fallback,
            infiniband=config.infiniband,
            costly=Costly(config.costly_read_us, config.costly_every) if config.costly_every > 1 else None,
        )

    def __init__(
        self,
        nvml: Any,
        cluster: str,
        node: str,
        *,
        sysfs_root: Path = Path("/sys"),
        pcie_throughput_fallback: bool = True,
        infiniband: bool = True,
        costly: Costly | None = None,
    ) -> None:
        self.cluster, self.node = cluster, node
        self.collector = NvmlCollector(
            nvml,
            cluster,
            node,
            pcie_throughput_fallback=pcie_throughput_fallback,
            aer=AerReader(sysfs_root),
            costly=costly,
        )
        self.events = EventWatcher(nvml, cluster, node)
        self.ib = InfinibandReader(sysfs_root) if infiniband else None
        self._topology = TopologyReader(nvml, sysfs_root, self.ib)
        self._lost: set[str] = set()

    def open(self) -> None:
        self.collector.open()
        self.events.open(self.collector.devices)

    def collect(self, ts_ns: int) -> list[SampleBatch]:
        nvml_events = self.events.drain(ts_ns)
        if any(e.kind is EventKind.MIG_CONFIG for e in nvml_events):
            self.collector.refresh_mig()  # before reading: the old MIG handles are gone
        samples, lost = self.collector.collect(ts_ns)
        events: list[GpuEvent] = []
        for event in [*nvml_events, *lost]:
            if event.kind is EventKind.GPU_LOST:
                if event.gpu_uuid in self._lost:
                    continue  # NVML's unavailable event and our GPU_IS_LOST say the same thing once
                self._lost.add(event.gpu_uuid)
            events.append(event)
        nics = self.ib.read(self.cluster, self.node, ts_ns) if self.ib else ()
        return [SampleBatch(self.cluster, self.node, tuple(samples), tuple(events), nics)]

    def topologies(self, ts_ns: int) -> list[NodeTopology]:
        return [self._topology.read(self.collector.devices, self.cluster, self.node, ts_ns)]

    def stats(self) -> dict[str, int]:
        c, e = self.collector.stats, self.events.stats
        return {
            "nvml_errors": c.nvml_errors,
            "unsupported_readings": c.unsupported,
            "lost_gpus": c.lost_gpus,
            "empty_samples": c.empty_samples,
            "costly_readings": c.costly_readings,
            "nvml_events": e.events,
            "events_coalesced": e.coalesced,
            "events_unknown_device": e.unknown_device,
        }

    def close(self) -> None:
        self.events.close()
        self.collector.close()
