"""Historical trends: ``fn(field)`` per window and group over a range and scope, with the baseline band."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.vocab import format_duration
from sinks.influxdb.schema import GPU
from sinks.query.model import QUANTILES, Aggregate, Expr, TimeRange, TrendQuery, check_fn
from sinks.query.output import Table, iso
from sinks.query.scope import (
    Band,
    baseline_bands,
    read_from,
    rollup_blocker,
    scope_filters,
)
from sinks.query.store import Store, now_ns


@dataclass(frozen=True, slots=True)
class TrendRow:
    time_ns: int
    #: the group's tag values, in the order of :attr:`TrendResult.group_by`
    group: tuple[str, ...]
    value: float | None
    band: Band | None = None


@dataclass(frozen=True, slots=True)
class TrendResult:
    field: str
    fn: str
    group_by: tuple[str, ...]
    window_ns: int
    range: TimeRange
    rows: tuple[TrendRow, ...]
    backend: str
    source: str
    notes: tuple[str, ...] = ()
    band: bool = False

    def tables(self) -> list[Table]:
        band_cols = ("band_p05", "band_p50", "band_p95") if self.band else ()
        columns = ("time", *self.group_by, f"{self.fn}({self.field})", *band_cols)
        rows = []
        for r in self.rows:
            extra: tuple[float | None, ...] = ()
            if self.band:
                extra = (r.band.p05, r.band.p50, r.band.p95) if r.band else (None, None, None)
            rows.append((iso(r.time_ns), *r.group, r.value, *extra))
        title = (
            f"{self.fn}({self.field}) per {format_duration(self.window_ns)} by {', '.join(self.group_by)}, "
            f"{iso(self.range.start_ns)} .. {iso(self.range.stop_ns)}"
        )
        notes = (f"answered by {self.backend} from the {self.source} bucket", *self.notes)
        return [Table(title, columns, tuple(rows), notes)]


def trend(store: Store, q: TrendQuery, now: int | None = None) -> TrendResult:
    """Run a trend question (validated here; raises InvalidQuery with one line when malformed)."""
    q.validate()
    now = now_ns() if now is None else now
    tr = q.time_range(now)
    window = q.window_ns(tr)
    tr = tr.aligned(window)
    fn = check_fn(q.fn)
    group_by = tuple(dict.fromkeys((q.by, *(("application", "gpu_model") if q.band else ()))))
    filters = scope_filters(q.scope)
    notes: list[str] = []
    source = store.source(tr, now, rollup_blocker(q.field, fn, window, q.scope.job))
    bucket, exprs, approximations = read_from(store, source, (Expr(q.field, fn),))
    notes += approximations
    plan = Aggregate(bucket, GPU, exprs, tr, filters, group_by, window)
    rows, backend = store.aggregate(plan, q.backend)
    if fn in QUANTILES and source == "raw":
        rank = "floor(n*q + 0.5), InfluxQL" if backend == "influxql" else "ceil(n*q), Flux exact_selector"
        notes.append(f"{fn}: the sample of rank {rank}")
    bands = {}
    if q.band:
        kinds = {(r.tag("application"), r.tag("gpu_model")) for r in rows}
        bands = baseline_bands(store, q.field, q.phase, kinds, now)
        missing = sorted(f"{a or '(no application)'}/{m}" for a, m in kinds if (a, m) not in bands)
        if missing:
            notes.append(f"no {q.phase} baseline for {q.field} on {', '.join(missing)}")
    out = [
        TrendRow(
            r.time_ns,
            tuple(r.tag(k) for k in group_by),
            r.values[0],
            bands.get((r.tag("application"), r.tag("gpu_model"))),
        )
        for r in rows
    ]
    out.sort(key=lambda r: (r.time_ns, r.group))
    return TrendResult(q.field, fn, group_by, window, tr, tuple(out), backend, source, tuple(notes), q.band)
