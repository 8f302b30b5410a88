"""Building blocks the questions share: scope filters, a job's extent, the GPUs of a scope, baseline bands,
and the mapping of a raw aggregate onto the 1-minute rollups."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipeline.errors import InvalidQuery
from sinks.influxdb.schema import BASELINE, FINDING, GPU, GPU_INFO, ROLLUP_FIELDS, TAGS
from sinks.query.model import NS, Aggregate, Expr, FieldEquals, Filter, Fn, Scope, TagIn, TimeRange, auto_window
from sinks.query.store import MINUTE_NS, Store

#: more GPUs than this in a job's extent and the tag filter would cost more than it saves
MAX_GPU_FILTER: Final = 256


def scope_filters(scope: Scope, measurement: str = GPU) -> tuple[Filter, ...]:
    """The scope as filters on ``measurement``; raises when it lacks a tag the scope needs (see
    :func:`gpu_filter` for measurements without ``gpu_model`` / ``application``)."""
    out: list[Filter] = []
    for key, value in scope.tags:
        if key not in TAGS[measurement]:
            raise InvalidQuery(f"{measurement} points have no {key} tag")
        out.append(TagIn(key, (value,)))
    if scope.job is not None:
        out.append(FieldEquals("job_id", scope.job))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class JobExtent:
    """Where and when a job ran within a range: ``[start_ns, stop_ns)`` to within ``window_ns``, its GPUs and
    the (application, gpu_model) pairs it ran as."""

    job: str
    start_ns: int
    stop_ns: int
    window_ns: int
    gpus: tuple[str, ...]
    kinds: tuple[tuple[str, str], ...]

    def narrowed(self, filters: tuple[Filter, ...]) -> tuple[TimeRange, tuple[Filter, ...]]:
        """The job's own time span, and its GPUs as a tag filter (cheap to test before the job-id field)."""
        if len(self.gpus) <= MAX_GPU_FILTER:
            filters = (TagIn("gpu", self.gpus), *filters)
        return TimeRange(self.start_ns, self.stop_ns), filters


def job_extent(store: Store, job: str, tr: TimeRange) -> JobExtent | None:
    """The span and GPUs of ``job`` within ``tr`` (None: no sample of it there), from one count of the
    ``job_id`` field per GPU in about 100 windows: the span is a superset to within one window, which is all
    narrowing needs (the job-id condition still applies to every point read afterwards)."""
    window = auto_window(tr.length_ns, 100)
    plan = Aggregate(
        store.buckets.raw,
        GPU,
        (Expr("job_id", "count"),),
        tr.aligned(window),
        (FieldEquals("job_id", job),),
        ("gpu", "application", "gpu_model"),
        window,
    )
    rows, _ = store.aggregate(plan)
    if not rows:
        return None
    return JobExtent(
        job,
        max(tr.start_ns, min(r.time_ns for r in rows)),
        min(tr.stop_ns, max(r.time_ns for r in rows) + window),
        window,
        tuple(sorted({r.tag("gpu") for r in rows})),
        tuple(sorted({(r.tag("application"), r.tag("gpu_model")) for r in rows})),
    )


#: how far before a range its GPUs' intervals are looked up: ``gpu_info`` is written on change and every 10
#: minutes of a GPU's data, so a day covers a GPU that reported at all
_INTERVAL_LOOKBACK_NS: Final = 86400 * NS


def sample_intervals(store: Store, tr: TimeRange) -> dict[str, float]:
    """Per GPU, how long one sample stands for (``sample_interval_seconds``, the last stored in ``gpu_info`` up
    to the range's end: the collector's interval live, the one an import detected per series); GPUs that never
    stored one are missing, and the reader falls back to the ``sample_interval_s`` default."""
    looked = TimeRange(tr.start_ns - _INTERVAL_LOOKBACK_NS, tr.stop_ns)
    plan = Aggregate(store.buckets.raw, GPU_INFO, (Expr("sample_interval_seconds", "last"),), looked, (), ("gpu",))
    rows, _ = store.aggregate(plan, "flux")
    return {r.tag("gpu"): float(r.values[0]) for r in rows if r.values[0] is not None}


