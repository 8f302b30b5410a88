"""Job boundaries per GPU, which several rules need (a power limit set at a job's start is a setting, a new job
starts a new memory history): from the context (a new job id, or a new application) and from the telemetry itself
(new compute processes on the GPU), so the rules work without a context source too.

A *job* boundary is a change of job id (a context source said so); an *application* boundary also counts a change of
the application a context source named, so only the power-cap rule reads it. An application the classifier inferred
is no boundary: it flickers, and a fault flips it (a power supply failing under a job changes the very features it
is inferred from, and a node without context took its own lowered limits for a new job's setting that way: see
``test_power.py``; read as the cause of seed 38833's missed power capping, not confirmed on that seed, and power caps
were still missed on later seeds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.events import METRIC_INDEX, GpuProcess, InterpretedBatch, Workload
from processors.state import GpuSlots, column

_NEVER: Final = -(2**62)
_NO_PROCS: Final = -(2**63)
#: process signatures of a GPU with no compute process known to run: none reported (first), an empty list, a process
#: count of 0
NO_WORK: Final = (_NO_PROCS, hash(()), 0)
#: the start of a straggler peer group's key for a group of a job's GPUs at another time (an import of its history
#: while it runs live: processors.detectors.stragglers), ``at<window index>:<job's key>``; a job's own key starts
#: with ``job:`` or ``ranks:``
GROUP_AT: Final = "at"


def group_job(key: str) -> str:
    """The job's key of a straggler peer group's key."""
    return key.split(":", 1)[1] if key.startswith(GROUP_AT) else key


def process_signature(processes: tuple[GpuProcess, ...] | None, count: float) -> int:
    """Which compute processes use a GPU, as one number: a hash of their pids, else the process count."""
    if processes is not None:
        return hash(tuple(sorted(p.pid for p in processes if p.kind == "compute")))
    return _NO_PROCS if count != count else int(count)  # noqa: PLR0124 (NaN test)


def computing(processes: list[tuple[GpuProcess, ...] | None], counts: np.ndarray) -> np.ndarray:
    """Per row, whether compute processes run on the GPU: from its process list where reported (graphics processes,
    such as a display server, are not work), else from its process count."""
    with np.errstate(invalid="ignore"):
        by_count = counts >= 1
    return np.array(
        [bool(by_count[i]) if p is None else any(x.kind == "compute" for x in p) for i, p in enumerate(processes)],
        dtype=bool,
    ).reshape(len(processes))


@dataclass(eq=False)
class Boundaries:
    """Per GPU: the latest job and application boundaries, and what they are judged against."""

    #: the latest boundary of a job, and of a job or an application
    job_ts: np.ndarray = column(_NEVER, dtype=np.int64)
    app_ts: np.ndarray = column(_NEVER, dtype=np.int64)
    #: codes of the job id and of the application last seen
    code: np.ndarray = column(-1, 2, dtype=np.int64)
    #: the GPU's compute processes as last seen (a hash of their pids; _NO_PROCS: not reported)
    processes: np.ndarray = column(_NO_PROCS, dtype=np.int64)


class Jobs:
    """Job boundaries per GPU (see module docstring)."""

    def __init__(self, slots: GpuSlots) -> None:
        self.at = slots.attach(Boundaries())
        self._codes: dict[str, int] = {}
        self._wl_codes: dict[tuple[str | None, str, bool] | None, tuple[int, int]] = {}

    def context(self, s: np.ndarray, wls: list[Workload | None]) -> tuple[np.ndarray, np.ndarray]:
        """The workloads of rows sorted by (slot, time). Returns, per row, whether it is its GPU's last of the batch,
        and whether its job, and its job or application, differ from the GPU's row before it (or, for its first row,
        from the GPU's last of an earlier batch): the boundaries :meth:`boundaries` applies level by level."""
        codes = np.array([self._codes_of(wl) for wl in wls], dtype=np.int64).reshape(len(s), 2)
        first = np.r_[True, s[1:] != s[:-1]]
        prev = np.where(first[:, None], self.at.code[s], np.vstack([codes[:1], codes[:-1]]))
        changed = (prev >= 0) & (prev != codes)
        changed[:, 1] |= changed[:, 0]
        last: np.ndarray = np.r_[s[1:] != s[:-1], True]
        self.at.code[s[last]] = codes[last]
        return last, changed

    def boundaries(self, g: np.ndarray, ts: np.ndarray, changed: np.ndarray) -> None:
        """The job (column 0) and job-or-application (column 1) boundaries of one level's rows (:meth:`context`):
        applied as the rows are reached, so a batch of many rounds (a replay, a processor catching up) does not
        judge its earlier rows against a job that starts later in it."""
        if changed.any():
            np.maximum.at(self.at.job_ts, g[changed[:, 0]], ts[changed[:, 0]])
            np.maximum.at(self.at.app_ts, g[changed[:, 1]], ts[changed[:, 1]])

    def process_starts(self, b: InterpretedBatch, order: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Per row (``order`` sorts the batch by slot, then time; ``s`` the slots so sorted), whether the GPU's
        compute processes changed to a new, non-empty set (other pids; without a process list, another process count
        above 0): a job start the telemetry shows by itself. Processes going away are not: a job's end restores
        limits (accepted anyway) and its memory falls (which restarts the leak history by itself). Applied level by
        level (:meth:`started`), so a replay batch does not see a start before the row that shows it."""
        counts = b.metrics[order, METRIC_INDEX["process_count"]].tolist()
        sig = np.fromiter(
            (process_signature(b.processes[i], c) for i, c in zip(order.tolist(), counts, strict=True)),
            dtype=np.int64,
            count=len(order),
        )
        first = np.r_[True, s[1:] != s[:-1]]
        prev = np.where(first, self.at.processes[s], np.r_[_NO_PROCS, sig[:-1]])
        known = np.flatnonzero(sig != _NO_PROCS)
        last = known[np.r_[s[known][1:] != s[known][:-1], True]] if len(known) else known
        self.at.processes[s[last]] = sig[last]
        return np.asarray((prev != _NO_PROCS) & (prev != sig) & ~np.isin(sig, NO_WORK))

    def started(self, g: np.ndarray, ts: np.ndarray) -> None:
        """Jobs that the telemetry shows starting on GPUs ``g`` at ``ts``: a job and an application boundary."""
        if len(g):
            np.maximum.at(self.at.job_ts, g, ts)
            np.maximum.at(self.at.app_ts, g, ts)

    def _code(self, key: str) -> int:
        code = self._codes.get(key)
        if code is None:
            code = self._codes[key] = len(self._codes)
        return code

    def _codes_of(self, wl: Workload | None) -> tuple[int, int]:
        key = None if wl is None else (wl.job_id, wl.application, wl.source == "inferred")  # beats the whole record
        codes = self._wl_codes.get(key)
        if codes is None:
            job = "" if wl is None else wl.job_id or ""
            app = "" if wl is None or wl.source == "inferred" else wl.application
            codes = self._wl_codes[key] = (self._code(f"job:{job}"), self._code(f"app:{app}"))
        return codes
