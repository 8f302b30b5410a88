"""Right-sizing advice, wired: the query layer's usage statistics (``sinks.query.usage``) and measured link
throughput into the pure advice of ``processors.rightsize``. One function for the CLI (``hermeneut rightsize``)
and the dashboard, so both give the same answer. Face-level wiring: it imports the stages only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.config import Settings

if TYPE_CHECKING:
    from processors.rightsize import Recommendation


def advise(
    settings: Settings,
    range_: str | None = "7d",
    job: str | None = None,
    application: str | None = None,
    cluster: str | None = None,
    headroom: float = 0.2,
    exchange_bytes: float | None = None,
    start: str | None = None,
    stop: str | None = None,
) -> list[Recommendation]:
    """Advice per job (or per application across its runs) from what it actually used over ``range_`` back from
    ``stop`` (default now), or from ``start`` to ``stop`` (RFC 3339)."""
    return advise_and_gaps(settings, range_, job, application, cluster, headroom, exchange_bytes, start, stop)[0]


def advise_and_gaps(
    settings: Settings,
    range_: str | None = "7d",
    job: str | None = None,
    application: str | None = None,
    cluster: str | None = None,
    headroom: float = 0.2,
    exchange_bytes: float | None = None,
    start: str | None = None,
    stop: str | None = None,
) -> tuple[list[Recommendation], dict[str, int]]:
    """:func:`advise`, and the jobs (or applications) that could not be sized for want of memory readings, with
    their GPU-minutes."""
    from processors.rightsize import LATENCY_S, Link, recommend
    from sinks.query.usage import UsageQuery, link_throughput, usage_and_gaps

    query = UsageQuery(range_, job, application, cluster, start, stop)
    stats, gaps = usage_and_gaps(settings, query)
    measured: dict[str, Link] = {}
    for t in link_throughput(settings, UsageQuery(range_, None, None, cluster, start, stop)):
        if t.nvlink_bytes_per_second:
            measured[t.gpu_model] = Link("nvlink", t.nvlink_bytes_per_second, LATENCY_S["nvlink"], "measured")
        elif t.pcie_bytes_per_second:
            measured[t.gpu_model] = Link("pcie", t.pcie_bytes_per_second, LATENCY_S["pcie"], "measured")
    return [recommend(s, headroom=headroom, exchange_bytes=exchange_bytes, measured=measured) for s in stats], gaps
