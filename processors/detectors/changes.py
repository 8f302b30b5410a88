"""Abrupt changes of state that matter: events with evidence, not verdicts.

- ``memory-collapse``: a GPU's memory used falls between two samples, while a job holds it, from a level that means a
  model was loaded (above ``COLLAPSE_FROM_BYTES``, 4 GiB, and ``COLLAPSE_FROM_SHARE``, 5 % of the GPU) to one a process
  holding no model leaves (below ``COLLAPSE_TO_BYTES``, 1 GiB, or ``COLLAPSE_TO_SHARE``, a tenth of what the GPU held
  just before, whichever is larger): 60 GiB to 3 GiB is a collapse, 10 GiB to 2 GiB is not. 4 GiB is several times what
  a process holds with no model (a CUDA context with its libraries' workspaces, 0.3 to 1 GiB) and about what the weights
  of a 2-billion-parameter model take in half precision; the 5 % takes over above 80 GiB, so the level grows with the
  GPU (7 GiB on a 141 GiB GPU). The floor it replaces (10 GiB and a quarter of the GPU) missed 4 of 17 collapses of a
  real Stable Diffusion serving trace on 48 GiB GPUs, each from 10 to 11.5 GiB. 1 GiB is a CUDA context alone; a tenth
  of the level before, because a process that lets a 60 GiB model go keeps its allocator's cached blocks and workspaces,
  a few GiB, while a fall that leaves a fifth (10 GiB to 2 GiB) can be a job freeing its activations between phases. The
  finding says where memory fell to (``memory_after_bytes``, the sample right after the fall), and, apart from it, where
  it is now if it came back. A warning when the GPU's compute processes changed across the fall (a restart: look at why
  the process died), or when a running job lost its model: the same compute processes (the same pids; where only a count
  is reported, as many processes, a display server's counted too) still hold the GPU ``CONFIRM_S`` (60 s) after the
  fall, with no job boundary since, and the application serves no requests (a server unloading a model or scaling in is
  expected). That is seen only later: the finding starts as info and its repeat at that time is the warning. 60 s
  because a process's memory can go a sample before it leaves the process list as it exits (a job's end): at the usual
  10 to 30 s intervals two samples or more must agree. Info otherwise (the process left with its memory while the
  scheduler still holds the GPU, a server let its model go, or no process list says whether the process goes on).
  Not when the same fall ends an open ``memory-leak`` of the GPU: the leak's cleared record tells the fall (the
  process out of memory, killed or restarted), one story in one finding.
- ``utilization-cliff``: a GPU that was busy (utilization averaging over 80 % for 10 minutes) drops under 5 % for
  2 minutes while the same job holds it: the job stopped computing without ending (a hang, a deadlock in its input
  pipeline, a rank waiting for a peer that died). A warning when the GPU's process list shows the same compute
  processes still on it; info when no process list is reported (an imported nvidia-smi log, a context that declares
  the job for the whole file): then a hung job and one that finished its work while its allocation lasts look alike,
  and the finding says so. None when the list shows no compute process left (the job's work ended; the GPU idling
  in its allocation is ``idle-capacity``'s case). Not for serving applications (``pipeline.events.SERVING``): a
  server idles between requests.
- ``phase-shift``: the share of a GPU's time in checkpoints over the last 30 minutes is 5 times (and 20 points
  above) what it was over the job's earlier hours (a job whose checkpoints take 10 times their share is found while
  the last 30 minutes still mix in the old share): checkpoints now take the job's time (a slower file system, a
  bigger model state). Info. A checkpoint is the inferred ``checkpoint`` phase (it needs PCIe tx), or, from power
  alone as nvidia-smi and dcgm-exporter logs carry it, a checkpoint-like dip: the GPU drawing under ``DIP_RATIO`` of
  its recent peak power (the highest, decaying over ``PEAK_TAU_S``) while a job holds it and its utilization stays
  above ``IDLE_UTIL`` (not for serving, nor for an application nobody named: a server's falling demand dips the
  same way): issue 38's job that checkpoints 10 times more often draws a median 150 W
  against 547 W at unchanged utilization. Not a dip while a finding that holds the GPU's power down on its own is
  open on it (:data:`HELD_BACK`: a power brake or cap holds the power, thermal slowdown cuts the clocks, a GPU on a
  downed NVLink or a degraded PCIe link waits for its transfers): its power then says that fault, not a
  checkpoint, and "check the checkpoint path" would claim what the evidence does not hold. Nor while its job waits
  on another of its GPUs (a straggler, or a finding that holds the job back, open on a peer): the peers of a slow
  rank idle in every collective at a fraction of their power, and the slow GPU's finding already names them.

Each is an event: its finding opens when the change is seen and clears ``HOLD_S`` (5 minutes) later, or at once
when the GPU's job ends. Every rule reads only what the row says (memory, utilization, the inferred phase, the
GPU's processes), so it needs no learned baseline and works from the first sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.events import PHASES, Finding, Severity
from pipeline.kinds import BRAKE, CLIFF, COLLAPSE, HBM, NVLINK, PCIE, PHASE_SHIFT, POWER, STRAGGLER, THERMAL
from processors.detectors.columns import S, col, fmt, lt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import GpuView
from processors.detectors.jobs import NO_WORK, Boundaries
from processors.episodes import Description, Episode
from processors.state import GpuSlots, column

_GIB: Final = 2**30
#: a collapse: from above both of these (bytes, share of the GPU's memory) to below the larger of these (bytes,
#: share of the level before); reasons in the module docstring
COLLAPSE_FROM_BYTES: Final = 4 * _GIB
COLLAPSE_FROM_SHARE: Final = 0.05
COLLAPSE_TO_BYTES: Final = _GIB
COLLAPSE_TO_SHARE: Final = 0.10
#: findings that hold a GPU's power down by themselves: no checkpoint-like dip is counted while one is open
HELD_BACK: Final = (BRAKE, POWER, THERMAL, HBM, NVLINK, PCIE)
#: a running job lost its model: its compute processes still hold the GPU this long after the fall
CONFIRM_S: Final = 60.0
#: a cliff: busy (mean utilization above BUSY over BUSY_S) then idle (under IDLE for IDLE_S)
BUSY_UTIL: Final = 80.0
BUSY_S: Final = 600.0
IDLE_UTIL: Final = 5.0
IDLE_S: Final = 120.0
#: a phase shift: the checkpoint share of the last RECENT_S (BUCKETS buckets) against the job's earlier share
RECENT_S: Final = 1800.0
BUCKETS: Final = 6
EARLIER_MIN_S: Final = 3600.0
SHIFT_FACTOR: Final = 5.0
SHIFT_POINTS: Final = 0.20
#: a checkpoint-like dip: power under this share of the GPU's recent peak, which decays with this time constant (a
#: peak from two hours back still counts at 0.37 of its height, so a job whose time goes into dips keeps its reference)
DIP_RATIO: Final = 0.5
PEAK_TAU_S: Final = 7200.0
#: how long an event's finding stays open
HOLD_S: Final = 300.0
_CHECKPOINT: Final = PHASES.index("checkpoint")
_NONE: Final = -1


@dataclass(eq=False)
class _State:
    """Per GPU: the previous memory reading, the busy share (EWMA in data time) and how long it was watched, the idle
    stretch's start and the busy share when it began, the checkpoint seconds and seconds of each bucket of the recent
    window (oldest first) with the bucket being filled and the job's totals, per event whether it may fire (an
    event fires once per occurrence: a condition that still holds after its finding cleared waits until it ends),
    and of a collapse whose job may go on: when it fell and the compute processes then."""

    memory: np.ndarray = column(np.nan)
    busy: np.ndarray = column(0.0)
    busy_seen_s: np.ndarray = column(0.0)
    idle_since: np.ndarray = column(_NONE, dtype=np.int64)
    busy_before_idle: np.ndarray = column(0.0)
    ckpt: np.ndarray = column(0.0, BUCKETS)
    seconds: np.ndarray = column(0.0, BUCKETS)
    bucket: np.ndarray = column(_NONE, dtype=np.int64)
    total_ckpt: np.ndarray = column(0.0)
    total_s: np.ndarray = column(0.0)
    peak_watts: np.ndarray = column(np.nan)
    armed: np.ndarray = column(True, 3)
    fell_at: np.ndarray = column(_NONE, dtype=np.int64)
    fell_procs: np.ndarray = column(0, dtype=np.int64)


def collapses(before: np.ndarray, after: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Per GPU, whether memory used fell from ``before`` to ``after`` bytes as a collapse does, on a GPU of ``total``
    bytes (pure): from a model's level to what a process without one leaves."""
    with np.errstate(invalid="ignore"):
        high = (before > COLLAPSE_FROM_BYTES) & (before > COLLAPSE_FROM_SHARE * total)
        low = after < np.maximum(COLLAPSE_TO_BYTES, COLLAPSE_TO_SHARE * before)
    return np.asarray(high & low)


