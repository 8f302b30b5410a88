"""Anomaly history: unusual/anomalous verdict counts per window and the findings of a scope over a range."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.vocab import format_duration
from sinks.influxdb.schema import FINDING, GPU
from sinks.query.model import Aggregate, AggRow, AnomalyQuery, Expr, FieldEquals, Points, TagIn, TimeRange
from sinks.query.output import Table, iso
from sinks.query.scope import gpu_filter, scope_filters
from sinks.query.store import Store, now_ns

VERDICTS = ("unusual", "anomalous")
FINDING_FIELDS = ("active", "summary", "since_ns", "action", "job_id")


@dataclass(frozen=True, slots=True)
class VerdictWindow:
    time_ns: int
    samples: int
    unusual: int
    anomalous: int


@dataclass(frozen=True, slots=True)
class FindingRow:
    time_ns: int
    detector: str
    severity: str
    active: bool
    cluster: str
    node: str
    gpu: str
    summary: str
    since_ns: int | None


@dataclass(frozen=True, slots=True)
class AnomalyHistory:
    range: TimeRange
    window_ns: int
    windows: tuple[VerdictWindow, ...]
    findings: tuple[FindingRow, ...]
    backend: str
    source: str
    scope: str
    notes: tuple[str, ...] = ()

    def tables(self, part: str = "both") -> list[Table]:
        span = f"{iso(self.range.start_ns)} .. {iso(self.range.stop_ns)}"
        notes = (f"answered by {self.backend} from the {self.source} bucket", *self.notes)
        windows = Table(
            f"verdicts per {format_duration(self.window_ns)} ({self.scope}), {span}",
            ("time", "samples", "unusual", "anomalous"),
            tuple((iso(w.time_ns), w.samples, w.unusual, w.anomalous) for w in self.windows),
            notes,
        )
        findings = Table(
            f"findings ({self.scope}), newest first, {span}",
            ("time", "detector", "severity", "active", "cluster", "node", "gpu", "since", "summary"),
            tuple(
                (
                    iso(f.time_ns),
                    f.detector,
                    f.severity,
                    "yes" if f.active else "no",
                    f.cluster,
                    f.node,
                    f.gpu,
                    iso(f.since_ns) if f.since_ns else None,
                    f.summary,
                )
                for f in self.findings
            ),
        )
        return {"windows": [windows], "findings": [findings]}.get(part, [windows, findings])


def _counts(rows: list[AggRow]) -> dict[int, int]:
    return {r.time_ns: int(r.values[0] or 0) for r in rows}


def anomalies(store: Store, q: AnomalyQuery, now: int | None = None) -> AnomalyHistory:
    """Run an anomaly-history question (validated here)."""
    q.validate()
    now = now_ns() if now is None else now
    tr = q.time_range(now)
    window = q.window_ns(tr)
    tr = tr.aligned(window)
    blocker = "job ids are kept with the raw data only" if q.scope.job else None
    if blocker is None and window % (60 * 10**9):
        blocker = "rollup windows are whole minutes"
    source = store.source(tr, now, blocker)
    filters = scope_filters(q.scope)
    counts: dict[str, dict[int, int]] = {}
    backend = "-"
    if source == "1m":
        plans = {
            "samples": Expr("utilization_gpu_percent_count", "sum"),
            **{v: Expr(f"verdict_{v}", "sum") for v in VERDICTS},
        }
        for name, expr in plans.items():
            plan = Aggregate(store.buckets.rollup, GPU, (expr,), tr, filters, (), window)
            rows, backend = store.aggregate(plan, q.backend)
            counts[name] = _counts(rows)
    else:
        total = Aggregate(store.buckets.raw, GPU, (Expr("verdict", "count"),), tr, filters, (), window)
        rows, backend = store.aggregate(total, q.backend)
        counts["samples"] = _counts(rows)
        for v in VERDICTS:
            rows, _ = store.aggregate(total.with_filters(FieldEquals("verdict", v)), q.backend)
            counts[v] = _counts(rows)
    windows = tuple(
        VerdictWindow(t, counts["samples"].get(t, 0), counts["unusual"].get(t, 0), counts["anomalous"].get(t, 0))
        for t in sorted(set().union(*counts.values()))
    )
    findings: tuple[FindingRow, ...] = ()
    ffilters = gpu_filter(store, q.scope, tr, FINDING)
    if ffilters is not None:
        if q.detector:
            ffilters = (*ffilters, TagIn("detector", (q.detector,)))
        points, _ = store.points(Points(store.buckets.raw, FINDING, FINDING_FIELDS, tr, ffilters, q.limit))
        findings = tuple(
            FindingRow(
                p.time_ns,
                p.tag("detector"),
                p.tag("severity"),
                bool(p.get("active")),
                p.tag("cluster"),
                p.tag("node"),
                p.tag("gpu"),
                str(p.get("summary") or ""),
                _int(p.get("since_ns")),
            )
            for p in points
        )
    notes = ("findings are kept with the raw data only: older ones have expired",) if source == "1m" else ()
    return AnomalyHistory(tr, window, windows, findings, backend, source, q.scope.describe(), notes)


def _int(v: float | str | None) -> int | None:
    return int(v) if isinstance(v, int | float) else None