def gpus_in_scope(store: Store, scope: Scope, tr: TimeRange) -> tuple[str, ...]:
    """The GPUs that reported within ``tr`` in ``scope`` (for measurements without the scope's tags)."""
    plan = Aggregate(store.buckets.raw, GPU, (Expr("verdict", "count"),), tr, scope_filters(scope), ("gpu",))
    rows, _ = store.aggregate(plan)
    return tuple(sorted({r.tag("gpu") for r in rows}))


def gpu_filter(store: Store, scope: Scope, tr: TimeRange, measurement: str) -> tuple[Filter, ...] | None:
    """Filters for ``measurement`` (``gpu_event``, ``finding``): the scope itself where the measurement has
    its tags (and a job-id field), else the scope's GPUs looked up in ``gpu`` first. None: no GPU in range."""
    missing = [k for k, _ in scope.tags if k not in TAGS[measurement]]
    if not missing and (scope.job is None or measurement == FINDING):
        return scope_filters(scope, measurement)
    gpus = gpus_in_scope(store, scope, tr)
    if not gpus:
        return None
    kept = Scope(**{k: v for k, v in scope.tags if k in TAGS[measurement]})
    return (*scope_filters(kept, measurement), TagIn("gpu", gpus))


@dataclass(frozen=True, slots=True)
class Band:
    """A learned baseline band for one (application, GPU model, phase, feature)."""

    p05: float | None
    p50: float | None
    p95: float | None
    n: float | None
    version: float | None
    trained_ns: int


def baseline_bands(
    store: Store, feature: str, phase: str, kinds: set[tuple[str, str]], now_ns: int
) -> dict[tuple[str, str], Band]:
    """The latest baseline band per (application, gpu_model) of ``kinds`` for a feature and phase."""
    apps = tuple(sorted({a for a, _ in kinds if a}))
    if not apps:
        return {}
    stats = ("p05", "p50", "p95", "n", "version")
    filters: tuple[Filter, ...] = (TagIn("feature", (feature,)), TagIn("phase", (phase,)), TagIn("application", apps))
    plan = Aggregate(
        store.buckets.raw,
        BASELINE,
        tuple(Expr(s, "last") for s in stats),
        TimeRange(0, now_ns + NS),
        filters,
        ("application", "gpu_model"),
    )
    rows, _ = store.aggregate(plan, "flux")  # last() per series is pushed down; one row per band
    out = {}
    for r in rows:
        key = (r.tag("application"), r.tag("gpu_model"))
        if key in kinds:
            p05, p50, p95, n, version = r.values
            out[key] = Band(p05, p50, p95, n, version, r.time_ns)
    return out


#: how an aggregate of a raw field reads from the rollups: (rollup field suffix, function over the rollup)
_ROLLUP_FN: Final[dict[str, tuple[str, Fn]]] = {
    "mean": ("mean", "mean"),
    "max": ("max", "max"),
    "min": ("min", "min"),
    "count": ("count", "sum"),
}


def rollup_blocker(field: str, fn: str, window_ns: int | None, job: str | None) -> str | None:
    """Why the 1-minute rollups cannot answer ``fn(field)`` (None: they can)."""
    if job is not None:
        return "job ids are not kept in the rollups (per-job queries read raw data)"
    if field not in ROLLUP_FIELDS:
        return f"{field} is not kept in the rollups (kept: {', '.join(ROLLUP_FIELDS)})"
    if fn == "sum":
        return "sums are not kept in the rollups (use mean or count)"
    if window_ns is not None and window_ns % MINUTE_NS:
        return "rollup windows are whole minutes"
    return None


def rollup_expr(field: str, fn: Fn) -> tuple[Expr, str | None]:
    """The rollup expression for ``fn(field)`` and a note when it is an approximation."""
    if fn in _ROLLUP_FN:
        suffix, over = _ROLLUP_FN[fn]
        return Expr(f"{field}_{suffix}", over), None
    return Expr(f"{field}_mean", fn), f"{fn} over the 1-minute means (the rollups keep mean/max/min/count)"


def read_from(store: Store, source: str, exprs: tuple[Expr, ...]) -> tuple[str, tuple[Expr, ...], list[str]]:
    """The bucket and expressions for ``source`` (``"raw"`` or ``"1m"``), with a note per approximation."""
    if source != "1m":
        return store.buckets.raw, exprs, []
    mapped = [rollup_expr(e.field, e.fn) for e in exprs]
    return store.buckets.rollup, tuple(e for e, _ in mapped), sorted({n for _, n in mapped if n})
