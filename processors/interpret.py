"""The interpretation chain: what the processor does to a validated, normalized batch before it forwards it.

Each stage takes an :class:`InterpretedBatch` and returns it with more filled in (workload, phase, score,
verdict, drivers, explanation) plus the :class:`Finding` s it reached. Stages keep their own state (windows,
learned baselines, mirrors of context topics; per GPU in arrays of the one slot table they share,
processors.state) and are driven in order, so a later stage sees what an earlier one concluded: enrichment ->
scoring -> detectors. What an earlier stage derived for the later ones travels on the batch (the feature matrix,
computed once by enrichment). ``tick`` runs on a timer, for conclusions that come from time passing rather than
from data (a GPU that stopped reporting, a condition that has cleared).

Stages work on whole batches with numpy; none may loop over samples in Python where a vector works.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from pipeline.events import Finding, InterpretedBatch
from pipeline.topology import NodeTopology

TopologyOf = Callable[[str, str], NodeTopology | None]


class Stage(Protocol):
    """One step of interpretation (see module docstring)."""

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]: ...

    def tick(self, now_ns: int) -> list[Finding]: ...


class Interpreter:
    """The stages in order; with none, batches pass through as normalized (verdict ``unscored``). ``topology_of``
    gives a node's topology: every finding carries the driver version its node runs, its rack and its switch (alert
    labels, factors fleet incidents name)."""

    def __init__(self, stages: Sequence[Stage] = (), topology_of: TopologyOf | None = None) -> None:
        self.stages = list(stages)
        self.topology_of = topology_of

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        findings: list[Finding] = []
        for stage in self.stages:
            batch, found = stage.apply(batch, now_ns)
            findings.extend(found)
        return batch, self._node_facts(findings)

    def tick(self, now_ns: int) -> list[Finding]:
        return self._node_facts([f for stage in self.stages for f in stage.tick(now_ns)])

    def _node_facts(self, findings: list[Finding]) -> list[Finding]:
        if self.topology_of is None:
            return findings
        return [_with_node_facts(f, self.topology_of(f.cluster, f.node)) for f in findings]


def _with_node_facts(f: Finding, topo: NodeTopology | None) -> Finding:
    """The finding with what its node's topology says of the node: its driver, rack and switch, and whether its
    scheduler holds it out of service (a finding in a maintenance window is kept, never paged)."""
    if topo is None or not (topo.driver_version or topo.rack or topo.switch or topo.maintenance):
        return f
    return replace(
        f, driver_version=topo.driver_version, rack=topo.rack, switch=topo.switch, maintenance=topo.maintenance
    )
