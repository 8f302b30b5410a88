"""A node-agent source whose rounds are scripted by the test (the real sources run on real captures in
tests/unit/producers/ and tests/unit/pipeline/test_registry.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.events import SampleBatch
from pipeline.topology import NodeTopology


class ScriptedSource:
    """Answers each round from a script: a list of batches, or an exception to raise; its topology for a round
    is the matching entry of ``topologies`` (the last one once the script runs out)."""

    name = "scripted"
    fields = frozenset({"power_watts"})

    def __init__(self, script: list[Any], topologies: list[NodeTopology | None] | None = None) -> None:
        self.script = script
        self.topologies_by_round = topologies or []
        self.rounds = 0

    def open(self) -> None:
        pass

    def collect(self, ts_ns: int) -> list[SampleBatch]:
        step = self.script[min(self.rounds, len(self.script) - 1)]
        self.rounds += 1
        if isinstance(step, Exception):
            raise step
        return [
            dataclasses.replace(b, samples=tuple(dataclasses.replace(s, ts_ns=ts_ns) for s in b.samples)) for b in step
        ]

    def topologies(self, ts_ns: int) -> list[NodeTopology]:
        """The topology of the last round read (of the first, before any)."""
        if not self.topologies_by_round:
            return []
        topology = self.topologies_by_round[min(max(self.rounds - 1, 0), len(self.topologies_by_round) - 1)]
        return [] if topology is None else [dataclasses.replace(topology, ts_ns=ts_ns)]

    def stats(self) -> dict[str, int]:
        return {"scripted_rounds": self.rounds}

    def close(self) -> None:
        pass
