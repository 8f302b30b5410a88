"""What the node agent reads from: a :class:`Source` yields each round's records, and its nodes' topology.

Sources are plugins registered by name in :mod:`pipeline.registry` (``nvml``: this node's GPUs through NVML, plus
InfiniBand ports; ``dcgm-exporter``: an existing dcgm-exporter's ``/metrics``; ``simulator``: a simulated fleet)
and all run through the one loop of :class:`producers.agent.NodeAgent`. A round's records:

    SampleBatch     one node's samples, events and NIC readings        -> raw topic
    GpuContext      a GPU's workload changed (the simulator knows it)  -> context topic
    FaultRecord     an injected fault started (simulator ground truth) -> ground-truth topic

Errors a source raises, and what the agent does with them:

    SourceUnavailable   transient: nothing could be read this round (exporter down, timeout); counted, retried
                        next round
    BadSourceData       the source answered with data that cannot be read (malformed exposition text); the
                        original bytes go to the dead-letter topic with the reason, counted
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from pipeline.errors import ConfigError, SourceUnavailable
from pipeline.events import FaultRecord, GpuContext, SampleBatch
from pipeline.topology import NodeTopology

#: what one round of a source may hold
Record = SampleBatch | GpuContext | FaultRecord
#: how long a sample stands for: the agent stamps its interval on live samples, importers the one they detect
INTERVAL_FIELD: Final = "sample_interval_seconds"


class Source(Protocol):
    """One or more nodes' telemetry, read once per round. Building one connects to nothing; :meth:`open` does."""

    name: str
    #: the METRIC_FIELDS names its samples may carry (a GPU that lacks one leaves it out)
    fields: frozenset[str]

    def open(self) -> None:
        """Connect / initialise; raises HermeneutError (or the library's error) when the source cannot work."""

    def collect(self, ts_ns: int) -> Sequence[Record]:
        """Everything read this round, stamped ``ts_ns``: one SampleBatch per node the source covers, and the
        context and ground-truth records of the round where the source knows them."""

    def topologies(self, ts_ns: int) -> Sequence[NodeTopology]:
        """The current topology of each node it covers (empty when it cannot tell)."""

    def stats(self) -> dict[str, int]:
        """The source's own counters, for the stats file."""

    def close(self) -> None:
        """Release what :meth:`open` took; safe to call twice."""


def check_names(source: str, cluster: str, node: str = "") -> None:
    """A source's cluster and node (empty: this host's name) as they go into Kafka keys (``cluster/node``):
    1 to 253 characters, no ``/``; a ConfigError with one line otherwise."""
    for what, value in (("cluster", cluster), ("node", node)):
        if (what == "cluster" or value) and (not 0 < len(value) <= 253 or "/" in value):
            raise ConfigError(
                f"invalid configuration: {source} source: {what} {value!r} must be 1-253 characters, no /"
            )


#: runs a command on the node with a timeout and returns its standard output (injectable for tests)
Runner = Callable[[Sequence[str], float], str]


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """Run a command a source reads the node with (squeue, scontrol, amd-smi); any failure is transient
    (:class:`SourceUnavailable`: slurmctld busy or restarting, a driver tool that failed this round)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceUnavailable(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no message"])[0]
        raise SourceUnavailable(f"{' '.join(argv[:3])} exited {done.returncode}: {first}")
    return done.stdout
