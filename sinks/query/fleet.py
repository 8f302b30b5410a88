"""What the health view reads from InfluxDB: which GPUs the fleet has and when each last reported (the membership
the firing findings are folded over: a GPU with nothing firing is healthy only while it reports; pipeline.health),
the finding episodes of the past (the history escalation and correlation read; pipeline.escalation), and when
someone was told of each alert (the reliability figures' time to tell; pipeline.reliability)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pipeline.escalation import Episode
from pipeline.health.fold import FiringFinding
from sinks.influxdb.schema import FINDING, GPU, NOTIFICATION
from sinks.query.flux import string, time_literal
from sinks.query.store import Store

#: a field every stored GPU sample has (the verdict is written for each row, scored or not)
_ALWAYS: str = "verdict"


def _per_gpu(
    store: Store, start_ns: int, stop_ns: int, cluster: str | None, selector: str
) -> dict[tuple[str, str, str], tuple[str, list[int]]]:
    """Per GPU that reported in ``[start, stop)``: its model and the times ``selector`` (``first()``, ``last()``)
    picks, one per series (a GPU has one series per application it ran), which InfluxDB answers from one block of
    each (no scan of the range)."""
    where = f" and r.cluster == {string(cluster)}" if cluster else ""
    flux = (
        f"from(bucket: {string(store.buckets.raw)}) "
        f"|> range(start: {time_literal(start_ns)}, stop: {time_literal(stop_ns)}) "
        f'|> filter(fn: (r) => r._measurement == {string(GPU)} and r._field == "{_ALWAYS}"{where}) '
        f"|> {selector}"
    )
    out: dict[tuple[str, str, str], tuple[str, list[int]]] = {}
    for r in store.flux_records(flux):
        key = (str(r.get("cluster", "")), str(r.get("node", "")), str(r.get("gpu", "")))
        out.setdefault(key, (str(r.get("gpu_model", "")), []))[1].append(_ns(r["_time"]))
    return out


def last_reports(
    store: Store, start_ns: int, stop_ns: int, cluster: str | None = None
) -> list[tuple[str, str, str, int]]:
    """(cluster, node, GPU, time of its last sample) for every GPU that reported in ``[start, stop)``."""
    return [
        (*key, max(times)) for key, (_m, times) in sorted(_per_gpu(store, start_ns, stop_ns, cluster, "last()").items())
    ]


_EPISODE_FIELDS = ("active", "since_ns", "job_id", "ev_xid", "ev_last_xid", "maintenance")


def finding_episodes(store: Store, start_ns: int, stop_ns: int, cluster: str | None = None) -> list[Episode]:
    """The finding points stored in ``[start, stop)`` as episodes, oldest first, one per point: its start (which
    identifies the episode), job, the XIDs its evidence named and whether it was active (a resolved finding's last
    point is not). :class:`pipeline.escalation.History` merges the points of one episode."""
    where = f" and r.cluster == {string(cluster)}" if cluster else ""
    fields = " or ".join(f"r._field == {string(f)}" for f in _EPISODE_FIELDS)
    flux = (
        f"from(bucket: {string(store.buckets.raw)}) "
        f"|> range(start: {time_literal(start_ns)}, stop: {time_literal(stop_ns)}) "
        f"|> filter(fn: (r) => r._measurement == {string(FINDING)}{where} and ({fields})) "
        '|> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value") '
        '|> group() |> sort(columns: ["_time"])'
    )
    out = []
    for r in store.flux_records(flux):
        since, gpu, job = r.get("since_ns"), r.get("gpu", "-"), r.get("job_id")
        if since is not None:
            xids = frozenset(int(x) for x in (r.get("ev_xid"), r.get("ev_last_xid")) if x is not None and x == x)  # noqa: PLR0124
            out.append(
                Episode(
                    str(r.get("cluster", "")),
                    str(r.get("node", "")),
                    None if gpu == "-" else str(gpu),
                    str(r.get("detector", "")),
                    str(r.get("severity", "info")),
                    int(since),
                    str(job) if job else None,
                    xids,
                    bool(r.get("active")),
                    _ns(r["_time"]),
                    bool(r.get("maintenance")),
                )
            )
    return out


_OPEN_FIELDS = ("active", "summary", "since_ns", "maintenance", "ev_xid", "ev_last_xid")
#: the tags a finding point carries that a firing alert's labels name too
_LABELS = ("cluster", "node", "gpu", "detector", "severity", "application")


def open_findings(
    store: Store, start_ns: int, stop_ns: int, back_ns: int, stale_ns: int, cluster: str | None = None
) -> list[FiringFinding]:
    """The findings open at some moment of ``[start, stop]`` (``start == stop``: at that instant), from the stored
    finding points of ``[start - back, stop]``, as the health fold takes firing alerts: an episode (its cluster,
    node, GPU, kind and start) is open if its last point before ``start`` was active or it has an active point in
    the range. Silence is no clear: an episode whose last point is older than ``stale_ns`` at ``stop`` stays open,
    marked stale since that point, as the alert manager keeps its alert; one cleared inside the range says when."""
    where = f" and r.cluster == {string(cluster)}" if cluster else ""
    fields = " or ".join(f"r._field == {string(f)}" for f in _OPEN_FIELDS)
    flux = (
        f"from(bucket: {string(store.buckets.raw)}) "
        f"|> range(start: {time_literal(start_ns - back_ns)}, stop: {time_literal(stop_ns + 1)}) "
        f"|> filter(fn: (r) => r._measurement == {string(FINDING)}{where} and ({fields})) "
        '|> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value") '
        '|> group() |> sort(columns: ["_time"])'
    )
    return findings_open(store.flux_records(flux), start_ns, stop_ns, stale_ns)


def findings_open(records: Iterable[dict[str, Any]], start_ns: int, stop_ns: int, stale_ns: int) -> list[FiringFinding]:
    """:func:`open_findings` over finding points (pivoted records, oldest first; those after ``stop`` are not
    read): pure."""
    episodes: dict[tuple[str, ...], tuple[dict[str, Any], bool, int]] = {}
    for r in records:
        if r.get("since_ns") is None:
            continue
        t, active = _ns(r["_time"]), bool(r.get("active"))
        if t > stop_ns:
            break
        key = (*(str(r.get(k, "")) for k in ("cluster", "node", "gpu", "detector")), str(int(r["since_ns"])))
        seen = episodes.get(key)
        # open at some moment of the range: open coming into it (its last point before was active), or active in it
        was = seen[1] if seen is not None and (seen[2] >= start_ns or t >= start_ns) else False
        episodes[key] = (r, was or active, t)
    out = []
    for r, active_inside, last_ns in episodes.values():
        last_active = bool(r.get("active"))
        if not (last_active or active_inside):
            continue
        labels = {k: str(r[k]) for k in _LABELS if r.get(k) not in (None, "", "-")}
        if r.get("maintenance"):
            labels["maintenance"] = str(r["maintenance"])
        summary = str(r.get("summary", ""))
        if not last_active:
            summary += f" (cleared at {time_literal(last_ns)})"
        named = (("xid", r.get("ev_xid")), ("last_xid", r.get("ev_last_xid")))
        evidence = {k: float(v) for k, v in named if v is not None}
        stale = last_ns if last_active and stop_ns - last_ns > stale_ns else 0
        out.append(FiringFinding(labels, summary, int(r["since_ns"]), evidence, stale))
    return out


def gpu_spans(
    store: Store, start_ns: int, stop_ns: int, cluster: str | None = None
) -> list[tuple[str, str, str, str, int, int]]:
    """(cluster, node, GPU, GPU model, first sample, last sample) for every GPU that reported in ``[start, stop)``."""
    first = _per_gpu(store, start_ns, stop_ns, cluster, "first()")
    last = _per_gpu(store, start_ns, stop_ns, cluster, "last()")
    return [
        (*key, model, min(times), max(last.get(key, ("", times))[1])) for key, (model, times) in sorted(first.items())
    ]


def first_told(store: Store, start_ns: int, stop_ns: int, cluster: str | None = None) -> dict[str, list[int]]:
    """When someone was told an alert fired (a ``firing`` notification a receiver accepted, from the notification
    history) in ``[start, stop)``: dedup key -> the times, oldest first (pipeline.reliability's time to tell)."""
    where = f" and r.cluster == {string(cluster)}" if cluster else ""
    flux = (
        f"from(bucket: {string(store.buckets.raw)}) "
        f"|> range(start: {time_literal(start_ns)}, stop: {time_literal(stop_ns)}) "
        f'|> filter(fn: (r) => r._measurement == {string(NOTIFICATION)} and r._field == "dedup_key" '
        f'and r.status == "firing" and r.outcome == "delivered"{where}) '
        '|> keep(columns: ["_time", "_value"]) |> group() |> sort(columns: ["_time"])'
    )
    out: dict[str, list[int]] = {}
    for r in store.flux_records(flux):
        out.setdefault(str(r["_value"]), []).append(_ns(r["_time"]))
    return out


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * 10**9 + t.microsecond * 1000
