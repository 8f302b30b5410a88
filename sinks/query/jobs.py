"""Job summaries from the jobs bucket: GPU-hours and utilization / memory / power per job, application and
GPU model, over ranges as long as the bucket keeps (400 days by default).

The bucket holds one point per job and 10 minutes (sinks/retention.py). Over a job's life: GPU-hours add up
exactly; max is the maximum; p95 is the highest 10-minute p95 (what right-sizing needs: the busiest stretch);
p50 is the mean of the 10-minute medians (exact for a steady job, an approximation otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipeline.reliability import JobSpan
from sinks.influxdb.schema import JOB, JOB_FIELDS
from sinks.query.flux import string, time_literal
from sinks.query.model import Aggregate, Expr, JobsQuery, TagIn, TimeRange
from sinks.query.output import Table, iso
from sinks.query.store import Store, now_ns

_TEN_MINUTES_NS: Final = 600 * 10**9

GROUP = ("job_id", "application", "gpu_model", "cluster")


@dataclass(frozen=True, slots=True)
class JobSummary:
    job: str
    application: str
    gpu_model: str
    cluster: str
    gpu_hours: float
    #: per field of JOB_FIELDS: (p50, p95, max)
    stats: tuple[tuple[float | None, float | None, float | None], ...]


@dataclass(frozen=True, slots=True)
class JobSummaries:
    range: TimeRange
    rows: tuple[JobSummary, ...]
    backend: str

    def tables(self) -> list[Table]:
        stat_cols = tuple(f"{f}_{s}" for f in JOB_FIELDS for s in ("p50", "p95", "max"))
        rows = tuple(
            (r.job, r.application, r.gpu_model, r.cluster, r.gpu_hours, *(v for triple in r.stats for v in triple))
            for r in self.rows
        )
        title = f"job summaries, {iso(self.range.start_ns)} .. {iso(self.range.stop_ns)}"
        notes = (
            f"answered by {self.backend} from the jobs bucket",
            "p95: the highest 10-minute p95; p50: the mean of the 10-minute medians",
        )
        return [Table(title, ("job", "application", "gpu_model", "cluster", "gpu_hours", *stat_cols), rows, notes)]


def job_summaries(store: Store, q: JobsQuery, now: int | None = None) -> JobSummaries:
    """Run a job-summary question (validated here); most GPU-hours first."""
    q.validate()
    asked = q.time_range(now_ns() if now is None else now)
    # a summary is stamped with the start of its 10 minutes: the one a range starts inside is part of the answer
    tr = TimeRange(asked.start_ns // _TEN_MINUTES_NS * _TEN_MINUTES_NS, asked.stop_ns)
    exprs = [Expr("gpu_seconds", "sum")]
    for f in JOB_FIELDS:
        exprs += [Expr(f"{f}_p50", "mean"), Expr(f"{f}_p95", "max"), Expr(f"{f}_max", "max")]
    renamed = {"job": "job_id"}
    filters = tuple(TagIn(renamed.get(k, k), (v,)) for k, v in (*q.scope.tags, ("job", q.scope.job)) if v)
    rows, backend = store.aggregate(Aggregate(store.buckets.jobs, JOB, tuple(exprs), tr, filters, GROUP))
    out = []
    for r in rows:
        v = r.values
        stats = tuple((v[1 + 3 * i], v[2 + 3 * i], v[3 + 3 * i]) for i in range(len(JOB_FIELDS)))
        out.append(
            JobSummary(
                r.tag("job_id"), r.tag("application"), r.tag("gpu_model"), r.tag("cluster"), (v[0] or 0.0) / 3600, stats
            )
        )
    out.sort(key=lambda s: (-s.gpu_hours, s.job))
    return JobSummaries(tr, tuple(out), backend)


def job_spans(store: Store, start_ns: int, stop_ns: int, cluster: str | None = None) -> list[JobSpan]:
    """(cluster, job, application, start of its first 10 minutes, end of its last, GPU-hours) for every job with a
    summary in ``[start, stop)`` (pipeline.reliability's effective time per job)."""
    where = f" and r.cluster == {string(cluster)}" if cluster else ""
    flux = (
        f"from(bucket: {string(store.buckets.jobs)}) "
        f"|> range(start: {time_literal(start_ns // _TEN_MINUTES_NS * _TEN_MINUTES_NS)}, "
        f"stop: {time_literal(stop_ns)}) "
        f'|> filter(fn: (r) => r._measurement == {string(JOB)} and r._field == "gpu_seconds"{where}) '
        '|> group(columns: ["cluster", "job_id", "application"]) '
        "|> map(fn: (r) => ({r with t: int(v: r._time)})) "
        "|> reduce(identity: {lo: 0, hi: 0, s: 0.0}, fn: (r, accumulator) => ({"
        "lo: if accumulator.lo == 0 or r.t < accumulator.lo then r.t else accumulator.lo, "
        "hi: if r.t > accumulator.hi then r.t else accumulator.hi, s: accumulator.s + float(v: r._value)}))"
    )
    return sorted(
        (
            str(r.get("cluster", "")),
            str(r.get("job_id", "")),
            str(r.get("application", "")),
            int(r["lo"]),
            int(r["hi"]) + _TEN_MINUTES_NS,
            float(r["s"]) / 3600,
        )
        for r in store.flux_records(flux)
    )
