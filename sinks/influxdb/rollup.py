"""1-minute rollups computed in the stream: what the sink already holds, aggregated per GPU series and minute and
written once to ``<bucket>_1m`` (pure: numpy accumulators, no I/O; the sink writes the lines).

Per series (the ``gpu`` tags: cluster, node, GPU, index, model, application) and minute: ``<field>_mean``,
``_max``, ``_min`` and ``_count`` of :data:`sinks.query.model.ROLLUP_FIELDS`, ``throttle_samples`` (samples with
a clocks-event mask) and ``throttled_samples`` (a mask with a throttling reason), and the ``verdict_unusual`` /
``verdict_anomalous`` counts; a count of zero is not written. These are the points the InfluxDB task of the
previous version computed by reading the raw data back every minute (29 s per run at 10,000 GPUs, piling up
after an outage); tests/integration/test_retention.py checks both give the same points on the same data.

When a minute is complete: rows of one GPU arrive in time order in one partition, so a partition's minute is
closed once that partition has seen a sample :data:`LATENESS_MIN` minutes later (a node up to a minute late
still counts). A row of a minute already closed is counted (``late_rows``), stored raw, and left out of the
rollup rather than overwriting a whole minute with a part.

What survives a restart: :meth:`MinuteRollups.mark` says, per partition, the first offset whose rows are still
in an open minute and the first open minute. The runner commits that offset (not further) with the minute as
the commit's metadata; a restarted sink (or the partition's next owner) resumes with :meth:`MinuteRollups.resume`,
re-reads from there, rebuilds the open minutes whole and skips rows of minutes already written. So each minute is
written once, from every sample of it, crash or rebalance included; a replay writes identical points.

:func:`rollup_lines` runs the same code over history (interpreted batches), :func:`rollup_rows` over rows read
back from the raw bucket (``sinks.retention.backfill``): every minute closed at the end.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from pipeline.events import METRIC_INDEX, RELATIVE_FIELDS, InterpretedBatch, Verdict
from pipeline.vocab import CLOCK_REASONS
from sinks.influxdb.lines import series_tags
from sinks.influxdb.schema import ROLLUP_FIELDS

MINUTE_NS: Final = 60 * 10**9
#: a partition's minute closes once it has seen a sample this many whole minutes later
LATENESS_MIN: Final = 1
#: minutes a series keeps open at once (the open one, the late margin, the newest)
_RING: Final = LATENESS_MIN + 2
#: a series with no row for this many minutes before the newest one seen, and no open minute, is released: its
#: index (and its accumulator rows) go to the next new series. A GPU's series changes with its application, so
#: without this the sink's memory grows with every job a GPU ever ran (measured: ``make soak``, README)
IDLE_MIN: Final = 10
_METADATA_PREFIX: Final = "hermeneut-rollups-closed-before="
_MASK: Final = METRIC_INDEX["throttle_reasons_mask"]
#: clocks-event bits that do not slow a GPU down (idle, application clocks, sync boost, display clocks)
_BENIGN: Final = sum(r.bit for r in CLOCK_REASONS if not r.throttles)


def _sources(name: str) -> tuple[str, int]:
    """Where a rollup field's values are in a batch: ``("metrics"|"relative"|"score", column)``."""
    if name in METRIC_INDEX:
        return "metrics", METRIC_INDEX[name]
    if name in RELATIVE_FIELDS:
        return "relative", RELATIVE_FIELDS.index(name)
    return "score", 0


_METRIC_COLS: Final = [(j, c) for j, (kind, c) in enumerate(map(_sources, ROLLUP_FIELDS)) if kind == "metrics"]
_RELATIVE_COLS: Final = [(j, c) for j, (kind, c) in enumerate(map(_sources, ROLLUP_FIELDS)) if kind == "relative"]
_SCORE_COL: Final = ROLLUP_FIELDS.index("score")


def rollup_values(b: InterpretedBatch) -> np.ndarray:
    """The batch's ROLLUP_FIELDS columns (NaN where absent)."""
    out = np.empty((len(b), len(ROLLUP_FIELDS)))
    for j, c in _METRIC_COLS:
        out[:, j] = b.metrics[:, c]
    for j, c in _RELATIVE_COLS:
        out[:, j] = b.relative[:, c]
    out[:, _SCORE_COL] = b.score
    return out


@dataclass
class _Partition:
    """Where one partition is: its first open minute, the newest minute it has seen, and per message still
    needed after a restart its offset and newest minute."""

    open_from: int | None = None
    newest: int | None = None
    #: the first open minute a restart resumed from (rows before it were written by the previous run)
    resumed_from: int | None = None
    messages: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)


