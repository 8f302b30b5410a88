"""Faults laid over a real healthy trace (``hermeneut evaluate --overlay``): the pure parts.

A real trace (any table the ``table`` importer reads, with its mapping) is read through the import path as rows,
a fault is laid over those rows as it would happen in the world (before sampling), and the result is sampled as a
poller every ``interval_s`` would read it (:func:`resample`). Each fault comes with its ground truth
(:class:`Truth`), written here from the overlay's own parameters, never by a detector's threshold; every class
also has a small version (``quiet``) that must not be reported.

The classes (issue 38, "Faults laid over a real healthy trace"; the magnitudes are the issue's, from its overlays of
an 8xH100 Llama-3-8B nvidia-smi trace):

- ``straggler``: one GPU's utilization and power x0.8 for 4 minutes (quiet: x0.97);
- ``slow-from-start``: one GPU's utilization and power x0.85 from its first sample to its last (quiet: x0.97);
- ``job-power-brake``: every GPU of the job at full utilization, its power held at 45% of its limit, for 4 minutes
  (quiet: 95% of the limit); the limit is the trace's ``power_limit_watts`` where it has one, else the model's
  default limit from the datasheet (:func:`pipeline.catalogue.lookup`);
- ``starvation``: every GPU of the job idle (utilization 0, power at the trace's own idle level, its 5th
  percentile) in 60% of the seconds of a 4-minute window, the same seconds on every GPU (quiet: 5%);
- ``memory-leak``: one GPU's memory grows by 2% of its memory per minute from the window's start to the trace's
  end (quiet: the same growth in one step, then flat: a reload's plateau); needs a memory column;
- ``stops-reporting``: one GPU's rows end at a time in the job's busy span (quiet: one sampling interval missing);
- ``phase-mix``: every GPU of the job dips to 27% of its power (150 W against 547 W, utilization unchanged: the
  checkpoint dips of the issue's Llama trace) for 3 s at a time, 3% of the busy time before the change and 10x as
  much (30%) after it (quiet: 1.5x).

A fault shorter than its class's duration is laid where the trace is shorter: every window is cut to two thirds of
the job's busy span (:func:`busy_span`), so that two placements per GPU (and four per job) differ.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from pipeline import registry
from pipeline.catalogue import lookup
from pipeline.config import Settings
from producers.importers.rows import Rows, series_codes

_S: Final = 1_000_000_000
UTIL: Final = "utilization_gpu_percent"
POWER: Final = "power_watts"
MEMORY: Final = "memory_used_bytes"

#: the classes in the order they are reported
CLASSES: Final = (
    "straggler",
    "slow-from-start",
    "job-power-brake",
    "starvation",
    "memory-leak",
    "stops-reporting",
    "phase-mix",
)
#: the columns each class changes (a class whose columns the trace lacks is invisible, not missed)
NEEDS: Final[dict[str, tuple[str, ...]]] = {
    "straggler": (UTIL, POWER),
    "slow-from-start": (UTIL, POWER),
    "job-power-brake": (UTIL, POWER),
    "starvation": (UTIL, POWER),
    "memory-leak": (MEMORY,),
    "stops-reporting": (),
    "phase-mix": (POWER,),
}
#: the issue's magnitudes (see the module docstring); the second of each pair is the quiet version's
FACTOR: Final[dict[str, tuple[float, float]]] = {
    "straggler": (0.8, 0.97),
    "slow-from-start": (0.85, 0.97),
    "job-power-brake": (0.45, 0.95),
    "starvation": (0.6, 0.05),
    "memory-leak": (0.02, 0.02),
    "stops-reporting": (0.0, 0.0),
    "phase-mix": (10.0, 1.5),
}
#: 4 minutes: the issue's straggler, brake and starvation windows
WINDOW_S: Final = 240.0
#: checkpoint dips (phase-mix): 150 W against 547 W at the same utilization (the issue's Llama-3-8B trace), 3 s each
DIP_POWER: Final = 150.0 / 547.0
DIP_S: Final = 3.0
BASE_DIP_SHARE: Final = 0.03
#: a job is busy where the median of its GPUs' utilization is at least half (the busy span of the trace)
BUSY_UTIL: Final = 50.0


@dataclass(frozen=True, slots=True)
class Truth:
    """One fault laid over the trace: what, where (one GPU, or the whole job: ``gpu_uuid`` None), when, how strong.

    ``factor`` is in the class's own unit: the multiplier of utilization and power (straggler, slow-from-start),
    the share of the power limit held (job-power-brake), the share of idle seconds (starvation), the growth per
    minute as a share of the GPU's memory (memory-leak), the ratio of dip time after the change to before it
    (phase-mix). ``level`` is the watts held (brake), the idle watts (starvation), the GPU's memory in bytes (leak).
    """

    cls: str
    quiet: bool
    gpu_uuid: str | None
    job: str
    start_ns: int
    end_ns: int
    factor: float
    level: float = math.nan
    seed: int = 0

    @property
    def detail(self) -> str:
        where = f"GPU {self.gpu_uuid}" if self.gpu_uuid else f"job {self.job}"
        size = "quiet" if self.quiet else "fault"
        return f"{size} {self.cls} x{self.factor:g} on {where}, {(self.end_ns - self.start_ns) / _S:.0f} s"

    def slower_pct(self) -> tuple[float, ...]:
        """What a true wording may call this GPU's slowness in percent: more time per step (1/f - 1) or less work
        per second (1 - f); empty for classes that are not a slow GPU."""
        if self.cls not in ("straggler", "slow-from-start"):
            return ()
        return (100.0 * (1.0 / self.factor - 1.0), 100.0 * (1.0 - self.factor))


@dataclass(frozen=True, slots=True)
class Trace:
    """A real trace as the table importer reads it (rows, time-ordered), and what it is."""

    rows: Rows
    job: str
    label: str

    @property
    def gpus(self) -> list[str]:
        return list(dict.fromkeys(self.rows.gpu_uuid))

    @property
    def columns(self) -> set[str]:
        return {k for k, v in self.rows.metrics.items() if np.isfinite(v).any()}

    def median_interval_s(self) -> float:
        codes, _ = series_codes(self.rows)
        gaps = [np.diff(np.sort(self.rows.ts_ns[codes == c])) for c in np.unique(codes)]
        joined = np.concatenate(gaps) if gaps else np.empty(0)
        return float(np.median(joined)) / _S if len(joined) else math.nan


def read_trace(path: Path, mapping: Path, cluster: str = "overlay") -> Trace:
    """Read a trace through the ``table`` importer (as ``hermeneut import table`` reads it), in time order."""
    importer = registry.create("importer", "table", Settings(cluster=cluster), paths=(path,), mapping=mapping)
    importer.open()
    try:
        parts = [b.rows for b in importer.blocks() if len(b.rows)]
    finally:
        importer.close()
    if not parts:
        raise ValueError(f"{path}: no readable rows")
    rows = _concat(parts)
    rows = rows.take(np.argsort(rows.ts_ns, kind="stable"))
    jobs = {w.job_id for w in rows.workload or () if w is not None and w.job_id}
    return Trace(rows, ",".join(sorted(jobs)) or "(no job)", path.name)


def _concat(parts: list[Rows]) -> Rows:
    if len(parts) == 1:
        return parts[0]
    names = dict.fromkeys(k for p in parts for k in p.metrics)
    nan = np.full(0, np.nan)
    workload = None if any(p.workload is None for p in parts) else sum((p.workload or () for p in parts), ())
    return Rows(
        node=sum((p.node for p in parts), ()),
        gpu_uuid=sum((p.gpu_uuid for p in parts), ()),
        gpu_index=sum((p.gpu_index for p in parts), ()),
        gpu_model=sum((p.gpu_model for p in parts), ()),
        ts_ns=np.concatenate([p.ts_ns for p in parts]),
        metrics={k: np.concatenate([p.metrics.get(k, np.resize(nan, len(p))) for p in parts]) for k in names},
        origin=sum((p.origin for p in parts), ()),
        original=sum((p.original for p in parts), ()),
        workload=workload,
        events=sum((p.events for p in parts), ()),
    )


def resample(rows: Rows, interval_s: float) -> Rows:
    """The rows a poller every ``interval_s`` would read: at each tick (from the first timestamp on), per GPU, its
    newest reading at or before the tick and after the previous one, stamped with the tick; a GPU with no reading in
    a tick's interval has no row at that tick."""
    dt = round(interval_s * _S)
    t0, t1 = int(rows.ts_ns.min()), int(rows.ts_ns.max())
    ticks = np.arange(t0, t1 + 1, dt, dtype=np.int64)
    codes, _ = series_codes(rows)
    picked: list[np.ndarray] = []
    stamps: list[np.ndarray] = []
    for c in np.unique(codes):
        mine = np.flatnonzero(codes == c)
        mine = mine[np.argsort(rows.ts_ns[mine], kind="stable")]
        ts = rows.ts_ns[mine]
        at = np.searchsorted(ts, ticks, side="right") - 1
        ok = at >= 0
        ok[ok] = ts[at[ok]] > ticks[ok] - dt
        picked.append(mine[at[ok]])
        stamps.append(ticks[ok])
    index, stamp = np.concatenate(picked), np.concatenate(stamps)
    order = np.lexsort((index, stamp))
    return dataclasses.replace(rows.take(index[order]), ts_ns=stamp[order])


