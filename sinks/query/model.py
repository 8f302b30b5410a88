"""What can be asked of stored telemetry, checked before anything reaches a database (pure, no I/O).

Two layers. The *questions* people ask (:class:`TrendQuery`, :class:`TopQuery`, :class:`CompareJobQuery`,
:class:`CompareModelsQuery`, :class:`AnomalyQuery`) are validated here: field names against the schema, tag
values against a conservative character set, durations, windows, functions. Each raises
:class:`~pipeline.errors.InvalidQuery` with one line saying what to fix. The *plans* the backends run
(:class:`Aggregate`, :class:`Points`) are built from validated questions only, so user input never reaches
query text unchecked; the backends still escape every literal they write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Final, Literal

from pipeline.errors import InvalidQuery
from pipeline.events import APPLICATIONS, METRIC_FIELDS, PHASES, RELATIVE_FIELDS
from pipeline.vocab import CLOCK_REASONS, IDLE_UTIL_PERCENT, NS_PER_S, format_duration, parse_duration
from sinks.influxdb.schema import GPU, TAGS

NS: Final = NS_PER_S
#: tag values and job ids: what GPU models, uuids, node names, Slurm/Kubernetes job ids are made of
_VALUE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:/@+()-]{0,127}$")

#: aggregation functions a user may ask for; ``pNN`` are nearest-rank percentiles (see docs/queries.md)
FUNCTIONS: Final = ("mean", "max", "min", "median", "count", "sum", "p50", "p90", "p95", "p99", "stddev")
Fn = Literal[
    "mean",
    "max",
    "min",
    "median",
    "count",
    "sum",
    "p50",
    "p90",
    "p95",
    "p99",
    "stddev",
    # internal: the first/last point (its time); p05
    "first",
    "last",
    "p05",
]
QUANTILES: Final = {"p05": 5, "p50": 50, "p90": 90, "p95": 95, "p99": 99}

READING_FIELDS: Final = tuple(f.name for f in METRIC_FIELDS if not f.limit)
LIMIT_FIELDS: Final = tuple(f.name for f in METRIC_FIELDS if f.limit)
#: numeric fields of ``gpu`` a trend may aggregate
NUMERIC_FIELDS: Final = (*READING_FIELDS, *RELATIVE_FIELDS, "score")
GROUP_TAGS: Final = TAGS[GPU]
SCOPE_KEYS: Final = ("cluster", "node", "gpu", "job", "application", "gpu_model")

#: NVML clocks-event reasons that do not slow a busy GPU down (pipeline.vocab), as every mask made of them alone:
#: a value filter can exclude them (measured: a per-row bit test in Flux costs 35x a filter).
_BENIGN_BITS: Final = tuple(r.bit for r in CLOCK_REASONS if not r.throttles)
BENIGN_MASKS: Final = tuple(
    float(sum(bit for i, bit in enumerate(_BENIGN_BITS) if n >> i & 1)) for n in range(2 ** len(_BENIGN_BITS))
)
MAX_WINDOWS: Final = 10_000
MAX_TOP: Final = 1000


def parse_time(value: str, what: str) -> int:
    """An RFC 3339 / ISO 8601 time (``2025-01-31T12:00:00Z``; no zone means UTC) in epoch nanoseconds."""
    try:
        dt = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidQuery(f"{what} {value!r} is not a time like 2025-01-31T12:00:00Z") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) * NS + dt.microsecond * 1000


def check_value(value: str, what: str) -> str:
    if not _VALUE.fullmatch(value):
        raise InvalidQuery(
            f"{what} {value!r} has characters a {what} cannot have (letters, digits, space and ._:/@+()- only)"
        )
    return value


def check_field(name: str, allowed: tuple[str, ...] = NUMERIC_FIELDS) -> str:
    if name in allowed:
        return name
    if name in LIMIT_FIELDS and name not in allowed:
        raise InvalidQuery(f"{name} is a limit of the GPU (stored in gpu_info when it changes), not a reading")
    close = [f for f in allowed if name.lower() in f] or [f for f in allowed if f.split("_")[0] in name]
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise InvalidQuery(f"field {name!r} is not a stored reading{hint}")


def check_fn(fn: str) -> Fn:
    if fn not in FUNCTIONS:
        raise InvalidQuery(f"function {fn!r} is not one of {', '.join(FUNCTIONS)}")
    return fn  # type: ignore[return-value]


def check_group(by: str) -> str:
    if by not in GROUP_TAGS:
        raise InvalidQuery(f"group-by {by!r} is not one of {', '.join(GROUP_TAGS)}")
    return by


@dataclass(frozen=True, slots=True)
class TimeRange:
    """``[start_ns, stop_ns)`` in UTC epoch nanoseconds."""

    start_ns: int
    stop_ns: int

    @property
    def length_ns(self) -> int:
        return self.stop_ns - self.start_ns

    def aligned(self, window_ns: int) -> TimeRange:
        """Start moved back to a window boundary, so every backend's windows are whole and start at epoch
        multiples of the window (InfluxQL's GROUP BY time and Flux's aggregateWindow agree on them)."""
        return TimeRange(self.start_ns - self.start_ns % window_ns, self.stop_ns)


def resolve_range(range_: str | None, start: str | None, stop: str | None, now_ns: int, default: str) -> TimeRange:
    """The time range of a question: ``range`` (else ``default``) back from ``stop`` (default now), or
    ``start`` .. ``stop``."""
    check_range(range_, start, stop)
    stop_ns = parse_time(stop, "stop") if stop else now_ns
    start_ns = (
        parse_time(start, "start")
        if start
        else stop_ns - parse_duration(range_ or default, "range", error=InvalidQuery)
    )
    if start_ns >= stop_ns:
        raise InvalidQuery("the range is empty: start must be before stop")
    return TimeRange(start_ns, stop_ns)


def check_range(range_: str | None, start: str | None, stop: str | None) -> None:
    """What :func:`resolve_range` would reject, short of comparing with the clock."""
    if start and range_:
        raise InvalidQuery("give either a range (how far back) or a start time, not both")
    if range_ is not None:
        parse_duration(range_, "range", error=InvalidQuery)
    start_ns = parse_time(start, "start") if start else None
    stop_ns = parse_time(stop, "stop") if stop else None
    if start_ns is not None and stop_ns is not None and start_ns >= stop_ns:
        raise InvalidQuery("the range is empty: start must be before stop")


_NICE: Final = tuple(
    parse_duration(d, "window", error=InvalidQuery)
    for d in ("1s", "5s", "10s", "30s", "1m", "5m", "10m", "15m", "30m", "1h", "3h", "6h", "12h", "1d", "1w")
)


def auto_window(length_ns: int, points: int = 300) -> int:
    """A round window giving at most about ``points`` windows over the range."""
    for w in _NICE:
        if length_ns // w <= points:
            return w
    return _NICE[-1]


def check_window(window_ns: int, length_ns: int) -> None:
    if window_ns > length_ns:
        raise InvalidQuery(f"window {format_duration(window_ns)} is longer than the range {format_duration(length_ns)}")
    if length_ns // window_ns > MAX_WINDOWS:
        least = format_duration(-(-length_ns // MAX_WINDOWS // NS) * NS)
        raise InvalidQuery(
            f"window {format_duration(window_ns)} over {format_duration(length_ns)} gives more than {MAX_WINDOWS} "
            f"windows; use a window of at least {least}"
        )


@dataclass(frozen=True, slots=True)
class Scope:
    """Which GPUs a question is about; every key given narrows it (all None: the whole fleet)."""

    cluster: str | None = None
    node: str | None = None
    gpu: str | None = None
    job: str | None = None
    application: str | None = None
    gpu_model: str | None = None

    def validate(self) -> Scope:
        for key in SCOPE_KEYS:
            value = getattr(self, key)
            if value is not None:
                check_value(value, key.replace("_", " "))
        if self.application is not None and self.application not in APPLICATIONS:
            raise InvalidQuery(f"application {self.application!r} is not one of {', '.join(APPLICATIONS)}")
        return self

    @property
    def tags(self) -> tuple[tuple[str, str], ...]:
        """The scope's tag filters (job is a field, see :attr:`job`)."""
        return tuple(
            (k, v)
            for k in ("cluster", "node", "gpu", "application", "gpu_model")
            if (v := getattr(self, k)) is not None
        )

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in SCOPE_KEYS if getattr(self, k) is not None]
        return ", ".join(parts) or "whole fleet"