@dataclass
class RollupStats:
    minutes_written: int = 0
    late_rows: int = 0
    replayed_rows: int = 0


class MinuteRollups:
    """Open 1-minute windows per series, for the partitions this sink holds (see the module docstring).

    Series are named by the caller: an index per (GPU, application) and its tag string (the ``gpu`` line's
    tags), so the sink's tag strings are built once. An index released (:meth:`release`, a series gone quiet) is
    handed to the next new series, so the accumulators hold the series of the last minutes, not of all time.
    """

    def __init__(self, measurement: str = "gpu") -> None:
        self.measurement = measurement
        self.stats = RollupStats()
        self._parts: dict[int, _Partition] = {}
        self._tags: list[str] = []
        n, f = 256, len(ROLLUP_FIELDS)
        self._partition = np.full(n, -1, dtype=np.int64)
        self._count = np.zeros((n, _RING, f))
        self._sum = np.zeros((n, _RING, f))
        self._min = np.full((n, _RING, f), np.nan)
        self._max = np.full((n, _RING, f), np.nan)
        # samples, with a mask, throttled, unusual, anomalous
        self._counts = np.zeros((n, _RING, 5))
        #: per series: the newest minute it had a row of (-1: none, or released)
        self._last = np.full(n, -1, dtype=np.int64)
        self._free: list[int] = []

    @property
    def live(self) -> int:
        """Series held now (registered and not released)."""
        return len(self._tags) - len(self._free)

    def series(self, tags: str) -> int:
        """A new series index for these tags (the caller keeps the mapping): a released one if there is one."""
        if self._free:
            s = self._free.pop()
            self._tags[s] = tags
        else:
            s = len(self._tags)
            self._tags.append(tags)
            if s == len(self._partition):
                self._grow()
        self._last[s] = self.newest() or 0  # a series that never gets a row (all late) is released too
        return s

    def newest(self) -> int | None:
        """The newest minute any partition has seen."""
        return max((p.newest for p in self._parts.values() if p.newest is not None), default=None)

    def idle(self, before_minute: int) -> np.ndarray:
        """Series with no row since before ``before_minute`` and no open minute: safe to release."""
        n = len(self._tags)
        quiet = (self._last[:n] >= 0) & (self._last[:n] < before_minute)  # -1: released
        return np.flatnonzero(quiet & ~self._counts[:n, :, 0].any(axis=1))

    def release(self, series: np.ndarray) -> None:
        """Hand these series' indices to the next new series (their accumulators are empty: see :meth:`idle`)."""
        self._last[series] = -1
        self._partition[series] = -1
        for s in series.tolist():
            self._tags[s] = ""
            self._free.append(s)

    def _grow(self) -> None:
        n = len(self._partition)
        self._partition = np.concatenate([self._partition, np.full(n, -1, dtype=np.int64)])
        self._last = np.concatenate([self._last, np.full(n, -1, dtype=np.int64)])
        for name, fill in (("_count", 0.0), ("_sum", 0.0), ("_min", np.nan), ("_max", np.nan), ("_counts", 0.0)):
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.full_like(a, fill)]))

    # ---- the stream ------------------------------------------------------------------------------------------

    def add(self, b: InterpretedBatch, series: np.ndarray, partition: int, offset: int) -> list[str]:
        """Accumulate one message's rows (``series``: each row's series index); returns the lines of the minutes
        this message completed."""
        if not len(b):
            return []
        verdict = np.fromiter(
            (2 if v is Verdict.ANOMALOUS else 1 if v is Verdict.UNUSUAL else 0 for v in b.verdict), np.int8, len(b)
        )
        return self.add_values(b.ts_ns, rollup_values(b), b.metrics[:, _MASK], verdict, series, partition, offset)

    def add_values(
        self,
        ts_ns: np.ndarray,
        values: np.ndarray,
        mask: np.ndarray,
        verdict: np.ndarray,
        series: np.ndarray,
        partition: int,
        offset: int,
    ) -> list[str]:
        """:meth:`add` of rows given as arrays: time, ROLLUP_FIELDS values, clocks-event mask, verdict (0 normal,
        1 unusual, 2 anomalous) and series per row."""
        if not len(ts_ns):
            return []
        part = self._parts.setdefault(partition, _Partition())
        minute = ts_ns // MINUTE_NS
        part.messages.append((offset, int(minute.max())))
        self._partition[series] = partition
        np.maximum.at(self._last, series, minute)
        lines: list[str] = []
        for m in np.unique(minute).tolist():  # in time order: a message may span minutes (a backlog, a replay)
            if part.open_from is None:
                part.open_from = m
            if part.newest is None or m > part.newest:
                part.newest = m
            if part.newest - part.open_from > LATENESS_MIN:
                lines += self._close_before(partition, part.open_from, part.newest - LATENESS_MIN)
                part.open_from = part.newest - LATENESS_MIN
            rows = minute == m
            if m < part.open_from:
                n = int(rows.sum())
                if part.resumed_from is not None and m < part.resumed_from:
                    self.stats.replayed_rows += n  # re-read after a restart: its minute is written already
                else:
                    self.stats.late_rows += n
                continue
            self._accumulate(series[rows], m % _RING, values[rows], mask[rows], verdict[rows])
        self._prune(part)
        return lines

    def _accumulate(self, s: np.ndarray, k: int, v: np.ndarray, mask: np.ndarray, verdict: np.ndarray) -> None:
        present = ~np.isnan(v)
        has_mask = ~np.isnan(mask)
        throttled = has_mask & ((np.nan_to_num(mask).astype(np.int64) & ~_BENIGN) != 0)
        counts = np.column_stack([np.ones(len(s)), has_mask, throttled, verdict == 1, verdict == 2])
        if len(np.unique(s)) == len(s):
            # one row per series (a message holds one sampling round): plain indexing, 10x cheaper than ufunc.at
            self._count[s, k] += present
            self._sum[s, k] += np.where(present, v, 0.0)
            self._min[s, k] = np.fmin(self._min[s, k], v)
            self._max[s, k] = np.fmax(self._max[s, k], v)
            self._counts[s, k] += counts
            return
        # several rows of a series (a backlog, a replay): ufunc.at applies each row in turn; the ring slot's
        # columns are views, so it writes through
        np.add.at(self._count[:, k], s, present)
        np.add.at(self._sum[:, k], s, np.where(present, v, 0.0))
        np.fmin.at(self._min[:, k], s, v)
        np.fmax.at(self._max[:, k], s, v)
        np.add.at(self._counts[:, k], s, counts)

    def _close(self, partition: int, minute: int) -> list[str]:
        """The lines of one partition's minute, and its ring slot cleared."""
        k = minute % _RING
        rows = np.flatnonzero((self._partition == partition) & (self._counts[:, k, 0] > 0))
        lines = _minute_lines(
            self.measurement,
            [self._tags[s] for s in rows.tolist()],
            minute * 60_000,
            self._count[rows, k],
            self._sum[rows, k],
            self._min[rows, k],
            self._max[rows, k],
            self._counts[rows, k],
        )
        self._count[rows, k] = 0.0
        self._sum[rows, k] = 0.0
        self._min[rows, k] = np.nan
        self._max[rows, k] = np.nan
        self._counts[rows, k] = 0.0
        self.stats.minutes_written += len(rows)
        return lines

    def _close_before(self, partition: int, first: int, end: int) -> list[str]:
        """Close a partition's minutes ``first`` to ``end`` (excluded). Only the ring's minutes can hold rows, so
        a gap of days (a partition quiet for a while, a clock that jumped) costs the ring's few minutes, not one
        step per minute of the gap (walked, 30 days took 4.3 s of the consumer thread)."""
        lines: list[str] = []
        for minute in range(first, min(end, first + _RING)):
            lines += self._close(partition, minute)
        return lines

    def _floor(self, part: _Partition) -> int:
        """The first offset whose rows may be in an open minute (or past the last message seen)."""
        for offset, newest in part.messages:
            if part.open_from is None or newest >= part.open_from:
                return offset
        return part.messages[-1][0] + 1 if part.messages else 0

    def _prune(self, part: _Partition) -> None:
        while part.messages and part.open_from is not None and part.messages[0][1] < part.open_from:
            part.messages.popleft()

    # ---- what a restart needs --------------------------------------------------------------------------------

    def mark(self) -> dict[int, tuple[int, str]]:
        """Per partition: the offset to commit at most (re-read from there after a restart) and the metadata to
        commit with it (the first open minute)."""
        return {
            p: (self._floor(part), f"{_METADATA_PREFIX}{part.open_from}")
            for p, part in self._parts.items()
            if part.open_from is not None and part.messages
        }

    def resume(self, partition: int, metadata: str | None) -> None:
        """Start a partition (assigned to this sink) where its last commit left it."""
        self.forget(partition)
        if metadata and metadata.startswith(_METADATA_PREFIX):
            try:
                minute = int(metadata.removeprefix(_METADATA_PREFIX))
            except ValueError:
                return
            self._parts[partition] = _Partition(open_from=minute, newest=minute, resumed_from=minute)

    def forget(self, partition: int) -> None:
        """Drop a partition's open minutes (revoked: its next owner re-reads them from the committed offset)."""
        self._parts.pop(partition, None)
        rows = np.flatnonzero(self._partition == partition)
        self._count[rows] = 0.0
        self._sum[rows] = 0.0
        self._min[rows] = np.nan
        self._max[rows] = np.nan
        self._counts[rows] = 0.0
        self._partition[rows] = -1

    def close_all(self) -> list[str]:
        """Every open minute's lines (the end of a backfill: nothing more will come)."""
        lines: list[str] = []
        for p, part in self._parts.items():
            if part.open_from is not None and part.newest is not None:
                for m in range(part.open_from, part.newest + 1):
                    lines += self._close(p, m)
                part.open_from = part.newest + 1
            part.messages.clear()
        return lines


