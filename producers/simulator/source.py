"""The simulated fleet as a source (registered as ``simulator``), driven by the one agent loop like NVML.

Each round yields every node's :class:`SampleBatch` (every METRIC_FIELDS name, on the GPUs whose model has it),
the workload :class:`GpuContext` of every GPU on the first round and of each GPU whose job changes afterwards
(``workload=None`` when a GPU frees up, so the record keeps the time it did), and the :class:`FaultRecord` of each
fault when it starts, with its planned end; :meth:`SimulatorSource.topologies` gives every node's topology. The
agent publishes each to its topic, in real time or fast-forward (``NodeAgent.run(fast_forward_s=...)``: a
stretch of history ending now, as fast as Kafka takes it).

``withhold`` keeps chosen context records off the topic (an evaluation measures workload classification on those
GPUs); they are kept in :attr:`SimulatorSource.withheld` instead, as the truth to score against.
``samples_only`` yields node batches only (a load generator: no topology, context or ground truth).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.events import METRIC_NAMES, GpuContext
from pipeline.registry import with_options
from pipeline.topology import NodeTopology
from producers.simulator.fleet import Fleet
from producers.simulator.hardware import assign_kinds
from producers.simulator.plan import FaultPlan
from producers.source import Record, check_names

Withhold = Callable[[GpuContext], bool]
#: the fleet's models between them report every field (each GPU only those its model has)
FIELDS: Final = frozenset(METRIC_NAMES)


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """The ``simulator`` source's settings (``hermeneut simulate`` sets them from its options)."""

    cluster: str = "local"
    nodes: int = 16
    #: GPUs per node
    gpus: int = 8
    seed: int = 0
    #: fleet mix (node kinds), a key of producers.simulator.hardware.MIXES
    mix: str = "default"
    #: inject faults (their ground truth goes to its topic)
    faults: bool = False
    fault_rate_scale: float = 1.0
    fault_mix: str = "trace"
    #: per-link NVLink samples, processes, NIC ports
    extras: bool = True
    samples_only: bool = False


class SimulatorSource:
    """A simulated fleet: built from its config when opened, or around a given :class:`Fleet`."""

    name = "simulator"
    fields = FIELDS
    Config = SimulatorConfig

    def __init__(
        self, config: SimulatorConfig | None = None, *, fleet: Fleet | None = None, withhold: Withhold | None = None
    ) -> None:
        self.config = config or SimulatorConfig()
        self.fleet = fleet
        self.withhold = withhold
        #: context records kept off the topic by ``withhold``
        self.withheld: list[GpuContext] = []

    @classmethod
    def of(cls, fleet: Fleet, *, samples_only: bool = False, withhold: Withhold | None = None) -> SimulatorSource:
        """A source around an existing fleet (one with injected faults, say)."""
        config = SimulatorConfig(fleet.cluster, len(fleet.nodes), fleet.gpus_per_node, samples_only=samples_only)
        return cls(config, fleet=fleet, withhold=withhold)

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> SimulatorConfig:
        return with_options(SimulatorConfig(cluster=settings.cluster), options, "the simulator source")

    @classmethod
    def validate(cls, config: SimulatorConfig) -> None:
        """Sizes, mixes and fault settings a fleet can be built from; builds nothing."""
        check_names(cls.name, config.cluster)
        if config.nodes < 1 or not 1 <= config.gpus <= 64:
            raise ConfigError(
                f"invalid configuration: a fleet needs 1+ nodes of 1-64 GPUs, got {config.nodes} x {config.gpus}"
            )
        try:
            assign_kinds(config.nodes, config.gpus, config.mix)
            _plan(config)
        except ValueError as exc:
            raise ConfigError(f"invalid configuration: {exc}") from exc

    @classmethod
    def from_config(
        cls, config: SimulatorConfig, fleet: Fleet | None = None, withhold: Withhold | None = None
    ) -> SimulatorSource:
        return cls(config, fleet=fleet, withhold=withhold)

    def open(self) -> None:
        """Build the fleet (unless one was given)."""
        if self.fleet is None:
            c = self.config
            self.fleet = Fleet(
                c.nodes, c.gpus, cluster=c.cluster, seed=c.seed, faults=_plan(c), extras=c.extras, mix=c.mix
            )

    def _fleet(self) -> Fleet:
        if self.fleet is None:
            raise RuntimeError("simulator source used before open()")
        return self.fleet

    def collect(self, ts_ns: int) -> list[Record]:
        sim = self._fleet().round(ts_ns)
        records: list[Record] = list(sim.batches)
        if self.config.samples_only:
            return records
        for ctx in sim.contexts:
            if self.withhold is not None and self.withhold(ctx):
                self.withheld.append(ctx)
            else:
                records.append(ctx)
        records.extend(sim.ground_truth)
        return records

    def topologies(self, ts_ns: int) -> list[NodeTopology]:
        return [] if self.config.samples_only else self._fleet().topologies(ts_ns)

    def stats(self) -> dict[str, int]:
        return {"withheld_contexts": len(self.withheld)}

    def close(self) -> None:
        """Nothing held."""


def _plan(config: SimulatorConfig) -> FaultPlan | None:
    return FaultPlan(rate_scale=config.fault_rate_scale, mix=config.fault_mix) if config.faults else None