# ---- plans: what a backend runs ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TagIn:
    """The tag equals one of ``values``."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FieldEquals:
    """A string field (``job_id``, ``verdict``) equals ``value`` in the same point."""

    field: str
    value: str


@dataclass(frozen=True, slots=True)
class ValueNotIn:
    """The aggregated field's value is none of ``values`` (throttled samples: not a benign mask)."""

    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class ValueBelow:
    """The aggregated field's value is below ``limit`` (wasted-capacity counts)."""

    limit: float


Filter = TagIn | FieldEquals | ValueBelow | ValueNotIn


@dataclass(frozen=True, slots=True)
class Expr:
    field: str
    fn: Fn


@dataclass(frozen=True, slots=True)
class Scale:
    """A relative value computed per point: ``reading`` over the GPU's limit in force at the point's time.
    ``limits`` holds, per GPU, the limit's values from the times they took effect, oldest first (the first one
    also stands for the time before it)."""

    field: str
    reading: str
    limits: tuple[tuple[str, tuple[tuple[int, float], ...]], ...]


@dataclass(frozen=True, slots=True)
class Aggregate:
    """Aggregate ``exprs`` (all over the same points) per ``group_by`` tags, per ``window`` or over the range.

    Row times are window starts; without a window, the selected point's time for first/last and the range
    start otherwise. ``scales`` say how the relative fields among ``exprs`` are computed from stored readings
    (filled in by :meth:`sinks.query.store.Store.aggregate` for the raw bucket).
    """

    bucket: str
    measurement: str
    exprs: tuple[Expr, ...]
    range: TimeRange
    filters: tuple[Filter, ...] = ()
    group_by: tuple[str, ...] = ()
    window_ns: int | None = None
    scales: tuple[Scale, ...] = ()

    def scale_of(self, field: str) -> Scale | None:
        return next((s for s in self.scales if s.field == field), None)

    def with_filters(self, *more: Filter) -> Aggregate:
        return replace(self, filters=self.filters + more)

    def row_time(self, point_ns: int | None) -> int:
        """The time a result row carries (see class docstring), from the time a backend reported."""
        if self.window_ns is None and not all(e.fn in ("first", "last") for e in self.exprs):
            return self.range.start_ns  # aggregates over the range; selectors (max) would each bring their own
        return self.range.start_ns if point_ns is None else point_ns


