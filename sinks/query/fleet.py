"""Which GPUs the fleet has, and when each last reported: the membership the health view folds the firing findings
over (a GPU with nothing firing is healthy only while it reports; pipeline.health)."""

from __future__ import annotations

from sinks.query.flux import string, time_literal
from sinks.query.model import GPU
from sinks.query.store import Store

#: a field every stored GPU sample has (the verdict is written for each row, scored or not)
_ALWAYS: str = "verdict"


def last_reports(
    store: Store, start_ns: int, stop_ns: int, cluster: str | None = None
) -> list[tuple[str, str, str, int]]:
    """(cluster, node, GPU, time of its last sample) for every GPU that reported in ``[start, stop)``: one
    ``last()`` per series, which InfluxDB answers from the newest block of each (no scan of the range)."""
    where = f" and r.cluster == {string(cluster)}" if cluster else ""
    flux = (
        f"from(bucket: {string(store.buckets.raw)}) "
        f"|> range(start: {time_literal(start_ns)}, stop: {time_literal(stop_ns)}) "
        f'|> filter(fn: (r) => r._measurement == {string(GPU)} and r._field == "{_ALWAYS}"{where}) '
        "|> last()"
    )
    newest: dict[tuple[str, str, str], int] = {}
    for r in store.flux_records(flux):
        key = (str(r.get("cluster", "")), str(r.get("node", "")), str(r.get("gpu", "")))
        t = r["_time"]
        ns = int(t.timestamp()) * 10**9 + t.microsecond * 1000
        newest[key] = max(newest.get(key, 0), ns)
    return [(*key, ns) for key, ns in sorted(newest.items())]
