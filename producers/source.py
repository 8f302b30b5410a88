"""What the node agent reads from: a :class:`Source` yields one node's round as SampleBatches, and its topology.

Sources: ``producers.nvml.NvmlSource`` (this node's GPUs through NVML, plus InfiniBand ports) and
``producers.dcgm_exporter.DcgmExporterSource`` (an existing dcgm-exporter's ``/metrics``). Errors a source
raises, and what the agent does with them:

    SourceUnavailable   transient: nothing could be read this round (exporter down, timeout); counted, retried
                        next round
    BadSourceData       the source answered with data that cannot be read (malformed exposition text); the
                        original bytes go to the dead-letter topic with the reason, counted
"""

from __future__ import annotations

from typing import Protocol

from pipeline.events import NodeTopology, SampleBatch


class Source(Protocol):
    """One node's telemetry, read once per round."""

    name: str

    def open(self) -> None:
        """Connect / initialise; raises HermeneutError (or the library's error) when the source cannot work."""

    def collect(self, ts_ns: int) -> list[SampleBatch]:
        """Everything read this round (one batch per node the source covers)."""

    def topology(self, ts_ns: int) -> NodeTopology | None:
        """The node's current topology, or None when the source cannot tell."""

    def stats(self) -> dict[str, int]:
        """The source's own counters, for the stats file."""

    def close(self) -> None: ...
