"""Query layer: how many samples the raw bucket holds per GPU over a range (what an import checks its counts
against: every row read is stored or dead-lettered)."""

from __future__ import annotations

from sinks.influxdb.schema import GPU
from sinks.query.model import Aggregate, Expr, TagIn, TimeRange
from sinks.query.store import Store


def stored_samples(store: Store, cluster: str, start_ns: int, stop_ns: int) -> dict[tuple[str, str], int]:
    """Per (node, GPU uuid), the ``gpu`` points of ``cluster`` in ``[start_ns, stop_ns)``: one per stored sample
    (``verdict`` is written with every one), across the GPU's application series."""
    in_range, of_cluster = TimeRange(start_ns, stop_ns), (TagIn("cluster", (cluster,)),)
    plan = Aggregate(store.buckets.raw, GPU, (Expr("verdict", "count"),), in_range, of_cluster, ("node", "gpu"))
    rows, _ = store.aggregate(plan)
    return {(r.tag("node"), r.tag("gpu")): int(r.values[0] or 0) for r in rows}