def _busy_seconds(rows: Rows) -> np.ndarray:
    """Per whole second from the trace's first row, whether the median of the GPUs' utilization is at least
    BUSY_UTIL."""
    util = rows.metrics[UTIL]
    sec = (rows.ts_ns - rows.ts_ns.min()) // _S
    busy = np.zeros(int(sec.max()) + 1, dtype=bool)
    for s in np.unique(sec):
        values = util[sec == s]
        values = values[np.isfinite(values)]
        busy[s] = len(values) > 0 and float(np.median(values)) >= BUSY_UTIL
    return busy


def computing_from(rows: Rows) -> int:
    """When the job first computes (the first second of median utilization >= BUSY_UTIL): a GPU slow from its first
    sample shows its pace from then on, whether or not that second starts the longest busy stretch (nanoGPT's
    co-located run computes from its first sample, its longest stretch starts 2.5 minutes later)."""
    busy = _busy_seconds(rows)
    if not busy.any():
        raise ValueError("the trace has no busy stretch (median utilization under 50% throughout)")
    return int(rows.ts_ns.min()) + int(np.argmax(busy)) * _S


def busy_span(rows: Rows) -> tuple[int, int]:
    """The longest stretch of whole seconds in which the median of the GPUs' utilization is at least BUSY_UTIL:
    where the job runs (its start and stop ramps and idle time outside)."""
    busy = _busy_seconds(rows)
    best, run_start, best_span = 0, -1, (0, 0)
    for s, b in enumerate([*busy.tolist(), False]):
        if b and run_start < 0:
            run_start = s
        elif not b and run_start >= 0:
            if s - run_start > best:
                best, best_span = s - run_start, (run_start, s)
            run_start = -1
    if best == 0:
        raise ValueError("the trace has no busy stretch (median utilization under 50% throughout)")
    base = int(rows.ts_ns.min())
    return base + best_span[0] * _S, base + best_span[1] * _S


