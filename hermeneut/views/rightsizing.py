"""Right-sizing advice, wired: the query layer's usage statistics (``sinks.query.usage``), the fleet's measured link
throughput, and the link timings the probe put on the topology topic, into the pure advice of
``processors.rightsize``. One function for the CLI (``hermeneut rightsize``) and the dashboard, so both give the
same answer. Face-level wiring: it imports the stages only when called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from pipeline.catalogue import PUBLISHED_LINKS, ModelDims, link_kind_of
from pipeline.config import Settings
from pipeline.errors import HermeneutError
from pipeline.topology import NodeTopology

if TYPE_CHECKING:
    from processors.rightsize import Link, Recommendation

log = logging.getLogger(__name__)


def advise(
    settings: Settings,
    range_: str | None = "7d",
    job: str | None = None,
    application: str | None = None,
    cluster: str | None = None,
    headroom: float = 0.2,
    start: str | None = None,
    stop: str | None = None,
    model: ModelDims | None = None,
    tokens: int = 512,
    training: bool | None = None,
    links: Mapping[str, Link] | None = None,
) -> list[Recommendation]:
    """Advice per job (or per application across its runs) from what it actually used over ``range_`` back from
    ``stop`` (default now), or from ``start`` to ``stop`` (RFC 3339)."""
    return advise_and_gaps(
        settings, range_, job, application, cluster, headroom, start, stop, model, tokens, training, links
    )[0]


def advise_and_gaps(
    settings: Settings,
    range_: str | None = "7d",
    job: str | None = None,
    application: str | None = None,
    cluster: str | None = None,
    headroom: float = 0.2,
    start: str | None = None,
    stop: str | None = None,
    model: ModelDims | None = None,
    tokens: int = 512,
    training: bool | None = None,
    links: Mapping[str, Link] | Callable[[], Mapping[str, Link]] | None = None,
) -> tuple[list[Recommendation], dict[str, int]]:
    """:func:`advise`, and the jobs (or applications) that could not be sized for want of memory readings, with
    their GPU-minutes. ``links``: a link per kind the fleet has (:func:`fleet_links`), or a function that reads
    them, called only when there is a job to advise; default: the published figures of every kind."""
    from processors.rightsize import Link, recommend
    from sinks.query.usage import UsageQuery, link_throughput, usage_and_gaps

    query = UsageQuery(range_, job, application, cluster, start, stop)
    stats, gaps = usage_and_gaps(settings, query)
    if callable(links):
        links = links() if stats else None
    measured: dict[str, Link] = {}
    for t in link_throughput(settings, UsageQuery(range_, None, None, cluster, start, stop)):
        kind, rate = (
            ("nvlink", t.nvlink_bytes_per_second) if t.nvlink_bytes_per_second else ("pcie", t.pcie_bytes_per_second)
        )
        if rate:
            f = PUBLISHED_LINKS[kind]
            measured[t.gpu_model] = Link(
                kind, rate, f.latency_s, f"throughput seen on the fleet; {f.source}", f.overhead_s
            )
    advice = [
        recommend(s, headroom=headroom, model=model, tokens=tokens, training=training, links=links, measured=measured)
        for s in stats
    ]
    return advice, gaps


def links_of(topologies: Iterable[NodeTopology]) -> tuple[dict[str, Link], str]:
    """A link per kind the fleet's GPUs are joined by (their topologies' GPU-to-GPU paths and the probe's timings),
    each the probe's measurement where it has one, else the published figures; and a line saying which. No
    topology at all: every published kind."""
    from processors.rightsize import fleet_links, measured_links, published_link

    nodes = list(topologies)
    gpus = {g.uuid for t in nodes for g in t.gpus}
    kinds = {link_kind_of(link.kind) for t in nodes for link in t.links if link.a in gpus and link.b in gpus}
    timings = [x for t in nodes for x in t.link_timings]
    measured = measured_links(timings)
    kinds |= set(measured)
    if not kinds:
        return {k: published_link(f) for k, f in PUBLISHED_LINKS.items()}, (
            "no GPU-to-GPU links in the fleet's topologies: every published link kind"
        )
    found = fleet_links(kinds, measured)
    probed = sorted(k for k in found if k in measured)
    return found, (
        f"link kinds on the fleet: {', '.join(sorted(found))}; measured by the probe: {', '.join(probed) or 'none'}"
        " (the rest: published figures)"
    )


def fleet_links(settings: Settings) -> tuple[dict[str, Link], str]:
    """:func:`links_of` the topology topic (the collector's topologies and the probe's timings); where Kafka cannot
    be read, every published kind, and the line says why."""
    from hermeneut.views.health import node_topologies
    from pipeline import services
    from processors.rightsize import published_link

    try:
        return links_of(node_topologies(services.resolve(settings, True, False)))
    except HermeneutError as exc:
        log.info("topology topic not read (%s): published link figures", exc)
        return {k: published_link(f) for k, f in PUBLISHED_LINKS.items()}, (
            f"topology topic not read ({exc}): every published link kind"
        )


def answer_lines(advice: Recommendation) -> list[str]:
    """The three questions, one line each (and a line per link kind and parallelism for the third): what the CLI
    prints under a job and the dashboard shows beside its recommendation."""
    q = advice.answers
    if q is None:
        return []
    splits = ", ".join(f"{k} x {name}" for name, k in q.splits) or q.cost_note
    lines = [f"1. smallest that holds it: {q.smallest} ({q.smallest_detail})", f"2. split over smaller GPUs: {splits}"]
    if not q.costs:
        return [*lines, f"3. time per added GPU{f' ({q.priced})' if q.priced else ''}: {q.cost_note}"]
    lines.append(f"3. time per added GPU ({q.priced}; {q.cost_note}):")
    for c in q.costs:
        lines.append(
            f"   {c.link.kind:11} {c.parallelism:8} +{c.per_added_gpu_s * 1e3:.3f} ms per added GPU, "
            f"+{c.total_s * 1e3:.3f} ms in all = {c.terms()}"
        )
    return lines