def _minute_lines(
    measurement: str,
    tags: list[str],
    ts_ms: int,
    count: np.ndarray,
    total: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    counts: np.ndarray,
) -> list[str]:
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    out = []
    names = ROLLUP_FIELDS
    for i, t in enumerate(tags):
        fields = []
        for j in np.flatnonzero(count[i] > 0).tolist():
            name = names[j]
            fields.append(
                f"{name}_mean={float(mean[i, j])!r},{name}_max={float(high[i, j])!r},"
                f"{name}_min={float(low[i, j])!r},{name}_count={float(count[i, j])!r}"
            )
        _, with_mask, throttled, unusual, anomalous = counts[i].tolist()
        for name, n in (
            ("throttle_samples", with_mask),
            ("throttled_samples", throttled),
            ("verdict_unusual", unusual),
            ("verdict_anomalous", anomalous),
        ):
            if n:
                fields.append(f"{name}={n!r}")
        if fields:
            out.append(f"{measurement},{t} {','.join(fields)} {ts_ms}")
    return out


def rollup_lines(batches: Iterable[InterpretedBatch], series_of: SeriesIndex | None = None) -> list[str]:
    """The 1-minute rollups of a complete history (an import, a backfill): the stream's code over the batches in
    time order, every minute closed at the end."""
    index = series_of or SeriesIndex()
    rollups = MinuteRollups()
    lines: list[str] = []
    for offset, b in enumerate(batches):
        lines += rollups.add(b, index.of(b, rollups), 0, offset)
    return lines + rollups.close_all()


