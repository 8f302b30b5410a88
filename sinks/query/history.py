"""The query layer's reads for the Iterate loop: stored history for ``hermeneut baselines train``, the stored
event behind a feedback, operators' feedback and the windows of active findings; and the stored rows a backfill
rolls up (:func:`stored_rows`).

Part of the query layer: like the rest of it, it is the only place these reads are written in Flux, and it checks
every value that reaches Flux (GPU ids, durations, strides) before it does.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import numpy as np
from tqdm import tqdm

from pipeline.config import Settings
from pipeline.errors import InvalidQuery
from pipeline.events import METRIC_INDEX, METRIC_LIMIT, METRIC_NAMES, RELATIVE_OF, relative_values
from pipeline.vocab import format_duration, parse_duration
from sinks.influxdb.lines import INFO_REFRESH_NS
from sinks.influxdb.schema import FEEDBACK, FINDING, GPU, GPU_INFO, ROLLUP_FIELDS
from sinks.query.store import Store, flux_rows

_SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:@/ -]{1,200}$")
#: metric fields the baselines are learned from (with the GPU's limits from ``gpu_info``, which give the relative
#: values: readings over limits, as the processor computed them)
HISTORY_METRICS: Final = (
    "power_watts",
    "memory_used_bytes",
    "sm_clock_mhz",
    "temperature_gpu_celsius",
    "utilization_gpu_percent",
    "utilization_memory_percent",
    "sm_active_percent",
    "tensor_active_percent",
    "dram_active_percent",
    "pcie_rx_bytes_per_second",
    "pcie_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "throttle_reasons_mask",
)
_LIMIT_COLS: Final = np.flatnonzero(METRIC_LIMIT)
_LIMIT_NAMES: Final = tuple(METRIC_NAMES[c] for c in _LIMIT_COLS.tolist())
_HISTORY_STRINGS: Final = ("phase", "app_source")


def _checked_value(what: str, value: str) -> str:
    if not _SAFE_VALUE.fullmatch(value):
        raise InvalidQuery(f"{what} {value!r} has characters a {what} cannot have")
    return value


def _checked_duration(what: str, value: str) -> str:
    """A duration in the one grammar (pipeline.vocab), spelt as a Flux duration literal."""
    return format_duration(parse_duration(value, what, error=InvalidQuery))


def _flux_time(ts_ns: int) -> str:
    seconds, ns = divmod(ts_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns:09d}Z"


@dataclass(frozen=True, slots=True, eq=False)
class History:
    """Stored samples of one (application, GPU model), column-wise: ``metrics`` has the METRIC_NAMES columns
    (NaN where not stored or not queried; the limits those in force at each row's time), ``relative`` the
    RELATIVE_FIELDS computed from them; ``phase`` as stored (None where the processor had none); ``source`` says
    who named the application."""

    application: str
    gpu_model: str
    cluster: tuple[str, ...]
    gpu: tuple[str, ...]
    ts_ns: np.ndarray
    metrics: np.ndarray
    relative: np.ndarray
    phase: tuple[str | None, ...]
    source: tuple[str | None, ...]

    def __len__(self) -> int:
        return len(self.gpu)


def history_flux(bucket: str, start_ns: int, stop_ns: int, stride: str | None, cluster: str | None) -> str:
    """Flux for the gpu points with a known application in [start, stop), one row per point (or per GPU and
    ``stride`` window: its last point, a real sample rather than an average)."""
    fields = (*HISTORY_METRICS, *_HISTORY_STRINGS)
    where = f' and r.cluster == "{_checked_value("cluster", cluster)}"' if cluster else ""
    window = (
        f"  |> aggregateWindow(every: {_checked_duration('stride', stride)}, fn: last, createEmpty: false)\n"
        if stride
        else ""
    )
    return (
        f'from(bucket: "{bucket}")\n'
        f"  |> range(start: {_flux_time(start_ns)}, stop: {_flux_time(stop_ns)})\n"
        f'  |> filter(fn: (r) => r._measurement == "{GPU}" and exists r.application{where})\n'
        # OR-ed equalities are pushed down to storage; contains() over the list is not (measured 400x slower)
        f"  |> filter(fn: (r) => {' or '.join(f'r._field == {json.dumps(f)}' for f in fields)})\n"
        f"{window}"
        '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        "  |> group()"
    )


def limits_flux(bucket: str, start_ns: int, stop_ns: int, cluster: str | None, gpu: str | None = None) -> str:
    """Flux for the GPUs' limits (``gpu_info``, written on change and every refresh period) in force from
    ``start_ns`` to ``stop_ns``: the points from one refresh period before."""
    where = f' and r.cluster == "{_checked_value("cluster", cluster)}"' if cluster else ""
    where += f' and r.gpu == "{_checked_value("gpu", gpu)}"' if gpu else ""
    return (
        f'from(bucket: "{bucket}")\n'
        f"  |> range(start: {_flux_time(start_ns - INFO_REFRESH_NS)}, stop: {_flux_time(stop_ns)})\n"
        f'  |> filter(fn: (r) => r._measurement == "{GPU_INFO}"{where})\n'
        f"  |> filter(fn: (r) => {' or '.join(f'r._field == {json.dumps(f)}' for f in _LIMIT_NAMES)})\n"
        '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        "  |> group()"
    )


#: what the 1-minute rollups need of a stored ``gpu`` point: the rolled-up readings (which give the relative values
#: with the limits of ``gpu_info``), the clocks-event mask, the score and the verdict
_ROLLUP_READS: Final = (
    *dict.fromkeys(
        [*(f for f in ROLLUP_FIELDS if f in METRIC_INDEX), *(r for r, _ in RELATIVE_OF.values() if r in METRIC_INDEX)]
    ),
    "throttle_reasons_mask",
    "score",
    "verdict",
)


def rollup_source_flux(bucket: str, start_ns: int, stop_ns: int) -> str:
    """Flux for every ``gpu`` point in [start, stop) with what its rollup needs, one row per point."""
    return (
        f'from(bucket: "{bucket}")\n'
        f"  |> range(start: {_flux_time(start_ns)}, stop: {_flux_time(stop_ns)})\n"
        f'  |> filter(fn: (r) => r._measurement == "{GPU}")\n'
        f"  |> filter(fn: (r) => {' or '.join(f'r._field == {json.dumps(f)}' for f in _ROLLUP_READS)})\n"
        '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        "  |> group()"
    )


@dataclass(frozen=True, slots=True, eq=False)
class StoredRows:
    """Stored ``gpu`` points as arrays: their series tags, time, metrics (limits filled in from ``gpu_info``),
    relative values, score and verdict."""

    cluster: list[str]
    node: list[str]
    gpu: list[str]
    gpu_index: list[int]
    gpu_model: list[str]
    application: list[str | None]
    ts_ns: np.ndarray
    metrics: np.ndarray
    relative: np.ndarray
    score: np.ndarray
    verdict: list[str]


def stored_rows(store: Store, bucket: str, start_ns: int, stop_ns: int) -> Iterator[StoredRows]:
    """Every ``gpu`` point in [start, stop), per table of the answer (see :func:`rollup_source_flux`)."""
    limits = Limits()
    for table in _csv_tables(store.flux_csv(limits_flux(bucket, start_ns, stop_ns, None))):
        limits.add(table)
    for table in _csv_tables(store.flux_csv(rollup_source_flux(bucket, start_ns, stop_ns))):
        n = len(table["_time"])
        ts = _times(table["_time"])
        metrics = np.full((n, len(METRIC_NAMES)), np.nan)
        for name in _ROLLUP_READS:
            if name in METRIC_INDEX:
                metrics[:, METRIC_INDEX[name]] = _floats(table.get(name), n)
        clusters, gpus = table["cluster"], table["gpu"]
        limits.fill(metrics, clusters, gpus, ts)
        empty = [""] * n
        yield StoredRows(
            clusters,
            table.get("node", empty),
            gpus,
            [int(i or 0) for i in table.get("gpu_index", empty)],
            table.get("gpu_model", empty),
            [a or None for a in table.get("application", empty)],
            ts,
            metrics,
            relative_values(metrics),
            _floats(table.get("score"), n),
            table.get("verdict", empty),
        )


class Limits:
    """Each GPU's limits over time, to look up the ones in force at a row's time."""

    def __init__(self) -> None:
        self._by_gpu: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    def add(self, table: dict[str, list[str]]) -> None:
        """The rows of a :func:`limits_flux` answer."""
        n = len(table["_time"])
        ts = _times(table["_time"])
        values = np.column_stack([_floats(table.get(name), n) for name in _LIMIT_NAMES]).reshape(n, -1)
        keys = list(zip(table["cluster"], table["gpu"], strict=True))
        for key in dict.fromkeys(keys):
            rows = np.flatnonzero([k == key for k in keys])
            old_ts, old_values = self._by_gpu.get(key, (np.empty(0, np.int64), np.empty((0, len(_LIMIT_NAMES)))))
            all_ts, all_values = np.concatenate([old_ts, ts[rows]]), np.vstack([old_values, values[rows]])
            order = np.argsort(all_ts, kind="stable")
            self._by_gpu[key] = all_ts[order], all_values[order]

    def fill(self, metrics: np.ndarray, clusters: list[str], gpus: list[str], ts: np.ndarray) -> None:
        """Put the limits in force at each row's time into ``metrics``' limit columns (in place; a row before
        its GPU's first known limits gets those)."""
        keys = list(zip(clusters, gpus, strict=True))
        for key in dict.fromkeys(keys):
            known = self._by_gpu.get(key)
            if known is None:
                continue
            rows = np.flatnonzero([k == key for k in keys])
            times, values = known
            at = np.clip(np.searchsorted(times, ts[rows], side="right") - 1, 0, len(times) - 1)
            metrics[np.ix_(rows, _LIMIT_COLS)] = values[at]


def _csv_tables(rows: Iterator[list[str]]) -> Iterator[dict[str, list[str]]]:
    """Columns of each table of an un-annotated Flux CSV answer (a header row starts a table)."""
    header: list[str] | None = None
    body: list[list[str]] = []
    for row in rows:
        if not row or row == [""]:
            continue
        if "_time" in row and "result" in row:
            if header is not None and body:
                yield {name: [r[i] for r in body] for i, name in enumerate(header)}
            header, body = row, []
        elif header is not None:
            body.append(row)
    if header is not None and body:
        yield {name: [r[i] for r in body] for i, name in enumerate(header)}


def _floats(column: list[str] | None, n: int) -> np.ndarray:
    if column is None:
        return np.full(n, np.nan)
    cells = np.array(column, dtype=object)
    cells[cells == ""] = "nan"
    return cells.astype(np.float64)


def _times(column: list[str]) -> np.ndarray:
    return np.array([t.rstrip("Z") for t in column], dtype="datetime64[ns]").astype(np.int64)


def _history_of(
    table: dict[str, list[str]],
    carry: dict[tuple[str, str], dict[str, str]] | None = None,
    limits: Limits | None = None,
) -> dict[tuple[str, str], History]:
    """The rows of one answer per (application, GPU model). ``phase`` and ``app_source`` are stored when they
    change (and every refresh period), so each GPU's are filled forward in time, starting from ``carry`` (the
    last ones seen per (cluster, GPU) before, updated here)."""
    n = len(table["_time"])
    metrics = np.full((n, len(METRIC_NAMES)), np.nan)
    for name in HISTORY_METRICS:
        metrics[:, METRIC_INDEX[name]] = _floats(table.get(name), n)
    ts = _times(table["_time"])
    if limits is not None:
        limits.fill(metrics, table["cluster"], table["gpu"], ts)
    relative = relative_values(metrics)
    empty = [""] * n
    strings = {name: list(table.get(name, empty)) for name in _HISTORY_STRINGS}
    _fill_forward(strings, table["cluster"], table["gpu"], ts, {} if carry is None else carry)
    # one string object per distinct value (a CSV answer makes one per row): a GPU's id, cluster, phase and source
    # repeat on every row, and a week of training history holds millions of rows
    phase = [sys.intern(p) if p else None for p in strings["phase"]]
    source = [sys.intern(s) if s else None for s in strings["app_source"]]
    apps, models = table["application"], table.get("gpu_model", [""] * n)
    keys = np.array([f"{a}\x00{m}" for a, m in zip(apps, models, strict=True)], dtype=object)
    out = {}
    for key in np.unique(keys).tolist():
        rows = np.flatnonzero(keys == key)
        app, model = key.split("\x00")
        pick = rows.tolist()
        out[(app, model)] = History(
            app,
            model,
            tuple(sys.intern(table["cluster"][i]) for i in pick),
            tuple(sys.intern(table["gpu"][i]) for i in pick),
            ts[rows],
            metrics[rows],
            relative[rows],
            tuple(phase[i] for i in pick),
            tuple(source[i] for i in pick),
        )
    return out


def _fill_forward(
    columns: dict[str, list[str]],
    clusters: list[str],
    gpus: list[str],
    ts: np.ndarray,
    carry: dict[tuple[str, str], dict[str, str]],
) -> None:
    """Empty cells of ``columns`` take the GPU's previous value in time (or its ``carry``), in place."""
    for row in np.argsort(ts, kind="stable").tolist():
        known = carry.setdefault((clusters[row], gpus[row]), {})
        for name, column in columns.items():
            if column[row]:
                known[name] = column[row]
            else:
                column[row] = known.get(name, "")


def carry_flux(bucket: str, start_ns: int, cluster: str | None) -> str:
    """Flux for each GPU's last ``phase`` and ``app_source`` in the refresh period before ``start_ns``: where
    filling forward starts."""
    where = f' and r.cluster == "{_checked_value("cluster", cluster)}"' if cluster else ""
    fields = " or ".join(f"r._field == {json.dumps(f)}" for f in _HISTORY_STRINGS)
    return (
        f'from(bucket: "{bucket}")\n'
        f"  |> range(start: {_flux_time(start_ns - INFO_REFRESH_NS)}, stop: {_flux_time(start_ns)})\n"
        f'  |> filter(fn: (r) => r._measurement == "{GPU}" and exists r.application{where})\n'
        f"  |> filter(fn: (r) => {fields})\n"
        '  |> group(columns: ["cluster", "gpu", "_field"])\n'
        "  |> last()\n"
        '  |> pivot(rowKey: ["cluster", "gpu"], columnKey: ["_field"], valueColumn: "_value")\n'
        "  |> group()"
    )


def _concat(parts: list[History]) -> History:
    """One History from the chunks of one key, emptying ``parts`` as it goes: each chunk is let go once copied, so
    the rows are held about once, not twice."""
    app, model, n = parts[0].application, parts[0].gpu_model, sum(len(p) for p in parts)
    ts, metrics, relative = (
        np.empty(n, np.int64),
        np.empty((n, parts[0].metrics.shape[1])),
        np.empty((n, parts[0].relative.shape[1])),
    )
    cluster: list[str] = []
    gpu: list[str] = []
    phase: list[str | None] = []
    source: list[str | None] = []
    at = 0
    while parts:
        p = parts.pop(0)
        rows = slice(at, at + len(p))
        ts[rows], metrics[rows], relative[rows] = p.ts_ns, p.metrics, p.relative
        cluster += p.cluster
        gpu += p.gpu
        phase += p.phase
        source += p.source
        at += len(p)
    return History(
        app,
        model,
        tuple(cluster),
        tuple(gpu),
        ts,
        metrics,
        relative,
        tuple(phase),
        tuple(source),
    )


def training_history(
    settings: Settings,
    start_ns: int,
    stop_ns: int,
    stride: str | None = None,
    chunks: int = 24,
    cluster: str | None = None,
    progress: bool = True,
) -> dict[tuple[str, str], History]:
    """Every stored sample with a known application in [start, stop), per (application, GPU model), read in
    ``chunks`` time slices with a progress bar (see :func:`history_flux`)."""
    i = settings.influxdb
    store = Store.from_settings(settings, 120.0)
    edges = np.linspace(start_ns, stop_ns, max(1, chunks) + 1).astype(np.int64).tolist()
    parts: dict[tuple[str, str], list[History]] = {}
    rows = 0
    try:
        carry: dict[tuple[str, str], dict[str, str]] = {}
        for r in store.flux_records(carry_flux(i.bucket, start_ns, cluster)):
            carry[(str(r["cluster"]), str(r["gpu"]))] = {f: str(r[f]) for f in _HISTORY_STRINGS if r.get(f)}
        with tqdm(total=len(edges) - 1, desc="reading history", unit="chunk", disable=not progress) as bar:
            for lo, hi in itertools.pairwise(edges):
                limits = Limits()
                for table in _csv_tables(store.flux_csv(limits_flux(i.bucket, lo, hi, cluster))):
                    limits.add(table)
                for table in _csv_tables(store.flux_csv(history_flux(i.bucket, lo, hi, stride, cluster))):
                    for key, h in _history_of(table, carry, limits).items():
                        parts.setdefault(key, []).append(h)
                        rows += len(h)
                bar.set_postfix(rows=rows)
                bar.update()
    finally:
        store.close()
    return {key: _concat(parts.pop(key)) for key in sorted(parts)}


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One stored interpreted event, found by GPU and time (the parts feedback and training need)."""

    cluster: str
    node: str
    gpu: str
    gpu_model: str
    application: str | None
    ts_ns: int
    metrics: np.ndarray
    relative: np.ndarray
    verdict: str | None
    explanation: str | None
    baseline: str | None


def stored_event(settings: Settings, gpu: str, ts_ms: int) -> StoredEvent | None:
    """The ``gpu`` point of one GPU at one millisecond, or None when there is none."""
    i = settings.influxdb
    start = ts_ms * 1_000_000
    flux = (
        f'from(bucket: "{i.bucket}")\n'
        f"  |> range(start: {_flux_time(start)}, stop: {_flux_time(start + 1_000_000)})\n"
        f'  |> filter(fn: (r) => r._measurement == "{GPU}" and r.gpu == "{_checked_value("gpu", gpu)}")\n'
        '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        "  |> group()"
    )
    [rows, limit_rows] = flux_rows(settings, flux, limits_flux(i.bucket, start, start + 1_000_000, None, gpu))
    if not rows:
        return None
    r = rows[0]
    nan = float("nan")
    metrics = np.array([float(r.get(n, nan) or nan) for n in METRIC_NAMES])
    if limit_rows:  # the limits in force: the last ones written
        last = max(limit_rows, key=lambda x: x["_time"])
        metrics[_LIMIT_COLS] = [float(last.get(n, nan) or nan) for n in _LIMIT_NAMES]
    return StoredEvent(
        cluster=str(r["cluster"]),
        node=str(r["node"]),
        gpu=gpu,
        gpu_model=str(r.get("gpu_model", "")),
        application=r.get("application"),
        ts_ns=start,
        metrics=metrics,
        relative=relative_values(metrics[None, :])[0],
        verdict=r.get("verdict"),
        explanation=r.get("explanation"),
        baseline=r.get("baseline"),
    )


@dataclass(frozen=True, slots=True)
class FeedbackRow:
    """The latest operator verdict on one event."""

    event_id: str
    cluster: str
    gpu: str
    event_ts_ms: int
    verdict: str
    application: str | None
    gpu_model: str | None


def feedback_rows(settings: Settings, range_: str = "30d") -> list[FeedbackRow]:
    """Operators' verdicts given in the last ``range_``, the latest per event."""
    i = settings.influxdb
    flux = (
        f'from(bucket: "{i.bucket}")\n'
        f"  |> range(start: -{_checked_duration('range', range_)})\n"
        f'  |> filter(fn: (r) => r._measurement == "{FEEDBACK}")\n'
        '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        '  |> group()\n  |> sort(columns: ["_time"])'
    )
    [rows] = flux_rows(settings, flux)
    latest = {
        str(r["event_id"]): FeedbackRow(
            str(r["event_id"]),
            str(r["cluster"]),
            str(r["gpu"]),
            int(r["event_ts_ms"]),
            str(r["verdict"]),
            r.get("application"),
            r.get("gpu_model"),
        )
        for r in rows
    }
    return list(latest.values())


_SEVERITIES: Final = ("info", "warning", "critical")
_SEVERITY_RANK: Final = {name: i for i, name in enumerate(_SEVERITIES)}


@dataclass(frozen=True, slots=True)
class FindingWindow:
    """When a detector's finding was active on a GPU of a cluster: [start_ns, end_ns], and its highest severity."""

    gpu: str
    detector: str
    start_ns: int
    end_ns: int
    severity: str = "info"
    #: a GPU is named within its cluster: the same uuid or ``<node>-gpu<i>`` elsewhere is another GPU
    cluster: str = ""


def finding_windows(settings: Settings, start_ns: int, stop_ns: int, repeat_s: float = 60.0) -> list[FindingWindow]:
    """Windows of findings active in [start, stop): from ``since_ns`` to the clear (or the last repeat plus one
    repeat interval, if it has not cleared)."""
    i = settings.influxdb
    flux = (
        f'from(bucket: "{i.bucket}")\n'
        f"  |> range(start: {_flux_time(start_ns)}, stop: {_flux_time(stop_ns)})\n"
        f'  |> filter(fn: (r) => r._measurement == "{FINDING}" and '
        '(r._field == "active" or r._field == "since_ns"))\n'
        '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        "  |> group()"
    )
    [rows] = flux_rows(settings, flux)
    spans: dict[tuple[str, str, str, int], tuple[int, bool]] = {}
    worst: dict[tuple[str, str, str, int], int] = {}
    for r in sorted(rows, key=lambda r: r["_time"]):
        # since_ns is stored as a float (ns lose their last bits): floor it to the ms the samples are stored at
        since_ms = int(r.get("since_ns") or 0) // 1_000_000
        key = (str(r.get("cluster") or ""), str(r["gpu"]), str(r["detector"]), since_ms * 1_000_000)
        spans[key] = (int(r["_time"].timestamp() * 1e9), bool(r.get("active")))
        worst[key] = max(worst.get(key, 0), _SEVERITY_RANK.get(str(r.get("severity")), 0))
    repeat_ns = int(repeat_s * 1e9)
    return [
        FindingWindow(gpu, detector, since, last + (repeat_ns if active else 0), _SEVERITIES[worst[key]], cluster)
        for key, (last, active) in spans.items()
        for cluster, gpu, detector, since in (key,)
        if gpu != "-"
    ]