def power_limit_w(trace: Trace) -> float:
    """The GPUs' power limit: the trace's own column where it has one, else the model's datasheet default."""
    limit = trace.rows.metrics.get("power_limit_watts")
    if limit is not None and np.isfinite(limit).any():
        return float(np.nanmedian(limit))
    spec = lookup(trace.rows.gpu_model[0])
    if spec is None or spec.power_default_watts is None:
        raise ValueError(
            f"no power limit: the trace has no power_limit_watts and {trace.rows.gpu_model[0]!r} is unknown"
        )
    return float(spec.power_default_watts)


def memory_total(trace: Trace) -> float:
    """The GPUs' memory: the trace's own column where it has one, else the model's datasheet size."""
    total = trace.rows.metrics.get("memory_total_bytes")
    if total is not None and np.isfinite(total).any():
        return float(np.nanmedian(total))
    spec = lookup(trace.rows.gpu_model[0])
    return math.nan if spec is None else float(spec.memory_bytes)


def invisible(trace: Trace, interval_s: float) -> dict[str, str]:
    """The classes this trace cannot show, each with why (the columns it lacks, a sampling coarser than asked)."""
    have = trace.columns
    out = {
        c: f"no column {', '.join(n for n in need if n not in have)}"
        for c, need in NEEDS.items()
        if any(n not in have for n in need)
    }
    own = trace.median_interval_s()
    if own > 1.5 * interval_s:
        out = dict.fromkeys(CLASSES, f"the trace samples every {own:g} s, coarser than {interval_s:g} s")
    return out