def rollup_rows(
    tags: list[str], ts_ns: np.ndarray, values: np.ndarray, mask: np.ndarray, verdict: np.ndarray
) -> list[str]:
    """The 1-minute rollups of stored rows (a backfill reading the raw bucket back): each row's series tags (the
    ``gpu`` line's), time, ROLLUP_FIELDS values, mask and verdict code; the stream's code, every minute closed at
    the end."""
    rollups = MinuteRollups()
    index: dict[str, int] = {}
    series = np.fromiter(
        (index.get(t) if t in index else index.setdefault(t, rollups.series(t)) for t in tags), np.int64, len(tags)
    )
    order = np.argsort(ts_ns, kind="stable")
    return rollups.add_values(ts_ns[order], values[order], mask[order], verdict[order], series[order], 0, 0) + (
        rollups.close_all()
    )


_SeriesKey = tuple[str, str, str, int, str, str | None]


class SeriesIndex:
    """Series indices per (cluster, node, GPU, index, model, application), with their tag strings; once per
    minute of data, the series quiet for :data:`IDLE_MIN` minutes are released (``MinuteRollups.release``)."""

    def __init__(self) -> None:
        self._index: dict[_SeriesKey, int] = {}
        self._keys: dict[int, _SeriesKey] = {}
        self._swept: int | None = None

    def of(self, b: InterpretedBatch, rollups: MinuteRollups) -> np.ndarray:
        """Each row's series (a new one is registered with ``rollups``)."""
        self._sweep(rollups)
        out = np.empty(len(b), dtype=np.int64)
        get = self._index.get
        for i, key in enumerate(
            zip(
                b.cluster,
                b.node,
                b.gpu_uuid,
                b.gpu_index,
                b.gpu_model,
                (w.application if w else None for w in b.workload),
                strict=True,
            )
        ):
            s = get(key)
            if s is None:
                s = self._index[key] = rollups.series(series_tags(*key))
                self._keys[s] = key
            out[i] = s
        return out

    def _sweep(self, rollups: MinuteRollups) -> None:
        newest = rollups.newest()
        if newest is None or newest == self._swept:
            return
        self._swept = newest
        idle = [s for s in rollups.idle(newest - IDLE_MIN).tolist() if s in self._keys]
        for s in idle:
            del self._index[self._keys.pop(s)]
        rollups.release(np.asarray(idle, dtype=np.int64))