class Changes:
    """The event findings of abrupt changes (see module docstring)."""

    names = (COLLAPSE, CLIFF, PHASE_SHIFT)

    def __init__(self, slots: GpuSlots, jobs: Boundaries, report: Reporter) -> None:
        self.jobs = jobs
        self.report = report
        self.state = slots.attach(
            _State(ckpt=np.zeros((0, BUCKETS)), seconds=np.zeros((0, BUCKETS)), armed=np.ones((0, 3), dtype=bool))
        )

    def step(
        self,
        g: np.ndarray,
        ts: np.ndarray,
        m: np.ndarray,
        phase: np.ndarray,
        dt_s: np.ndarray,
        allocated: np.ndarray,
        restarted: np.ndarray,
        serving: np.ndarray,
        named: np.ndarray,
        out: list[Finding],
        leak_ended: np.ndarray | None = None,
    ) -> None:
        """One row per GPU ``g``: ``phase`` its phase index, ``dt_s`` seconds since its previous row, ``allocated``
        whether a job holds it, ``restarted`` whether its compute processes changed in this row, ``serving``
        whether it serves requests, ``named`` whether a context source or the classifier names its application,
        ``leak_ended`` whether an open memory leak ended in this row because memory fell (its cleared finding tells
        the fall: not a collapse of its own)."""
        st = self.state
        self._went_on(g, ts, allocated, serving, out)
        used, total = col(m, "memory_used_bytes"), col(m, "memory_total_bytes")
        util = col(m, "utilization_gpu_percent")
        before = st.memory[g]
        collapsed = allocated & collapses(before, used, total)
        told = collapsed & leak_ended if leak_ended is not None else np.zeros(len(g), dtype=bool)
        st.memory[g] = np.where(np.isnan(used), before, used)
        new_job = self.jobs.job_ts[g] > ts - (dt_s * S).astype(np.int64)
        # a GPU no job holds has no busy history to fall from: the next job starts from nothing
        busy = self._busy(g, util, dt_s, new_job | ~allocated)
        idle = ~np.isnan(util) & (util < IDLE_UTIL) & allocated & ~serving
        since = np.where(new_job, _NONE, st.idle_since[g])
        begins = idle & (since == _NONE)
        st.busy_before_idle[g] = np.where(begins, busy, st.busy_before_idle[g])
        st.idle_since[g] = np.where(idle, np.where(begins, ts, since), _NONE)
        cliff = idle & (st.busy_before_idle[g] > 0.8) & (ts - st.idle_since[g] >= IDLE_S * S)
        procs = self.jobs.processes[g]
        cliff &= ~np.isin(procs, NO_WORK[1:])  # a process list without compute processes: the work ended
        # a dip is the job still at work at a fraction of its power; a GPU that idles (a stopped or hung job: the
        # cliff's case) or serves requests (it idles between them) is not in a checkpoint; one whose application
        # nobody named may be a server whose demand fell (seed 44556's day one at 60 s: an unnamed LLM server's
        # evening, its load from 90% to 10%, read as 42% of its time in checkpoints), so its rows are not judged
        dips = self._dips(g, col(m, "power_watts"), dt_s, new_job) & ~lt(util, IDLE_UTIL) & ~serving
        for name in HELD_BACK:
            dips &= ~self.report.gpus.active(g, name)
        dips &= ~self._waiting(g)
        checkpoint = (phase == _CHECKPOINT) | (allocated & dips)
        # only rows of a named application count, either way (a classification that comes and goes must not make
        # the unnamed rows the job's "earlier" time without checkpoints)
        recent, earlier, span = self._checkpoint_shares(g, ts, checkpoint, np.where(named, dt_s, 0.0), new_job)
        shifted = allocated & (span >= EARLIER_MIN_S) & (recent >= SHIFT_FACTOR * earlier)
        shifted &= recent >= earlier + SHIFT_POINTS
        for c, (name, hit) in enumerate(((COLLAPSE, collapsed), (CLIFF, cliff), (PHASE_SHIFT, shifted))):
            fire = hit & st.armed[g, c] & ~self.report.gpus.active(g, name)
            if name == COLLAPSE:
                fire &= ~told
            st.armed[g, c] = ~hit
            for i in np.flatnonzero(fire).tolist():
                detail = {
                    "restarted": float(restarted[i]),
                    "memory_before_bytes": float(before[i]),
                    "memory_after_bytes": float(used[i]),
                    "checkpoint_share_recent": float(recent[i]),
                    "checkpoint_share_earlier": float(earlier[i]),
                    "processes_seen": float(procs[i] != NO_WORK[0]),
                }
                self.report.transition(int(g[i]), name, True, int(ts[i]), out, detail)
        # a collapse the job may go on from: its compute processes, if known, are watched for CONFIRM_S
        fell = collapsed & ~restarted & ~serving & self.report.gpus.active(g, COLLAPSE)
        fell &= st.fell_at[g] == _NONE
        fell &= ~np.isin(procs, NO_WORK) & (self.jobs.job_ts[g] < ts)
        st.fell_at[g[fell]], st.fell_procs[g[fell]] = ts[fell], procs[fell]

    def _waiting(self, g: np.ndarray) -> np.ndarray:
        """Per row, whether its GPU's job waits on one of its GPUs: a finding that holds the job back open on a
        peer (Reporter.waited_on), or a straggler in its job (the straggler's own rows too)."""
        waiting = {peer for peer, _episode in self.report.waited_on()}
        for slot, name, _episode in self.report.gpus.listed():
            if name == STRAGGLER:
                waiting.update((slot, *self.report.peers_of(slot)))
        return np.isin(g, np.fromiter(waiting, dtype=np.int64, count=len(waiting)))

    def _went_on(
        self, g: np.ndarray, ts: np.ndarray, allocated: np.ndarray, serving: np.ndarray, out: list[Finding]
    ) -> None:
        """A collapse's job went on without its model: CONFIRM_S after the fall the same compute processes hold the
        GPU, with no job boundary since and no requests served; its finding is told again, now a warning. Anything
        else in between (a job boundary, other or no processes, the GPU let go, serving, the finding cleared) ends
        the watch."""
        st = self.state
        at = st.fell_at[g]
        watched = at != _NONE
        if not watched.any():
            return
        same = (self.jobs.processes[g] == st.fell_procs[g]) & (self.jobs.job_ts[g] <= at)
        same &= allocated & ~serving & self.report.gpus.active(g, COLLAPSE)
        done = watched & (~same | (ts - at >= CONFIRM_S * S))
        for i in np.flatnonzero(done & same).tolist():
            slot = int(g[i])
            self.report.gpus.get(slot, COLLAPSE).detail["went_on_s"] = float((ts[i] - at[i]) / S)
            self.report.send(slot, COLLAPSE, True, int(ts[i]), out)
        st.fell_at[g[done]] = _NONE

    def _busy(self, g: np.ndarray, util: np.ndarray, dt_s: np.ndarray, reset: np.ndarray) -> np.ndarray:
        """Per GPU, its busy share (EWMA over BUSY_S of utilization above BUSY_UTIL) before this row, 0 until the
        job has been watched that long (and where ``reset`` starts it again: a new job, or none)."""
        st = self.state
        seen = ~np.isnan(util)
        a = 1.0 - np.exp(-dt_s / BUSY_S)
        prior = np.where(st.busy_seen_s[g] >= BUSY_S, st.busy[g], 0.0)
        moved = np.where(seen, st.busy[g] + a * ((util > BUSY_UTIL) - st.busy[g]), st.busy[g])
        st.busy[g] = np.where(reset, 0.0, moved)
        st.busy_seen_s[g] = np.where(reset, 0.0, st.busy_seen_s[g] + np.where(seen, dt_s, 0.0))
        return np.where(reset, 0.0, prior)

    def _dips(self, g: np.ndarray, power: np.ndarray, dt_s: np.ndarray, new_job: np.ndarray) -> np.ndarray:
        """Per GPU, whether this row is a checkpoint-like dip: power under DIP_RATIO of the GPU's recent peak (the
        highest power since its job began, decaying over PEAK_TAU_S); the row then raises the peak."""
        st = self.state
        peak = np.where(new_job, np.nan, st.peak_watts[g] * np.exp(-dt_s / PEAK_TAU_S))
        dip = lt(power, DIP_RATIO * peak)
        st.peak_watts[g] = np.fmax(peak, power)
        return dip

    def _checkpoint_shares(
        self, g: np.ndarray, ts: np.ndarray, checkpoint: np.ndarray, dt_s: np.ndarray, new_job: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per GPU: the share of the recent window in checkpoints, the share of the job's time before it, and how
        long that earlier time is (seconds); ``dt_s`` is what each row counts for (0: a row not judged)."""
        st = self.state
        st.ckpt[g[new_job]], st.seconds[g[new_job]] = 0.0, 0.0
        st.total_ckpt[g[new_job]], st.total_s[g[new_job]] = 0.0, 0.0
        bucket = ts // int(RECENT_S / BUCKETS * S)
        moved = (st.bucket[g] != _NONE) & (bucket > st.bucket[g])
        if moved.any():
            mg = g[moved]
            steps = np.minimum(bucket[moved] - st.bucket[mg], BUCKETS)
            for k in np.unique(steps).tolist():
                rows = mg[steps == k]
                st.ckpt[rows] = np.roll(st.ckpt[rows], -k, axis=1)
                st.seconds[rows] = np.roll(st.seconds[rows], -k, axis=1)
                st.ckpt[rows, BUCKETS - k :] = 0.0
                st.seconds[rows, BUCKETS - k :] = 0.0
        st.bucket[g] = bucket
        ckpt = checkpoint * dt_s
        st.ckpt[g, -1] += ckpt
        st.seconds[g, -1] += dt_s
        st.total_ckpt[g] += ckpt
        st.total_s[g] += dt_s
        recent_s, recent_ckpt = st.seconds[g].sum(axis=1), st.ckpt[g].sum(axis=1)
        span = st.total_s[g] - recent_s
        with np.errstate(invalid="ignore", divide="ignore"):
            recent = np.where(recent_s > 0, recent_ckpt / recent_s, 0.0)
            earlier = np.where(span > 0, (st.total_ckpt[g] - recent_ckpt) / span, 0.0)
        return recent, earlier, span

    def quiet(self, slot: int, name: str, episode: Episode, now_ns: int) -> bool:
        """Whether an event's finding has been open long enough (HOLD_S) to clear."""
        if name not in self.names:
            return False
        return now_ns - episode.since_ns >= HOLD_S * S

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        row, d, nan = gpu.row, episode.detail, math.nan
        used = row.get("memory_used_bytes", nan)
        if name == COLLAPSE:
            return self._collapse(d, used)
        util = row.get("utilization_gpu_percent", nan)
        if name == CLIFF:
            seen = d.get("processes_seen", 1.0) == 1.0
            what = (
                f"utilization cliff: busy for {BUSY_S / 60:.0f}+ min, now {fmt(util, '%')} for {IDLE_S / 60:.0f}+ min "
                + (
                    "while the same job and its compute processes still hold the GPU"
                    if seen
                    else "while its job holds the GPU by its context; no process list is reported, so a hung job "
                    "and one that finished its work look alike"
                )
            )
            action = (
                "check the job: it stopped computing without ending (a hang, a stuck input pipeline, a lost peer)"
                if seen
                else "check whether the job still runs (a hang) or has finished (then nothing to do)"
            )
            severity = Severity.WARNING if seen else Severity.INFO
            return Description(severity, what, action, {"utilization_percent": util, "processes_seen": float(seen)})
        recent, earlier = d.get("checkpoint_share_recent", nan), d.get("checkpoint_share_earlier", nan)
        what = (
            f"phase shift: {fmt(recent * 100, '%')} of the last {RECENT_S / 60:.0f} min in checkpoints or "
            f"checkpoint-like power dips (under {DIP_RATIO:.0%} of the GPU's recent peak), against "
            f"{fmt(earlier * 100, '%', 1)} of the job's earlier time"
        )
        action = "check the checkpoint path (file system throughput) and the size of the job's state"
        return Description(
            Severity.INFO,
            what,
            action,
            {
                "checkpoint_share_recent": recent,
                "checkpoint_share_earlier": earlier,
            },
        )

    @staticmethod
    def _collapse(d: dict[str, float], used: float) -> Description:
        """A collapse told from its episode's detail: where memory fell from and to (the sample right after the
        fall), where it is now if that differs, and what the processes did (see module docstring)."""
        nan = math.nan
        before, after = d.get("memory_before_bytes", nan), d.get("memory_after_bytes", nan)
        restart, went_on = d.get("restarted", 0.0) == 1.0, d.get("went_on_s", nan)
        lost = not restart and not math.isnan(went_on)
        now = f" (now {fmt(used / _GIB, ' GiB', 1)})" if abs(used - after) >= 0.05 * _GIB else ""
        if restart:
            why = "its process restarted"
            action = "find out why the process died (logs, OOM, XIDs around it): the job restarted on this GPU"
        elif lost:
            why = (
                f"the same compute processes still hold it {went_on:.0f} s later, in the same job, serving no "
                "requests: a running job lost its model"
            )
            action = (
                "check the job: it goes on without what it held (an out-of-memory error it caught, a model moved off "
                "the GPU); expected only if it finished its GPU work and goes on without it"
            )
        else:
            why = "the model was unloaded or the process freed its memory"
            action = "expected if the application unloaded its model or scaled in; otherwise check the application"
        what = (
            f"memory collapse: memory used fell from {fmt(before / _GIB, ' GiB', 1)} to "
            f"{fmt(after / _GIB, ' GiB', 1)} between two samples{now} while a job holds the GPU: {why}"
        )
        severity = Severity.WARNING if restart or lost else Severity.INFO
        return Description(
            severity,
            what,
            action,
            {
                "memory_used_bytes": used,
                "memory_before_bytes": before,
                "memory_after_bytes": after,
                "restarted": float(restart),
                "went_on_s": went_on if lost else nan,
            },
        )
