"""The Flux backend: plans (:mod:`sinks.query.model`) as Flux text (pure functions), run through influxdb-client.

Also builds the Flux of the storage task (job summaries) that :mod:`sinks.retention` installs, so every Flux the
project writes is built here (the 1-minute rollups are computed in the stream: :mod:`sinks.influxdb.rollup`).

Percentiles use ``quantile(method: "exact_selector")``: the value of rank ceil(n*q) (numpy's
``inverted_cdf``); medians ``exact_mean``. A filter on another field of the same point (``job_id``) needs a
pivot: Flux has no per-point join, which is why the planner sends those to InfluxQL (docs/queries.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Final

from influxdb_client.client.influxdb_client import InfluxDBClient

from pipeline.vocab import format_duration
from sinks.influxdb.schema import TAGS
from sinks.query.model import (
    NS,
    QUANTILES,
    Aggregate,
    AggRow,
    Expr,
    FieldEquals,
    Filter,
    PointRow,
    Points,
    Scale,
    TagIn,
    ValueBelow,
    ValueNotIn,
)

NAME: Final = "flux"


def string(value: str) -> str:
    """A Flux string literal (values are validated upstream; this is the second fence). Control characters are
    written as ``\\xNN`` escapes: a raw NUL or newline in a tag value cut the whole query short ("expected RPAREN,
    got EOF"), and one GPU's name must not break a fleet-wide query."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${")
    return '"' + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", escaped) + '"'


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def time_literal(ns: int) -> str:
    seconds, frac = divmod(ns, NS)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


def _column(name: str) -> str:
    return f"r[{string(name)}]"


def _tag_predicate(f: TagIn) -> str:
    return "(" + " or ".join(f"{_column(f.key)} == {string(v)}" for v in f.values) + ")"


def _predicate(measurement: str, fields: tuple[str, ...], filters: tuple[Filter, ...]) -> str:
    parts = [f"r._measurement == {string(measurement)}"]
    parts.append(_fields_predicate(fields))
    parts += [_tag_predicate(f) for f in filters if isinstance(f, TagIn)]
    return " and ".join(parts)


def _source(bucket: str, start_ns: int, stop_ns: int) -> str:
    return f"from(bucket: {string(bucket)})\n  |> range(start: {time_literal(start_ns)}, stop: {time_literal(stop_ns)})"


def _aggregate_fn(fn: str) -> str:
    """A Flux function usable both as ``aggregateWindow(fn: ...)`` and (called with no tables) as a step."""
    if fn in QUANTILES:
        q = QUANTILES[fn] / 100
        return f'(column, tables=<-) => tables |> quantile(q: {q}, column: column, method: "exact_selector")'
    if fn == "median":
        return '(column, tables=<-) => tables |> median(column: column, method: "exact_mean")'
    return fn


def _step(fn: str) -> str:
    """The same aggregation as a plain step over whole tables (no windows)."""
    if fn in QUANTILES:
        return f'quantile(q: {QUANTILES[fn] / 100}, method: "exact_selector")'
    if fn == "median":
        return 'median(method: "exact_mean")'
    return f"{_aggregate_fn(fn)}()"


def _value_not_in(f: ValueNotIn) -> str:
    return "  |> filter(fn: (r) => " + " and ".join(f"r._value != {v!r}" for v in f.values) + ")"


def _fields_predicate(fields: tuple[str, ...]) -> str:
    # equality ORs are pushed down into the storage read; contains(set:) is not (measured 440x slower)
    return "(" + " or ".join(f"r._field == {string(f)}" for f in fields) + ")"


def expr_pipeline(agg: Aggregate, expr: Expr, name: str) -> str:
    """One expression of an aggregate plan as a Flux pipeline ending in ``yield(name: name)``."""
    joins = tuple(f for f in agg.filters if isinstance(f, FieldEquals) and f.field != expr.field)
    own = [f for f in agg.filters if isinstance(f, FieldEquals) and f.field == expr.field]
    below = [f for f in agg.filters if isinstance(f, ValueBelow)]
    not_in = [f for f in agg.filters if isinstance(f, ValueNotIn)]
    scale = agg.scale_of(expr.field)
    stored = scale.reading if scale is not None else expr.field
    fields = (stored, *dict.fromkeys(f.field for f in joins))
    lines = [_source(agg.bucket, agg.range.start_ns, agg.range.stop_ns)]
    lines.append(f"  |> filter(fn: (r) => {_predicate(agg.measurement, fields, agg.filters)})")
    if joins:
        # a condition on another field of the same point: line the fields up per timestamp first
        cond = " and ".join(f"{_column(f.field)} == {string(f.value)}" for f in joins)
        lines.append('  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")')
        lines.append(f"  |> filter(fn: (r) => {cond} and exists {_column(stored)})")
        lines.append(f"  |> map(fn: (r) => ({{r with _value: {_column(stored)}, _field: {string(stored)}}}))")
        lines.append(f"  |> drop(columns: [{', '.join(string(f) for f in fields)}])")
    if scale is not None:
        lines += _scaled(scale, name)
    for f in own:
        lines.append(f"  |> filter(fn: (r) => r._value == {string(f.value)})")
    for b in below:
        lines.append(f"  |> filter(fn: (r) => r._value < {float(b.limit)!r})")
    lines += [_value_not_in(f) for f in not_in]
    lines.append(f"  |> group(columns: [{', '.join(string(t) for t in agg.group_by)}])")
    fn = _aggregate_fn(expr.fn)
    if agg.window_ns is not None:
        every = format_duration(agg.window_ns)
        lines.append(f'  |> aggregateWindow(every: {every}, fn: {fn}, timeSrc: "_start", createEmpty: false)')
    else:
        lines.append(f"  |> {_step(expr.fn)}")
    lines.append(f'  |> yield(name: "{name}")')
    return "\n".join(lines)


def _limits_dict(scale: Scale, name: str) -> str:
    """The GPUs' limits as a Flux dictionary named ``limits_<name>`` (a GPU whose limit changed: its first)."""
    pairs = ", ".join(f"{{key: {string(gpu)}, value: {float(seg[0][1])!r}}}" for gpu, seg in scale.limits)
    return f"limits_{name} = dict.fromList(pairs: [{pairs}])"


def _scaled(scale: Scale, name: str) -> list[str]:
    """The steps that turn each point of the reading into the relative value: divided by the limit in force at
    its time (points of GPUs without a known limit are left out)."""
    if not scale.limits:
        return ["  |> filter(fn: (r) => false)"]
    limit = f"dict.get(dict: limits_{name}, key: r.gpu, default: 0.0)"
    for gpu, segments in scale.limits:
        if len(segments) > 1:  # the limit changed in the range: the value in force at the point's time
            steps = " else ".join(
                f"if r._time < {time_literal(t)} then {v!r}"
                for (t, _), (_, v) in zip(segments[1:], segments[:-1], strict=True)
            )
            limit = f"(if r.gpu == {string(gpu)} then ({steps} else {segments[-1][1]!r}) else {limit})"
    return [
        f"  |> filter(fn: (r) => dict.get(dict: limits_{name}, key: r.gpu, default: 0.0) > 0.0)",
        f"  |> map(fn: (r) => ({{r with _value: float(v: r._value) / {limit}, _field: {string(scale.field)}}}))",
    ]


def aggregate_flux(agg: Aggregate) -> str:
    """The whole plan: one pipeline per expression, each yielding ``e<i>`` (the limits of relative values
    defined first)."""
    head = []
    for i, e in enumerate(agg.exprs):
        scale = agg.scale_of(e.field)
        if scale is not None and scale.limits:
            head.append(_limits_dict(scale, f"e{i}"))
    body = "\n\n".join(expr_pipeline(agg, e, f"e{i}") for i, e in enumerate(agg.exprs))
    return 'import "dict"\n\n' + "\n".join(head) + "\n\n" + body if head else body


def points_flux(q: Points) -> str:
    joins = [f for f in q.filters if isinstance(f, FieldEquals)]
    fields = tuple(dict.fromkeys((*q.fields, *(f.field for f in joins))))
    lines = [_source(q.bucket, q.range.start_ns, q.range.stop_ns)]
    lines.append(f"  |> filter(fn: (r) => {_predicate(q.measurement, fields, q.filters)})")
    lines.append('  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")')
    if joins:
        cond = " and ".join(f"{_column(f.field)} == {string(f.value)}" for f in joins)
        lines.append(f"  |> filter(fn: (r) => {cond})")
    lines.append("  |> group()")
    lines.append('  |> sort(columns: ["_time"], desc: true)')
    lines.append(f"  |> limit(n: {int(q.limit)})")
    return "\n".join(lines)


def _ns(value: Any) -> int:
    ts: datetime = value
    return int(ts.timestamp()) * NS + ts.microsecond * 1000


class FluxBackend:
    """Runs plans as Flux on InfluxDB 2.x (``/api/v2/query``)."""

    name = NAME

    def __init__(self, client: InfluxDBClient, org: str) -> None:
        self._client, self._org = client, org

    def unsupported(self, agg: Aggregate) -> str | None:
        """Why this backend cannot run the plan, or None (Flux runs every plan)."""
        return None

    def _records(self, flux: str) -> list[dict[str, Any]]:
        tables = self._client.query_api().query(flux, org=self._org)
        return [dict(record.values) for table in tables for record in table.records]

    def aggregate(self, agg: Aggregate) -> list[AggRow]:
        merged: dict[tuple[int, tuple[tuple[str, str], ...]], list[float | None]] = {}
        index = {f"e{i}": i for i in range(len(agg.exprs))}
        for rec in self._records(aggregate_flux(agg)):
            t = agg.row_time(_ns(rec["_time"]) if rec.get("_time") is not None else None)
            tags = tuple((k, str(rec.get(k) or "")) for k in agg.group_by)
            values = merged.setdefault((t, tags), [None] * len(agg.exprs))
            v = rec.get("_value")
            # first/last of a string field (job_id) are asked for their time, not their value
            values[index[rec["result"]]] = float(v) if isinstance(v, int | float) else None
        return [AggRow(t, tags, tuple(v)) for (t, tags), v in merged.items()]

    def points(self, q: Points) -> list[PointRow]:
        out = []
        for rec in self._records(points_flux(q)):
            tags = tuple(sorted((k, str(rec[k])) for k in TAGS[q.measurement] if rec.get(k) not in (None, "")))
            fields = tuple((f, rec.get(f)) for f in q.fields)
            out.append(PointRow(_ns(rec["_time"]), tags, fields))
        return out

    def run(self, flux: str) -> list[dict[str, Any]]:
        """Raw records of a Flux text built in this package (storage status, tasks, the reads of history,
        usage and alerts)."""
        return self._records(flux)

    def run_csv(self, flux: str) -> Iterator[list[str]]:
        """The result as CSV cells (header rows included), for results too large for dicts (training history)."""
        rows: Iterator[list[str]] = iter(self._client.query_api().query_csv(flux, org=self._org))
        return rows


# ---- storage tasks ---------------------------------------------------------------------------------------------


def jobs_task_flux(
    name: str, raw: str, jobs: str, org: str, fields: tuple[str, ...], interval_s: float, measurement: str = "gpu"
) -> str:
    """Every 10 minutes: per job (and application, GPU model, cluster) over the last whole 10 minutes, GPU-hours
    and p50/p95/max of ``fields``, written to ``jobs`` as measurement ``job`` with ``job_id`` as a tag there
    (a low-rate bucket: one point per job per 10 minutes)."""
    return f"""import "array"
import "date"
import "join"

option task = {{name: {string(name)}, every: 10m, offset: 1m}}

stop = date.truncate(t: now(), unit: 10m)
start = date.sub(d: 10m, from: stop)

{_jobs_body(raw, jobs, org, fields, interval_s, measurement)}"""


def jobs_range_flux(
    raw: str,
    jobs: str,
    org: str,
    fields: tuple[str, ...],
    interval_s: float,
    start_ns: int,
    stop_ns: int,
    measurement: str = "gpu",
) -> str:
    """The job-summary task's work over whole 10 minutes ``[start_ns, stop_ns)`` at once (backfill)."""
    return f"""import "array"
import "date"
import "join"

start = {time_literal(start_ns)}
stop = {time_literal(stop_ns)}

{_jobs_body(raw, jobs, org, fields, interval_s, measurement)}"""


def _jobs_body(raw: str, jobs: str, org: str, fields: tuple[str, ...], interval_s: float, measurement: str) -> str:
    """Per job, application, GPU model, cluster and 10-minute window ``w`` of ``start`` .. ``stop``: GPU-seconds
    (the one GPU-hour definition, pipeline.usage: each sample counts as its GPU's own sampling interval from
    ``gpu_info``, ``interval_s`` where a GPU never stored one) and p50/p95/max of ``fields``."""
    keys = '"job_id", "application", "gpu_model", "cluster", "w"'
    blocks = []
    for i, f in enumerate(fields):
        v = f"per_job_{i}"
        blocks.append(
            f"""{v} = base
    |> filter(fn: (r) => exists r[{string(f)}])
    |> map(fn: (r) => ({{_time: r._time, _value: float(v: r[{string(f)}]), job_id: r.job_id,
        application: r.application, gpu_model: r.gpu_model, cluster: r.cluster, w: r.w}}))
    |> group(columns: [{keys}])
{v} |> quantile(q: 0.5, method: "exact_selector") |> {_job_out(f + "_p50", jobs, org)}
{v} |> quantile(q: 0.95, method: "exact_selector") |> {_job_out(f + "_p95", jobs, org)}
{v} |> max() |> {_job_out(f + "_max", jobs, org)}"""
        )
    body = "\n\n".join(blocks)
    return f"""base = from(bucket: {string(raw)})
    |> range(start: start, stop: stop)
    |> filter(fn: (r) => r._measurement == {string(measurement)} and {_fields_predicate(("job_id", *fields))})
    |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")
    |> filter(fn: (r) => exists r.job_id)
    |> map(fn: (r) => ({{r with w: date.truncate(t: r._time, unit: 10m),
        application: if exists r.application then r.application else "unknown"}}))

stored_intervals = from(bucket: {string(raw)})
    |> range(start: date.sub(d: 1d, from: start), stop: stop)
    |> filter(fn: (r) => r._measurement == "gpu_info" and r._field == "sample_interval_seconds")
    |> group(columns: ["gpu"])
    |> last()
    |> keep(columns: ["gpu", "_value"])
    |> group()
// a row no GPU matches, so the join has a table to pair with even when no GPU stored its interval
intervals = union(tables: [stored_intervals, array.from(rows: [{{gpu: "", _value: {float(interval_s)!r}}}])])

// samples per GPU: each stands for its GPU's sampling interval (pipeline.usage, the one GPU-hour)
counted = base
    |> map(fn: (r) => ({{_time: r._time, _value: 1.0, gpu: r.gpu, job_id: r.job_id, application: r.application,
        gpu_model: r.gpu_model, cluster: r.cluster, w: r.w}}))
    |> group(columns: [{keys}, "gpu"])
    |> sum()
    |> group()
// and a row of no job, so that the join has a table when the range holds no job at all
samples = union(tables: [counted, array.from(rows: [{{gpu: "", _value: 0.0, job_id: "", application: "",
    gpu_model: "", cluster: "", w: start}}])])

join.left(left: samples, right: intervals, on: (l, r) => l.gpu == r.gpu,
        as: (l, r) => ({{l with _value: l._value * (if exists r._value then r._value else {float(interval_s)!r})}}))
    |> filter(fn: (r) => r.job_id != "")
    |> group(columns: [{keys}])
    |> sum()
    |> {_job_out("gpu_seconds", jobs, org)}

{body}
"""


def _job_out(field_name: str, jobs: str, org: str) -> str:
    return (
        f'map(fn: (r) => ({{r with _time: r.w, _measurement: "job", _field: {string(field_name)}}}))\n'
        '    |> drop(columns: ["w"])\n'
        f"    |> to(bucket: {string(jobs)}, org: {string(org)}, "
        'tagColumns: ["job_id", "application", "gpu_model", "cluster"])\n'
        f"    {_quiet(field_name)}"
    )


def _quiet(name: str) -> str:
    """After a write: what was written is not sent back (a backfill of a day would return every point it wrote);
    each pipeline of a script yields under a name of its own, as a query needs."""
    return f"|> filter(fn: (r) => false)\n    |> yield(name: {string(name)})"
