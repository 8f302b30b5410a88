"""Top-N lists: hottest GPUs, most throttled, most wasted capacity, highest power, most XIDs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.events import APPLICATIONS
from pipeline.usage import gpu_hours
from sinks.influxdb.schema import GPU, GPU_EVENT
from sinks.query.model import (
    BENIGN_MASKS,
    NS,
    TOP_KINDS,
    Aggregate,
    AggRow,
    Expr,
    Filter,
    Fn,
    TagIn,
    TimeRange,
    TopQuery,
    ValueBelow,
    ValueNotIn,
    check_fn,
)
from sinks.query.output import Table, iso
from sinks.query.scope import gpu_filter, read_from, rollup_blocker, sample_intervals, scope_filters
from sinks.query.store import MINUTE_NS, Store, now_ns

IDENTITY: Final = ("cluster", "node", "gpu", "gpu_model")
#: an application tag other than "idle": a workload holds the GPU (docs/queries.md, wasted capacity)
ALLOCATED: Final = TagIn("application", tuple(a for a in APPLICATIONS if a != "idle"))
#: top lists read the raw samples up to this range and the 1-minute rollups beyond it where they can answer (not
#: from ``storage.rollup_after_days`` on, as other questions): ``top wasted`` over 22.8 h of 144 GPUs read raw took
#: InfluxDB past its 30 s read timeout, and a top list scans every sample of every GPU in the range
TOP_RAW_MAX_NS: Final = 3 * 3600 * NS


@dataclass(frozen=True, slots=True)
class TopRow:
    rank: int
    cluster: str
    node: str
    gpu: str
    gpu_model: str
    values: tuple[float | str | None, ...]


@dataclass(frozen=True, slots=True)
class TopResult:
    kind: str
    value_names: tuple[str, ...]
    range: TimeRange
    rows: tuple[TopRow, ...]
    backend: str
    source: str
    notes: tuple[str, ...] = ()

    def tables(self) -> list[Table]:
        rows = tuple((r.rank, r.cluster, r.node, r.gpu, r.gpu_model, *r.values) for r in self.rows)
        title = f"top {len(self.rows)}: {TOP_KINDS[self.kind]}, {iso(self.range.start_ns)} .. {iso(self.range.stop_ns)}"
        notes = (f"answered by {self.backend} from the {self.source} bucket", *self.notes)
        return [Table(title, ("rank", *IDENTITY, *self.value_names), rows, notes)]


def _ranked(rows: list[tuple[dict[str, str], tuple[float | str | None, ...]]], n: int) -> tuple[TopRow, ...]:
    """Highest first value first; ties by GPU id so the order is stable."""

    def key(item: tuple[dict[str, str], tuple[float | str | None, ...]]) -> tuple[float, str]:
        first = item[1][0]
        return (-(first if isinstance(first, float) else float("-inf")), item[0].get("gpu", ""))

    ordered = sorted(rows, key=key)[:n]
    return tuple(
        TopRow(i + 1, t.get("cluster", ""), t.get("node", ""), t.get("gpu", ""), t.get("gpu_model", ""), v)
        for i, (t, v) in enumerate(ordered)
    )


def _by_gpu(rows: list[AggRow]) -> dict[str, AggRow]:
    return {r.tag("gpu"): r for r in rows}


def top(store: Store, q: TopQuery, now: int | None = None) -> TopResult:
    """Run a top-N question (validated here)."""
    q.validate()
    now = now_ns() if now is None else now
    tr = q.time_range(now)
    fn = check_fn(q.fn)
    if q.kind in ("hot", "power"):
        fields = ("temperature_ratio_of_slowdown", "temperature_gpu_celsius")
        if q.kind == "power":
            fields = ("power_watts", "power_ratio_of_limit")
        return _fields_top(store, q, tr, now, fields, fn)
    if q.kind == "throttled":
        return _throttled(store, q, tr, now)
    if q.kind == "wasted":
        return _wasted(store, q, tr, now)
    return _xids(store, q, tr, now)


def _plan_on(
    store: Store, q: TopQuery, tr: TimeRange, now: int, exprs: tuple[Expr, ...], blocker: str | None
) -> tuple[Aggregate, str, list[str]]:
    source = store.source(tr, now, blocker, rollup_after_ns=TOP_RAW_MAX_NS)
    bucket, exprs, notes = read_from(store, source, exprs)
    return Aggregate(bucket, GPU, exprs, tr, scope_filters(q.scope), IDENTITY), source, notes


def _fields_top(store: Store, q: TopQuery, tr: TimeRange, now: int, fields: tuple[str, ...], fn: Fn) -> TopResult:
    exprs = tuple(Expr(f, fn) for f in fields)
    plan, source, notes = _plan_on(store, q, tr, now, exprs, rollup_blocker(fields[0], fn, None, q.scope.job))
    rows, backend = store.aggregate(plan, q.backend)
    ranked = _ranked([(dict(r.tags), r.values) for r in rows], q.n)
    return TopResult(q.kind, tuple(f"{fn}({f})" for f in fields), tr, ranked, backend, source, tuple(notes))


def _throttled(store: Store, q: TopQuery, tr: TimeRange, now: int) -> TopResult:
    """Share of samples whose clocks-event mask is not a benign one: two counts per GPU."""
    mask = "throttle_reasons_mask"
    blocker = "job ids are not kept in the rollups (per-job queries read raw data)" if q.scope.job else None
    source = store.source(tr, now, blocker, rollup_after_ns=TOP_RAW_MAX_NS)
    filters = scope_filters(q.scope)
    if source == "1m":
        plan = Aggregate(
            store.buckets.rollup,
            GPU,
            (Expr("throttled_samples", "sum"), Expr("throttle_samples", "sum")),
            tr,
            filters,
            IDENTITY,
        )
        rows, backend = store.aggregate(plan, q.backend)
        counts = {r.tag("gpu"): (dict(r.tags), r.values[0] or 0.0, r.values[1] or 0.0) for r in rows}
    else:
        every = Aggregate(store.buckets.raw, GPU, (Expr(mask, "count"),), tr, filters, IDENTITY)
        all_rows, backend = store.aggregate(every, q.backend)
        throttled, _ = store.aggregate(every.with_filters(ValueNotIn(BENIGN_MASKS)), q.backend)
        hits = {r.tag("gpu"): r.values[0] or 0.0 for r in throttled}
        counts = {r.tag("gpu"): (dict(r.tags), hits.get(r.tag("gpu"), 0.0), r.values[0] or 0.0) for r in all_rows}
    rows_out: list[tuple[dict[str, str], tuple[float | str | None, ...]]] = [
        (tags, (hit / total if total else None, total)) for tags, hit, total in counts.values()
    ]
    notes = ("throttled: a clocks-event reason other than idle, application clocks, sync boost, display clocks",)
    return TopResult(q.kind, ("throttled_share", "samples"), tr, _ranked(rows_out, q.n), backend, source, notes)


#: the field whose minutes top wasted counts (the rollups keep its peak per minute: `<field>_max`)
_UTIL: Final = "utilization_gpu_percent"


def _wasted(store: Store, q: TopQuery, tr: TimeRange, now: int) -> TopResult:
    """Allocated and wasted GPU-hours per GPU, counted as every GPU-hour is (pipeline.usage: each sample stands for
    its GPU's interval); a wasted sample is one of a minute whose peak utilization stayed under the threshold
    (right-sizing's idle minute). Short ranges (and a job's, whose id the rollups do not keep) window the raw
    samples per minute; long ones count the 1-minute rollups' points in InfluxDB, pushed down, and take a wasted
    minute to hold the GPU's mean samples per minute."""
    blocker = "job ids are not kept in the rollups (per-job queries read raw data)" if q.scope.job else None
    source = store.source(tr, now, blocker, rollup_after_ns=TOP_RAW_MAX_NS)
    base: tuple[Filter, ...] = (*scope_filters(q.scope), ALLOCATED)
    if source == "1m":
        minutes = Expr(f"{_UTIL}_max", "count")
        every = Aggregate(
            store.buckets.rollup,
            GPU,
            (Expr(f"{_UTIL}_count", "sum"), minutes, Expr("memory_used_ratio_mean", "mean")),
            tr,
            base,
            IDENTITY,
        )
        low_plan = Aggregate(store.buckets.rollup, GPU, (minutes,), tr, (*base, ValueBelow(q.threshold)), IDENTITY)
        all_rows, backend = store.aggregate(every, q.backend)
        low_rows, _ = store.aggregate(low_plan, q.backend)
        low_minutes = {g: r.values[0] or 0.0 for g, r in _by_gpu(low_rows).items()}
        held: dict[str, tuple[dict[str, str], float, float | None]] = {}
        low: dict[str, float] = {}
        for gpu, r in _by_gpu(all_rows).items():
            samples, count = r.values[0] or 0.0, r.values[1] or 0.0
            held[gpu] = (dict(r.tags), samples, r.values[2])
            low[gpu] = low_minutes.get(gpu, 0.0) * samples / count if count else 0.0
    else:
        window = Aggregate(
            store.buckets.raw,
            GPU,
            (Expr(_UTIL, "max"), Expr(_UTIL, "count"), Expr("memory_used_ratio", "mean")),
            tr.aligned(MINUTE_NS),
            base,
            IDENTITY,
            MINUTE_NS,
        )
        rows, backend = store.aggregate(window, q.backend)
        held, low = _samples_per_gpu(rows, q.threshold)
    # each sample stands for its own series' interval (gpu_info), the setting only for GPUs that never said
    intervals, default = sample_intervals(store, tr), store.policy.sample_interval_s
    out: list[tuple[dict[str, str], tuple[float | str | None, ...]]] = []
    for gpu, (tags, allocated, memory) in held.items():
        wasted = low.get(gpu, 0.0)
        if wasted:
            interval = intervals.get(gpu, default)
            share = wasted / allocated if allocated else None
            out.append((tags, (gpu_hours(wasted, interval), gpu_hours(allocated, interval), share, memory)))
    notes = (
        f"wasted: allocated (application tag other than idle) samples in minutes whose peak {_UTIL} < "
        f"{q.threshold:g}; one sample = its GPU's sampling interval ({_spread(intervals, default)}); docs/queries.md",
        *(
            (
                "from the 1-minute rollups: a wasted minute counted at its GPU's mean samples per minute; the last "
                "minute or two are not rolled up yet",
            )
            if source == "1m"
            else ()
        ),
    )
    names = ("wasted_gpu_hours", "allocated_gpu_hours", "wasted_share", "mean(memory_used_ratio)")
    return TopResult(q.kind, names, tr, _ranked(out, q.n), backend, "raw" if source != "1m" else source, notes)


def _samples_per_gpu(
    rows: list[AggRow], threshold: float
) -> tuple[dict[str, tuple[dict[str, str], float, float | None]], dict[str, float]]:
    """From per-GPU-minute rows (peak utilization, samples, mean memory ratio): per GPU its tags, its samples and
    the mean of its minutes' memory ratios; and per GPU the samples of minutes whose peak stayed under
    ``threshold``."""
    per: dict[str, tuple[dict[str, str], list[float], list[float], list[float]]] = {}
    for r in rows:
        peak, count, memory = r.values[0], r.values[1], r.values[2]
        if peak is None or not count:
            continue  # a window of the memory field alone: no utilization read, no sample counted
        _, peaks, counts, memories = per.setdefault(r.tag("gpu"), (dict(r.tags), [], [], []))
        peaks.append(float(peak))
        counts.append(float(count))
        if memory is not None:
            memories.append(float(memory))
    held = {g: (t, float(sum(c)), float(np.mean(m)) if m else None) for g, (t, _, c, m) in per.items()}
    low = {g: float(np.sum(np.asarray(c)[np.asarray(p) < threshold])) for g, (_, p, c, _) in per.items()}
    return held, low


def _spread(intervals: dict[str, float], default: float) -> str:
    """The sampling intervals in play, for a note: one value, or the range of them."""
    if not intervals:
        return f"{default:g} s, the default: no GPU stored its own"
    low, high = min(intervals.values()), max(intervals.values())
    return f"{low:g} s" if low == high else f"{low:g} to {high:g} s"


def _xids(store: Store, q: TopQuery, tr: TimeRange, now: int) -> TopResult:
    store.source(tr, now, "XID events are kept with the raw data only")
    filters = gpu_filter(store, q.scope, tr, GPU_EVENT)
    if filters is None:
        return TopResult(q.kind, ("xids", "codes"), tr, (), "-", "raw", ("no GPU of this scope in range",))
    plan = Aggregate(
        store.buckets.raw,
        GPU_EVENT,
        (Expr("dedup_key", "count"),),
        tr,
        (*filters, TagIn("kind", ("xid",))),
        ("cluster", "node", "gpu", "code"),
    )
    rows, backend = store.aggregate(plan, q.backend)
    per_gpu: dict[tuple[tuple[str, str], ...], dict[str, float]] = defaultdict(dict)
    for r in rows:
        ident = tuple((k, r.tag(k)) for k in ("cluster", "node", "gpu"))
        per_gpu[ident][r.tag("code")] = r.values[0] or 0.0
    out: list[tuple[dict[str, str], tuple[float | str | None, ...]]] = []
    for ident, codes in per_gpu.items():
        described = " ".join(f"{c}x{int(n)}" for c, n in sorted(codes.items(), key=lambda kv: (-kv[1], kv[0])))
        out.append((dict(ident), (sum(codes.values()), described)))
    return TopResult(q.kind, ("xids", "codes"), tr, _ranked(out, q.n), backend, "raw")