@dataclass(frozen=True, slots=True)
class Points:
    """The points of a low-rate measurement (findings): tags and ``fields`` per point, newest first."""

    bucket: str
    measurement: str
    fields: tuple[str, ...]
    range: TimeRange
    filters: tuple[Filter, ...] = ()
    limit: int = 1000


@dataclass(frozen=True, slots=True)
class AggRow:
    """One result row: time (ns, see :class:`Aggregate`), the group's tag values, one value per expr."""

    time_ns: int
    tags: tuple[tuple[str, str], ...]
    values: tuple[float | None, ...]

    def tag(self, key: str) -> str:
        return dict(self.tags).get(key, "")


@dataclass(frozen=True, slots=True)
class PointRow:
    time_ns: int
    tags: tuple[tuple[str, str], ...]
    fields: tuple[tuple[str, float | str | None], ...]

    def tag(self, key: str) -> str:
        return dict(self.tags).get(key, "")

    def get(self, name: str) -> float | str | None:
        return dict(self.fields).get(name)


# ---- questions ---------------------------------------------------------------------------------------------

BackendName = Literal["auto", "flux", "influxql"]
BACKENDS: Final = ("auto", "flux", "influxql")


def check_backend(value: str) -> BackendName:
    if value not in BACKENDS:
        raise InvalidQuery(f"backend {value!r} is not one of {', '.join(BACKENDS)}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class TrendQuery:
    """A historical trend: ``fn(field)`` per ``every`` window and ``by`` group, over a range, in a scope.

    The first five fields keep the order of the first version (``TrendQuery("power_watts", "node", "1m",
    "2h", "max")``). ``every=None`` picks a round window giving about 300 points. ``band`` adds the baseline
    band (p05/p50/p95) of each group's application and GPU model for ``phase``.
    """

    field: str
    by: str = "gpu_model"
    every: str | None = "10s"
    range: str | None = None
    fn: str = "mean"
    scope: Scope = Scope()
    band: bool = False
    phase: str = "compute"
    start: str | None = None
    stop: str | None = None
    backend: str = "auto"

    def validate(self) -> None:
        check_field(self.field)
        check_group(self.by)
        check_fn(self.fn)
        check_backend(self.backend)
        self.scope.validate()
        if self.every is not None:
            parse_duration(self.every, "window", error=InvalidQuery)
        check_range(self.range, self.start, self.stop)
        if self.band and self.phase not in PHASES:
            raise InvalidQuery(f"phase {self.phase!r} is not one of {', '.join(PHASES)}")

    def time_range(self, now_ns: int) -> TimeRange:
        return resolve_range(self.range, self.start, self.stop, now_ns, "15m")

    def window_ns(self, tr: TimeRange) -> int:
        w = parse_duration(self.every, "window", error=InvalidQuery) if self.every else auto_window(tr.length_ns)
        check_window(w, tr.length_ns)
        return w


TOP_KINDS: Final[dict[str, str]] = {
    "hot": "hottest GPUs: temperature relative to the GPU's own slowdown threshold",
    "throttled": "most throttled: share of samples with a clocks-event reason other than idle/app clocks/sync boost",
    "wasted": "most wasted capacity: GPU-hours allocated to a workload with utilization under a threshold",
    "power": "highest power draw (watts; relative to the power limit alongside)",
    "xid": "most XID errors (gpu_event)",
}


@dataclass(frozen=True, slots=True)
class TopQuery:
    """The N GPUs that rank highest on one of :data:`TOP_KINDS` over a range."""

    kind: str
    n: int = 10
    range: str | None = None
    scope: Scope = Scope()
    #: for ``hot`` and ``power``: max, mean, p95 ...
    fn: str = "max"
    #: for ``wasted``: utilization (percent) under which an allocated GPU counts as wasted (default: idle, as the
    #: idle-capacity finding and right-sizing count it)
    threshold: float = IDLE_UTIL_PERCENT
    start: str | None = None
    stop: str | None = None
    backend: str = "auto"

    def validate(self) -> None:
        if self.kind not in TOP_KINDS:
            raise InvalidQuery(f"top list {self.kind!r} is not one of {', '.join(TOP_KINDS)}")
        if not 1 <= self.n <= MAX_TOP:
            raise InvalidQuery(f"n={self.n} is not between 1 and {MAX_TOP}")
        if not 0 < self.threshold <= 100:
            raise InvalidQuery(f"threshold {self.threshold:g} is not a utilization percentage in (0, 100]")
        check_fn(self.fn)
        check_backend(self.backend)
        self.scope.validate()
        check_range(self.range, self.start, self.stop)

    def time_range(self, now_ns: int) -> TimeRange:
        return resolve_range(self.range, self.start, self.stop, now_ns, "1h")


#: features compared by default: normalized, so GPUs of different sizes compare fairly
COMPARE_FEATURES: Final = (
    "utilization_gpu_percent",
    "power_ratio_of_limit",
    "memory_used_ratio",
    "sm_clock_ratio_of_max",
    "temperature_ratio_of_slowdown",
)


def check_features(features: tuple[str, ...]) -> tuple[str, ...]:
    if not features:
        raise InvalidQuery("name at least one feature to compare")
    for f in features:
        check_field(f)
    return features


@dataclass(frozen=True, slots=True)
class CompareJobQuery:
    """One job against the baseline of its application (per GPU model it ran on), feature by feature."""

    job: str
    range: str | None = None
    features: tuple[str, ...] = COMPARE_FEATURES
    phase: str = "compute"
    start: str | None = None
    stop: str | None = None

    def validate(self) -> None:
        check_value(self.job, "job")
        check_features(self.features)
        if self.phase not in PHASES:
            raise InvalidQuery(f"phase {self.phase!r} is not one of {', '.join(PHASES)}")
        check_range(self.range, self.start, self.stop)

    def time_range(self, now_ns: int) -> TimeRange:
        return resolve_range(self.range, self.start, self.stop, now_ns, "7d")


@dataclass(frozen=True, slots=True)
class CompareModelsQuery:
    """Two GPU models running one application: the distribution of each normalized feature on each."""

    application: str
    model_a: str
    model_b: str
    range: str | None = None
    features: tuple[str, ...] = COMPARE_FEATURES
    cluster: str | None = None
    start: str | None = None
    stop: str | None = None

    def validate(self) -> None:
        Scope(cluster=self.cluster, application=self.application, gpu_model=self.model_a).validate()
        check_value(self.model_b, "gpu model")
        if self.model_a == self.model_b:
            raise InvalidQuery("compare two different GPU models")
        check_features(self.features)
        check_range(self.range, self.start, self.stop)

    def time_range(self, now_ns: int) -> TimeRange:
        return resolve_range(self.range, self.start, self.stop, now_ns, "24h")


@dataclass(frozen=True, slots=True)
class AnomalyQuery:
    """Verdict counts (unusual / anomalous) per window and the findings of a scope over a range."""

    range: str | None = None
    every: str | None = None
    scope: Scope = Scope()
    detector: str | None = None
    limit: int = 200
    start: str | None = None
    stop: str | None = None
    backend: str = "auto"

    def validate(self) -> None:
        self.scope.validate()
        check_backend(self.backend)
        if self.detector is not None:
            check_value(self.detector, "detector")
        if not 1 <= self.limit <= 10_000:
            raise InvalidQuery(f"limit {self.limit} is not between 1 and 10000")
        if self.every is not None:
            parse_duration(self.every, "window", error=InvalidQuery)
        check_range(self.range, self.start, self.stop)

    def time_range(self, now_ns: int) -> TimeRange:
        return resolve_range(self.range, self.start, self.stop, now_ns, "24h")

    def window_ns(self, tr: TimeRange) -> int:
        w = parse_duration(self.every, "window", error=InvalidQuery) if self.every else auto_window(tr.length_ns, 100)
        check_window(w, tr.length_ns)
        return w


@dataclass(frozen=True, slots=True)
class JobsQuery:
    """Job summaries (GPU-hours, utilization, memory, power) from the jobs bucket, per job, application and
    GPU model, over a range (default 30 days)."""

    range: str | None = None
    scope: Scope = Scope()
    start: str | None = None
    stop: str | None = None

    def validate(self) -> None:
        self.scope.validate()
        if self.scope.node is not None or self.scope.gpu is not None:
            raise InvalidQuery("job summaries are per job, not per node or GPU: scope them by job, application, model")
        check_range(self.range, self.start, self.stop)

    def time_range(self, now_ns: int) -> TimeRange:
        return resolve_range(self.range, self.start, self.stop, now_ns, "30d")
