"""Comparisons: one job against its application's baseline, and two GPU models running one application."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.vocab import format_duration
from sinks.influxdb.schema import GPU
from sinks.query.model import (
    Aggregate,
    CompareJobQuery,
    CompareModelsQuery,
    Expr,
    FieldEquals,
    Fn,
    Scope,
    TagIn,
    TimeRange,
)
from sinks.query.output import Table, iso
from sinks.query.scope import Band, baseline_bands, job_extent, read_from, rollup_blocker, scope_filters
from sinks.query.store import Store, now_ns


@dataclass(frozen=True, slots=True)
class JobFeature:
    """One feature of a job on one (application, GPU model): the job's p50/p95 next to the baseline band."""

    feature: str
    application: str
    gpu_model: str
    samples: int
    p50: float | None
    p95: float | None
    band: Band | None

    @property
    def position(self) -> str:
        """Where the job's median sits against the band."""
        b = self.band
        if b is None or self.p50 is None or b.p05 is None or b.p95 is None:
            return "no baseline"
        if self.p50 > b.p95:
            return "above band"
        if self.p50 < b.p05:
            return "below band"
        return "within band"


@dataclass(frozen=True, slots=True)
class JobComparison:
    job: str
    phase: str
    range: TimeRange
    rows: tuple[JobFeature, ...]
    backend: str
    notes: tuple[str, ...] = ()

    def tables(self) -> list[Table]:
        columns = (
            "feature",
            "application",
            "gpu_model",
            "samples",
            "job_p50",
            "job_p95",
            "base_p05",
            "base_p50",
            "base_p95",
            "position",
        )
        rows = tuple(
            (
                r.feature,
                r.application,
                r.gpu_model,
                r.samples,
                r.p50,
                r.p95,
                r.band.p05 if r.band else None,
                r.band.p50 if r.band else None,
                r.band.p95 if r.band else None,
                r.position,
            )
            for r in self.rows
        )
        title = (
            f"job {self.job} against its {self.phase} baseline, {iso(self.range.start_ns)} .. {iso(self.range.stop_ns)}"
        )
        return [Table(title, columns, rows, (f"answered by {self.backend} from the raw bucket", *self.notes))]


def compare_job(store: Store, q: CompareJobQuery, now: int | None = None) -> JobComparison:
    """The job's p50/p95 per feature against the latest baseline of its application and GPU model(s)."""
    q.validate()
    now = now_ns() if now is None else now
    tr = q.time_range(now)
    store.source(tr, now, "job ids are kept with the raw data only")
    extent = job_extent(store, q.job, tr)
    if extent is None:
        return JobComparison(q.job, q.phase, tr, (), "-", (f"job {q.job} has no samples in this range",))
    narrowed, filters = extent.narrowed((FieldEquals("job_id", q.job),))
    exprs = tuple(Expr(f, fn) for f in q.features for fn in ("p50", "p95"))
    plan = Aggregate(
        store.buckets.raw, GPU, (*exprs, Expr(q.features[0], "count")), narrowed, filters, ("application", "gpu_model")
    )
    rows, backend = store.aggregate(plan)
    kinds = {(r.tag("application"), r.tag("gpu_model")) for r in rows}
    bands = {f: baseline_bands(store, f, q.phase, kinds, now) for f in q.features}
    out = []
    for r in sorted(rows, key=lambda r: r.tags):
        key = (r.tag("application"), r.tag("gpu_model"))
        samples = int(r.values[-1] or 0)
        for i, f in enumerate(q.features):
            out.append(JobFeature(f, key[0], key[1], samples, r.values[2 * i], r.values[2 * i + 1], bands[f].get(key)))
    notes = [
        f"job seen {iso(extent.start_ns)} .. {iso(extent.stop_ns)} (to within {format_duration(extent.window_ns)}) "
        f"on {len(extent.gpus)} GPU(s)"
    ]
    return JobComparison(q.job, q.phase, narrowed, tuple(out), backend, tuple(notes))


_STATS: tuple[Fn, ...] = ("count", "mean", "p05", "p50", "p95")


@dataclass(frozen=True, slots=True)
class ModelFeature:
    """The distribution of one normalized feature on one GPU model."""

    feature: str
    gpu_model: str
    samples: int
    mean: float | None
    p05: float | None
    p50: float | None
    p95: float | None


@dataclass(frozen=True, slots=True)
class ModelComparison:
    application: str
    model_a: str
    model_b: str
    range: TimeRange
    rows: tuple[ModelFeature, ...]
    backend: str
    source: str
    notes: tuple[str, ...] = ()

    def tables(self) -> list[Table]:
        a_p50 = {r.feature: r.p50 for r in self.rows if r.gpu_model == self.model_a}
        rows = []
        for r in self.rows:
            base = a_p50.get(r.feature)
            delta = r.p50 - base if r.gpu_model == self.model_b and r.p50 is not None and base is not None else None
            rows.append((r.feature, r.gpu_model, r.samples, r.mean, r.p05, r.p50, r.p95, delta))
        columns = ("feature", "gpu_model", "samples", "mean", "p05", "p50", "p95", "p50_minus_a")
        title = (
            f"{self.application} on {self.model_a} (a) vs {self.model_b}, "
            f"{iso(self.range.start_ns)} .. {iso(self.range.stop_ns)}"
        )
        return [
            Table(
                title, columns, tuple(rows), (f"answered by {self.backend} from the {self.source} bucket", *self.notes)
            )
        ]


def compare_models(store: Store, q: CompareModelsQuery, now: int | None = None) -> ModelComparison:
    """Per feature and model: samples, mean, p05, p50, p95 of the application's samples on each model."""
    q.validate()
    now = now_ns() if now is None else now
    tr = q.time_range(now)
    blockers = [rollup_blocker(f, "mean", None, None) for f in q.features]
    source = store.source(tr, now, next((b for b in blockers if b), None))
    bucket, exprs, notes = read_from(store, source, tuple(Expr(f, fn) for f in q.features for fn in _STATS))
    filters = (
        *scope_filters(Scope(cluster=q.cluster, application=q.application)),
        TagIn("gpu_model", (q.model_a, q.model_b)),
    )
    plan = Aggregate(bucket, GPU, exprs, tr, filters, ("gpu_model",))
    rows, backend = store.aggregate(plan)
    found = {r.tag("gpu_model"): r for r in rows}
    out = []
    for f_i, f in enumerate(q.features):
        for model in (q.model_a, q.model_b):
            r = found.get(model)
            if r is None:
                continue
            count, mean, p05, p50, p95 = r.values[f_i * len(_STATS) : (f_i + 1) * len(_STATS)]
            out.append(ModelFeature(f, model, int(count or 0), mean, p05, p50, p95))
    for model in (q.model_a, q.model_b):
        if model not in found:
            notes.append(f"no {q.application} samples on {model} in this range")
    return ModelComparison(q.application, q.model_a, q.model_b, tr, tuple(out), backend, source, tuple(notes))
