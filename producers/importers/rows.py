"""Imported readings column-wise, and the pure steps from them to what the pipeline reads.

An importer yields :class:`Block` s: :class:`Rows` (row ``i`` is one GPU at one time: identity, ``ts_ns``, the
canonical METRIC_FIELDS as float64 columns with NaN for "not in the source", the workload where the source
says) and the :class:`Rejection` s of what it could not read. Then, without I/O:

- :func:`detect_intervals`: each series' sampling interval, the median gap between its consecutive distinct
  timestamps (robust to the gaps of a stopped collector and to jitter); a series with one sample has none;
- :func:`duplicates`: rows of a GPU at a millisecond already taken (InfluxDB keeps one point per series and
  millisecond: a second one would overwrite silently, so it is rejected with its reason instead);
- :func:`context_changes`: per GPU, a :class:`GpuContext` where its workload changes, dated by the first row of
  the new one (so a context applies to exactly the rows of its range);
- :func:`node_batches`: one :class:`SampleBatch` per node and timestamp, what a live collector would have sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np

from pipeline.events import METRIC_INDEX, GpuContext, GpuEvent, GpuSample, SampleBatch, Workload
from producers.source import INTERVAL_FIELD

_MS: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class Rejection:
    """One input row that cannot be imported: why (a dead-letter reason), where it was, and its original bytes."""

    reason: str
    detail: str
    origin: str
    original: bytes
    gpu_uuid: str | None = None


@dataclass(frozen=True, eq=False)
class Rows:
    """Readings column-wise (see module docstring). ``origin`` says where each row came from (``file:line``),
    ``original`` holds its bytes as read, for the dead letter of a row that is rejected later."""

    node: tuple[str, ...]
    gpu_uuid: tuple[str, ...]
    gpu_index: tuple[int, ...]
    gpu_model: tuple[str, ...]
    ts_ns: np.ndarray
    metrics: dict[str, np.ndarray]
    origin: tuple[str, ...]
    original: tuple[bytes, ...]
    #: per row, what ran on the GPU; None for the whole block when the source says nothing about workloads
    workload: tuple[Workload | None, ...] | None = None
    #: discrete events read with the rows (dcgm-exporter's XID field), published with their node's batch
    events: tuple[GpuEvent, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.metrics) - set(METRIC_INDEX)
        if unknown:
            raise ValueError(f"not canonical fields: {sorted(unknown)}")
        n = len(self.gpu_uuid)
        columns = (self.node, self.gpu_index, self.gpu_model, self.ts_ns, self.origin, self.original)
        if any(len(c) != n for c in (*columns, *self.metrics.values())) or (
            self.workload is not None and len(self.workload) != n
        ):
            raise ValueError("every column of a block needs one value per row")

    def __len__(self) -> int:
        return len(self.gpu_uuid)

    def take(self, rows: np.ndarray) -> Rows:
        """The rows at the indices ``rows``, in that order."""
        picked = rows.tolist()

        def pick(column: tuple[object, ...]) -> tuple[object, ...]:
            return tuple(column[i] for i in picked)

        return replace(
            self,
            node=pick(self.node),  # type: ignore[arg-type]
            gpu_uuid=pick(self.gpu_uuid),  # type: ignore[arg-type]
            gpu_index=pick(self.gpu_index),  # type: ignore[arg-type]
            gpu_model=pick(self.gpu_model),  # type: ignore[arg-type]
            ts_ns=self.ts_ns[rows],
            metrics={k: v[rows] for k, v in self.metrics.items()},
            origin=pick(self.origin),  # type: ignore[arg-type]
            original=pick(self.original),  # type: ignore[arg-type]
            workload=None if self.workload is None else pick(self.workload),  # type: ignore[arg-type]
        )


@dataclass(frozen=True, eq=False)
class Block:
    """What an importer read in one go (a file, a time chunk of a Prometheus query): the rows it could read
    and the ones it could not. ``len(rows) + len(rejected)`` input rows in all."""

    rows: Rows
    rejected: tuple[Rejection, ...] = ()
    #: where the block came from, for the progress bar and the summary
    label: str = ""


def empty_rows() -> Rows:
    return Rows((), (), (), (), np.empty(0, np.int64), {}, (), ())


def rows_of(
    samples: list[GpuSample],
    origin: tuple[str, ...],
    original: tuple[bytes, ...],
    workload: tuple[Workload | None, ...] | None = None,
    events: tuple[GpuEvent, ...] = (),
) -> Rows:
    """Samples a parser already built (the NVML collector over a capture, a dcgm-exporter scrape) as rows."""
    fields = dict.fromkeys(name for s in samples for name in s.metrics)
    nan = float("nan")
    return Rows(
        node=tuple(s.node for s in samples),
        gpu_uuid=tuple(s.gpu_uuid for s in samples),
        gpu_index=tuple(s.gpu_index for s in samples),
        gpu_model=tuple(s.gpu_model for s in samples),
        ts_ns=np.array([s.ts_ns for s in samples], dtype=np.int64),
        metrics={f: np.array([s.metrics.get(f, nan) for s in samples], dtype=np.float64) for f in fields},
        origin=origin,
        original=original,
        workload=workload,
        events=events,
    )


def series_codes(rows: Rows) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """One integer per row naming its series (node, GPU), and the series in code order."""
    keys: dict[tuple[str, str], int] = {}
    codes = np.fromiter(
        (keys.setdefault(k, len(keys)) for k in zip(rows.node, rows.gpu_uuid, strict=True)),
        dtype=np.int64,
        count=len(rows),
    )
    return codes, list(keys)


def detect_intervals(codes: np.ndarray, ts_ns: np.ndarray) -> dict[int, float]:
    """Per series code, the median gap (s) between its consecutive distinct timestamps; series with a single
    timestamp are left out (one sample says nothing about how often it was taken)."""
    if not len(codes):
        return {}
    order = np.lexsort((ts_ns, codes))
    c, t = codes[order], ts_ns[order]
    gap = np.diff(t)
    same = (c[1:] == c[:-1]) & (gap > 0)
    owner, gaps = c[1:][same], gap[same]
    out: dict[int, float] = {}
    if not len(owner):
        return out
    split = np.flatnonzero(np.diff(owner)) + 1
    for part_owner, part in zip(np.split(owner, split), np.split(gaps, split), strict=True):
        out[int(part_owner[0])] = float(np.median(part)) / 1e9
    return out


def duplicates(codes: np.ndarray, ts_ns: np.ndarray) -> np.ndarray:
    """Rows whose series already has a row at the same millisecond earlier in the block (the first one stays)."""
    ms = ts_ns // _MS
    order = np.lexsort((np.arange(len(codes)), ms, codes))
    same = np.zeros(len(codes), dtype=bool)
    if len(codes) > 1:
        repeat = (codes[order][1:] == codes[order][:-1]) & (ms[order][1:] == ms[order][:-1])
        same[order[1:][repeat]] = True
    return same


def context_changes(rows: Rows, cluster: str, last: dict[tuple[str, str], Workload | None]) -> list[GpuContext]:
    """Per GPU, a context wherever its workload differs from the row before (``last``: what each GPU had at the
    end of the previous block, updated in place), in time order. None as a row's workload: nothing runs."""
    if rows.workload is None or not len(rows):
        return []
    codes, series = series_codes(rows)
    order = np.lexsort((rows.ts_ns, codes)).tolist()
    out: list[GpuContext] = []
    for i in order:
        key = series[int(codes[i])]
        workload = rows.workload[i]
        if key in last and last[key] == workload:
            continue
        last[key] = workload
        out.append(GpuContext(cluster, key[0], key[1], int(rows.ts_ns[i]), workload))
    out.sort(key=lambda c: c.ts_ns)
    return out