def plan(trace: Trace, interval_s: float, seed: int = 0) -> list[Truth]:
    """Every fault laid over the trace at this interval, quiet versions included (see the module docstring)."""
    rows, gpus, job = trace.rows, trace.gpus, trace.job
    hidden = invisible(trace, interval_s)
    first, last = int(rows.ts_ns.min()), int(rows.ts_ns.max())
    b0, b1 = busy_span(rows)
    span = b1 - b0
    window = min(int(WINDOW_S * _S), span * 2 // 3)
    gpu_starts, job_starts = np.linspace(b0, b1 - window, 2), np.linspace(b0, b1 - window, 4)
    out: list[Truth] = []

    def add(cls: str, gpu: str | None, start: int, end: int, quiet: bool, level: float = math.nan) -> None:
        if cls not in hidden:
            factor = FACTOR[cls][1 if quiet else 0]
            out.append(Truth(cls, quiet, gpu, job, int(start), int(end), factor, level, seed + len(out)))

    for g in gpus:
        for k, s in enumerate(gpu_starts.tolist()):
            add("straggler", g, s, s + window, False)
            if k == 0:
                add("straggler", g, s, s + window, True)
        add("slow-from-start", g, first, last, False)
        add("slow-from-start", g, first, last, True)
    if "job-power-brake" not in hidden:
        limit = power_limit_w(trace)
        for k, s in enumerate(job_starts.tolist()):
            add("job-power-brake", None, s, s + window, False, FACTOR["job-power-brake"][0] * limit)
            if k in (0, 3):
                add("job-power-brake", None, s, s + window, True, FACTOR["job-power-brake"][1] * limit)
    if "starvation" not in hidden:
        idle_w = float(np.nanpercentile(rows.metrics[POWER], 5))
        for k, s in enumerate(job_starts.tolist()):
            add("starvation", None, s, s + window, False, idle_w)
            if k in (0, 3):
                add("starvation", None, s, s + window, True, idle_w)
    total = memory_total(trace)
    for g in gpus:
        for k, s in enumerate(gpu_starts.tolist()):
            add("memory-leak", g, s, last, False, total)
            if k == 0:
                add("memory-leak", g, s, last, True, total)
    for i, g in enumerate(gpus):
        stop = b0 + int(span * (0.25 + 0.5 * i / max(1, len(gpus) - 1)))
        add("stops-reporting", g, stop, last + int(interval_s * _S), False)
        add("stops-reporting", g, stop, stop + int(interval_s * _S), True)
    for k, frac in enumerate((1 / 3, 1 / 2)):
        change = b0 + int(span * frac)
        add("phase-mix", None, change, b1, False)
        if k == 0:
            add("phase-mix", None, change, b1, True)
    return out


def overlay(rows: Rows, truth: Truth, busy: tuple[int, int]) -> Rows:
    """The trace's rows with ``truth``'s fault laid over them (pure: a new Rows; see the module docstring)."""
    ts = rows.ts_ns
    inside = (ts >= truth.start_ns) & (ts < truth.end_ns)
    on = inside & (np.array(rows.gpu_uuid, dtype=object) == truth.gpu_uuid if truth.gpu_uuid else True)
    metrics = {k: v.copy() for k, v in rows.metrics.items()}
    if truth.cls == "stops-reporting":
        return rows.take(np.flatnonzero(~on))
    if truth.cls in ("straggler", "slow-from-start"):
        for name in (UTIL, POWER):
            metrics[name][on] *= truth.factor
    elif truth.cls == "job-power-brake":
        metrics[UTIL][on] = 100.0
        metrics[POWER][on] = truth.level
    elif truth.cls == "starvation":
        idle = _idle_seconds(ts, truth)
        metrics[UTIL][on & idle] = 0.0
        metrics[POWER][on & idle] = np.minimum(metrics[POWER][on & idle], truth.level)
    elif truth.cls == "memory-leak":
        grown = truth.factor * truth.level / 60.0 * (ts - truth.start_ns) / _S
        if truth.quiet:
            grown = np.full(len(ts), truth.factor * truth.level / 60.0 * (truth.end_ns - truth.start_ns) / _S)
        metrics[MEMORY][on] += grown[on]
    elif truth.cls == "phase-mix":
        dips = _dips(ts, busy[0], truth.start_ns, BASE_DIP_SHARE, truth.seed) | (
            _dips(ts, truth.start_ns, busy[1], BASE_DIP_SHARE * truth.factor, truth.seed + 1)
        )
        metrics[POWER][dips] *= DIP_POWER
    return dataclasses.replace(rows, metrics=metrics)


def _idle_seconds(ts: np.ndarray, truth: Truth) -> np.ndarray:
    """Per row, whether its whole second (counted from the window's start) is one of the idle ones, drawn with
    probability ``truth.factor`` per second from the fault's seed: the same seconds on every GPU."""
    seconds = max(1, (truth.end_ns - truth.start_ns) // _S + 1)
    idle = np.random.default_rng(truth.seed).random(seconds) < truth.factor
    k = np.clip((ts - truth.start_ns) // _S, 0, seconds - 1)
    return np.asarray(idle[k], dtype=bool)


def _dips(ts: np.ndarray, start: int, end: int, share: float, seed: int) -> np.ndarray:
    """Per row, whether it falls in a DIP_S dip between ``start`` and ``end``: one dip per DIP_S / share seconds,
    each at a place drawn within its period, so the dips take ``share`` of the time."""
    period = int(DIP_S / share * _S)
    dip = int(DIP_S * _S)
    n = max(0, (end - start) // period)
    if n == 0:
        return np.zeros(len(ts), dtype=bool)
    offsets = np.random.default_rng(seed).integers(0, period - dip + 1, n)
    begins = start + np.arange(n, dtype=np.int64) * period + offsets
    k = np.searchsorted(begins, ts, side="right") - 1
    return (k >= 0) & (ts < begins[np.clip(k, 0, n - 1)] + dip) & (ts < end)
