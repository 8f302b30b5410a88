"""What the stored readings of a GPU or a job hold over a range: which columns, how often sampled, how many GPUs per
job and per node. The dashboard's GPU and job views turn it into the detectors
that cannot fire on that range (processors.coverage), as an import's summary does from what it read (issue 38: a
quiet view of imported logs with three columns is not a healthy fleet).

Read from the schema of sinks/influxdb/lines.py: readings are ``gpu`` fields (states and counters on change and
every 10 minutes), limits ``gpu_info`` fields (written when they change: looked for from the start of the data),
a job is the ``job_id`` field of its GPUs' samples. Whether XIDs could come is not said: an event is no column, and a
range without one says nothing of whether its source could send them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sinks.influxdb.schema import GPU, GPU_INFO
from sinks.query.flux import string, time_literal
from sinks.query.model import TimeRange, check_value
from sinks.query.store import Store

#: the reading whose timestamps give the sampling interval (every sample carries it), else the most frequent one
_PACE_FIELD: Final = "utilization_gpu_percent"


@dataclass(frozen=True, slots=True)
class StoredShape:
    """What the range's stored readings of some GPUs hold: the columns (reading and limit fields), the median
    interval between a GPU's samples (None: one sample each at most), the most GPUs one job named had (None:
    unknown; 0: no job named), the most GPUs reporting on one of their nodes."""

    columns: frozenset[str]
    interval_s: float | None
    job_gpus: int | None
    node_gpus: int


def _gpus_filter(gpus: tuple[str, ...]) -> str:
    return "(" + " or ".join(f"r.gpu == {string(g)}" for g in gpus) + ")"


def _source(store: Store, tr: TimeRange, start_ns: int | None = None) -> str:
    start = tr.start_ns if start_ns is None else start_ns
    return (
        f"from(bucket: {string(store.buckets.raw)}) "
        f"|> range(start: {time_literal(start)}, stop: {time_literal(tr.stop_ns)})"
    )


def job_gpus(store: Store, tr: TimeRange, job: str, cluster: str | None = None) -> tuple[str, ...]:
    """The GPUs whose samples in the range name ``job`` (of ``cluster``: job ids repeat across clusters), sorted."""
    check_value(job, "job")
    where = "" if cluster is None else f"r.cluster == {string(check_value(cluster, 'cluster'))} and "
    rows = store.flux_records(
        f"{_source(store, tr)} |> filter(fn: (r) => r._measurement == {string(GPU)} and {where}"
        f'r._field == "job_id") |> filter(fn: (r) => r._value == {string(job)}) |> group(columns: ["gpu"]) '
        "|> count()"
    )
    return tuple(sorted({str(r["gpu"]) for r in rows}))


def stored_shape(store: Store, tr: TimeRange, gpus: tuple[str, ...], job: str | None = None) -> StoredShape | None:
    """The shape of the stored readings of ``gpus`` in the range (None: no reading of theirs there). ``job``: the
    one job they all ran (the job view); without it the jobs named in their samples decide."""
    for g in gpus:
        check_value(g, "gpu")
    if not gpus:
        return None
    where = _gpus_filter(gpus)
    counts = store.flux_records(
        f"{_source(store, tr)} |> filter(fn: (r) => r._measurement == {string(GPU)} and {where}) "
        '|> group(columns: ["_field"]) |> count()'
    )
    fields = {str(r["_field"]): int(r["_value"]) for r in counts if int(r["_value"]) > 0}
    if not fields:
        return None
    limits = store.flux_records(
        f"{_source(store, tr, 0)} |> filter(fn: (r) => r._measurement == {string(GPU_INFO)} and {where}) "
        '|> group(columns: ["_field"]) |> count()'
    )
    pace = _PACE_FIELD if _PACE_FIELD in fields else max(fields, key=lambda f: fields[f])
    paced = (
        f"{_source(store, tr)} |> filter(fn: (r) => r._measurement == {string(GPU)} and {where} and "
        f'r._field == {string(pace)}) |> group(columns: ["cluster", "node", "gpu"])'
    )
    # the median step between a GPU's samples, taken in InfluxDB: a week of a job at 1 s is millions of rows
    steps = store.flux_records(
        f'{paced} |> elapsed(unit: 1ms) |> group() |> median(column: "elapsed", method: "exact_selector")'
    )
    series = store.flux_records(f'{paced} |> last() |> keep(columns: ["cluster", "node"])')
    nodes = {(str(r["cluster"]), str(r["node"])) for r in series}
    on_nodes = " or ".join(f"(r.cluster == {string(c)} and r.node == {string(n)})" for c, n in sorted(nodes))
    neighbours = store.flux_records(
        f"{_source(store, tr)} |> filter(fn: (r) => r._measurement == {string(GPU)} and ({on_nodes}) and "
        f'r._field == {string(pace)}) |> group(columns: ["cluster", "node", "gpu"]) |> last() '
        '|> keep(columns: ["cluster", "node", "gpu"])'
    )
    per_node: dict[tuple[str, str], set[str]] = {}
    for r in neighbours:
        per_node.setdefault((str(r["cluster"]), str(r["node"])), set()).add(str(r["gpu"]))
    return StoredShape(
        columns=frozenset(fields) | {str(r["_field"]) for r in limits},
        interval_s=int(steps[0]["elapsed"]) / 1000 if steps else None,
        job_gpus=len(gpus) if job is not None else _job_gpus_of(store, tr, gpus),
        node_gpus=max((len(v) for v in per_node.values()), default=len(gpus)),
    )


def _job_gpus_of(store: Store, tr: TimeRange, gpus: tuple[str, ...]) -> int | None:
    """The GPUs of the one job ``gpus`` ran in the range (0: none named; None: several jobs, not one answer)."""
    rows = store.flux_records(
        f"{_source(store, tr)} |> filter(fn: (r) => r._measurement == {string(GPU)} and "
        f'{_gpus_filter(gpus)} and r._field == "job_id") |> unique(column: "_value") |> keep(columns: ["_value"])'
    )
    jobs = {str(r["_value"]) for r in rows if r.get("_value")}
    if not jobs:
        return 0
    if len(jobs) > 1:
        return None
    return len(job_gpus(store, tr, jobs.pop()))