def node_batches(rows: Rows, cluster: str, interval_s: np.ndarray) -> Iterator[SampleBatch]:
    """One SampleBatch per node and timestamp, in time order (each sample with its series' interval where
    known); the block's events go with the first batch of their node at or after their time."""
    if not len(rows):
        return
    names = list(rows.metrics)
    matrix = np.column_stack([rows.metrics[n] for n in names]) if names else np.empty((len(rows), 0))
    with_interval = [*names, INTERVAL_FIELD]
    values = np.column_stack([matrix, interval_s]).tolist()
    node_of = {n: i for i, n in enumerate(dict.fromkeys(rows.node))}
    node_code = np.fromiter((node_of[n] for n in rows.node), dtype=np.int64, count=len(rows))
    order = np.lexsort((node_code, rows.ts_ns))
    ts, nc = rows.ts_ns[order], node_code[order]
    bounds = np.flatnonzero((np.diff(ts) != 0) | (np.diff(nc) != 0)) + 1
    pending = sorted(rows.events, key=lambda e: e.ts_ns)
    for part in np.split(order, bounds):
        first = int(part[0])
        node, at = rows.node[first], int(rows.ts_ns[first])
        samples = tuple(
            GpuSample(
                cluster,
                node,
                rows.gpu_uuid[i],
                rows.gpu_index[i],
                rows.gpu_model[i],
                at,
                {k: v for k, v in zip(with_interval, values[i], strict=True) if v == v},  # noqa: PLR0124 (NaN)
            )
            for i in part.tolist()
        )
        events = tuple(e for e in pending if e.node == node and e.ts_ns <= at)
        if events:
            pending = [e for e in pending if e not in events]
        yield SampleBatch(cluster, node, samples, events)
    for node in dict.fromkeys(e.node for e in pending):  # after the node's last reading: on their own
        yield SampleBatch(cluster, node, (), tuple(e for e in pending if e.node == node))


@dataclass
class Intervals:
    """The interval each series got when first detected, kept for the rest of the import: blocks of one series
    (a file per day, Prometheus chunks) all say the same, so ``gpu_info`` holds one value, not a jittering one."""

    seen: dict[tuple[str, str], float] = field(default_factory=dict)

    def per_row(self, rows: Rows) -> np.ndarray:
        """Each row's series interval (s), NaN where the series' interval is not known (yet)."""
        codes, series = series_codes(rows)
        for code, value in detect_intervals(codes, rows.ts_ns).items():
            self.seen.setdefault(series[code], value)
        known = np.array([self.seen.get(key, np.nan) for key in series], dtype=np.float64)
        return known[codes] if len(codes) else np.empty(0)
