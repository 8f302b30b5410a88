"""Stragglers: which GPUs of one distributed job are persistently slower than their peers.

One pure function over windows (:func:`peer_step`, :func:`scan` for a whole history) serves both the stream (the
:class:`Stragglers` family: per-GPU step-time proxies per 30 s window) and the Alibaba PAI step-time traces
(tests/unit/processors/detectors/test_stragglers.py).

Per window, each worker's step time is compared with the job's median: ``rel`` is how much slower it is
(0.10 = 10% slower) and ``z`` how far that is against the peers' spread, robustly (the median absolute
deviation, scaled to a standard deviation, with a floor of 1% of the median so that identical peers do not
make a tiny difference infinitely significant). Only slower counts: a faster worker is never a straggler.

A worker becomes a straggler by one of three routes:

- *persistent*: over the last ``persist`` windows, its median ``z`` is at least ``z_min`` and its median
  ``rel`` at least ``rel_min``. The median over windows is what tells a real straggler (PAI job 3: two workers
  ~10% slower window after window, well outside a tight peer group) from persistent small per-worker
  differences (job 2: a continuum of speeds, so no worker is far outside the spread) and from a group of
  workers whose lead is within each window's noise (job 1, workers 0-2).
- *sequential*: a CUSUM of its excess over ``cusum_k`` (how much slower counts as evidence at all), fed by the
  windows where it is at least ``rel_fast`` slower and outside the spread (``z_min``), reaches ``cusum_h``: two
  windows for a worker 18% slower, one for 25%, so a clear straggler is named within about a minute, while a
  healthy GPU a few percent slower than its peers for good (a clock or cooling offset) never feeds it.
- *acute*: at least ``rel_acute`` slower (30%) for ``acute`` consecutive windows. A slowdown this large is a
  straggler even when several workers share it and the MAD is wide (PAI job 4: half the workers at 2-4x).

It stays a straggler until neither route has held for ``clear`` consecutive windows (hysteresis), so a
fluctuating straggler is one episode, not many. Hysteresis keeps an episode; it never starts one: a finding starts
only in a window where a route holds (``PeerVerdict.holds``), so a GPU whose slowness had a known cause (a power
cap, thermal throttling) is not named a straggler on the tail of that history once the cause has gone. Jobs with
fewer than ``min_workers`` reporting workers are not judged: with two workers there is no telling which one is the
slow one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from pipeline.config import DetectorSettings
from pipeline.events import Finding, GpuProcess, Severity, Workload
from pipeline.kinds import STRAGGLER
from processors.detectors.columns import REL, S, col, gt, lt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import GpuView, Latest
from processors.detectors.job_pace import JobPace, Readings
from processors.detectors.jobs import GROUP_AT, group_job
from processors.episodes import Description, Episode
from processors.state import GpuSlots, column, grow, take

#: whether a lowered power limit of a GPU is waiting for its confirmation (it explains a slow GPU too)
Waiting = Callable[[int], bool]


@dataclass(frozen=True, slots=True)
class StragglerParams:
    rel_min: float = 0.10
    z_min: float = 3.0
    rel_acute: float = 0.30
    persist: int = 8
    acute: int = 1
    clear: int = 3
    #: the sequential route: windows at least rel_fast slower add their excess over cusum_k until cusum_h
    rel_fast: float = 0.12
    cusum_k: float = 0.06
    cusum_h: float = 0.20
    min_workers: int = 3
    #: two workers have no median to be slower than: the slower one is judged by its excess over the faster one,
    #: this much counting as the robust z's ``z_min`` (0 turns pairs off)
    pair_rel: float = 0.15
    #: the MAD's floor as a fraction of the median
    mad_floor: float = 0.01


@dataclass(slots=True)
class PeerState:
    """Per-worker history of one job: the last ``persist`` windows of rel and z, and the hysteresis state."""

    rel: np.ndarray = column(np.nan)  # (workers, persist), NaN where a window is missing
    z: np.ndarray = column(np.nan)
    acute_run: np.ndarray = column(0, dtype=np.int64)  # consecutive acute windows
    cusum: np.ndarray = column(0.0)  # the sequential route's evidence
    quiet: np.ndarray = column(0, dtype=np.int64)  # consecutive windows without either route
    active: np.ndarray = column(False)
    windows: int = 0

    @classmethod
    def empty(cls, workers: int, params: StragglerParams) -> PeerState:
        state = cls(np.full((0, params.persist), np.nan), np.full((0, params.persist), np.nan))
        grow(state, workers)
        return state

    def join(self) -> None:
        """One more worker (a GPU that joined the job), whose history starts empty."""
        grow(self, len(self.active) + 1)


@dataclass(frozen=True, slots=True)
class PeerVerdict:
    """The outcome of one window: per worker, whether it is a straggler now (``active``: a route holds in this
    window, ``holds``, or did within the last ``clear`` windows) and the numbers behind it."""

    active: np.ndarray
    rel: np.ndarray
    z: np.ndarray
    median_rel: np.ndarray
    median_z: np.ndarray
    peer_median: float
    holds: np.ndarray
    judged: bool = field(default=True)


def window_scores(step_times: np.ndarray, mad_floor: float = 0.01) -> tuple[np.ndarray, np.ndarray, float]:
    """For one window: each worker's relative excess over the median and its robust z (NaN where missing)."""
    med = float(np.nanmedian(step_times))
    mad = float(np.nanmedian(np.abs(step_times - med)))
    rel = (step_times - med) / med
    z = (step_times - med) / (1.4826 * mad + mad_floor * abs(med))
    return rel, z, med


def pair_scores(step_times: np.ndarray, params: StragglerParams) -> tuple[np.ndarray, np.ndarray, float]:
    """For a window of exactly two workers: each one's excess over the faster one, and that excess on the robust
    z's scale (``pair_rel`` maps to ``z_min``), so the same persistence rules apply."""
    fastest = float(np.nanmin(step_times))
    rel = step_times / fastest - 1.0
    return rel, rel / params.pair_rel * params.z_min, fastest


def peer_step(state: PeerState, step_times: np.ndarray, params: StragglerParams) -> tuple[PeerState, PeerVerdict]:
    """Advance one job by one window of per-worker step times (NaN: the worker did not report)."""
    n = int(np.count_nonzero(~np.isnan(step_times)))
    workers = step_times.shape[0]
    pair = n == 2 and params.pair_rel > 0
    if n < params.min_workers and not pair:
        nan = np.full(workers, np.nan)
        none = np.zeros(workers, dtype=bool)
        return state, PeerVerdict(state.active.copy(), nan, nan, nan, nan, float("nan"), none, judged=False)
    rel, z, med = pair_scores(step_times, params) if pair else window_scores(step_times, params.mad_floor)
    rel_hist = np.roll(state.rel, -1, axis=1)
    z_hist = np.roll(state.z, -1, axis=1)
    rel_hist[:, -1], z_hist[:, -1] = rel, z
    windows = state.windows + 1
    seen = np.count_nonzero(~np.isnan(rel_hist), axis=1)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        # a worker with no windows yet is an all-NaN row: expected, numpy's warning about it is noise here
        warnings.simplefilter("ignore", RuntimeWarning)
        median_rel = np.nanmedian(rel_hist, axis=1)
        median_z = np.nanmedian(z_hist, axis=1)
        # the persistent route needs most of its windows: a straggler is judged on a history, not one window
        persistent = (seen >= max(3, params.persist // 2)) & (median_z >= params.z_min) & (median_rel >= params.rel_min)
        acute_now = rel >= params.rel_acute
        fast = (rel >= params.rel_fast) & (z >= params.z_min)
        # caught up: within half of rel_min of the median in this window (PAI job 3's ~10% stragglers dip under 10%
        # for a window now and then). The persistent route's median remembers the slow windows for half its span:
        # it keeps no episode of a GPU that runs at its peers' pace again
        caught_up = rel < params.rel_min / 2
    acute_run = np.where(acute_now, state.acute_run + 1, 0)
    cusum = np.where(fast, state.cusum + np.minimum(rel, 0.5) - params.cusum_k, 0.0)
    holds = (persistent & ~caught_up) | (acute_run >= params.acute) | (cusum >= params.cusum_h)
    quiet = np.where(holds, 0, state.quiet + 1)
    active = holds | (state.active & (quiet < params.clear))
    new = PeerState(rel_hist, z_hist, acute_run, cusum, quiet, active, windows)
    return new, PeerVerdict(active.copy(), rel, z, median_rel, median_z, med, holds)


def scan(step_times: np.ndarray, params: StragglerParams) -> np.ndarray:
    """Straggler flags for a whole history: ``step_times`` is (workers, windows); returns a bool matrix alike."""
    state = PeerState.empty(step_times.shape[0], params)
    flags = np.zeros(step_times.shape, dtype=bool)
    for k in range(step_times.shape[1]):
        state, verdict = peer_step(state, step_times[:, k], params)
        flags[:, k] = verdict.active
    return flags


# --- the stream: per-GPU windows, peer groups per job, findings ----------------------------------------------------

#: completed windows kept per GPU (a fast-forward batch spans a few windows; judging lags by two)
_RING: Final = 8
#: a GPU above this utilization is busy: only busy rows tell its clock and its power at the job's pace (a GPU that
#: stops for part of a window, as ranks do one after another when a job ends, drew its peers' power while it worked:
#: its window's mean power is no step time)
_BUSY_UTIL: Final = 20.0
#: a row under this utilization is idle (the job-level starvation rule counts them)
_IDLE_UTIL: Final = 5.0
#: a GPU whose window utilization is under this share of its peers' median is not computing their step
WORKING_SHARE: Final = 0.5
#: without an SM clock, a job is judged by power only in windows where its median utilization is at least this
_JOB_BUSY_UTIL: Final = 50.0
#: a GPU joins its job's peer group when that group's newest window is at most this many windows from its row: the
#: judging waits that long for a GPU behind (Stragglers.judge); further apart, the same job's GPUs at another time
#: make a group of their own
_JOIN_WINDOWS: Final = 4
#: the sums of a window per GPU: utilization (sum, rows), busy SM-clock ratio (sum, rows), busy power (sum, rows),
#: idle rows, idle stretches begun (an idle row after a working one: the job-level starvation rule tells fits from one
#: stall)
_SUMS: Final = 8
#: a completed window: its index, mean utilization, busy SM-clock ratio, busy power, share of rows idle, rows, idle
#: stretches begun
_DONE: Final = 7


@dataclass(eq=False)
class _Windows:
    """Per GPU: the straggler window being summed (its index; _SUMS), the last completed ones (oldest first: _DONE)
    and the job group the GPU belongs to."""

    index: np.ndarray = column(-1, dtype=np.int64)
    sums: np.ndarray = column(0.0, _SUMS)
    done: np.ndarray = column(np.nan, _RING, _DONE)
    group: np.ndarray = column(None)
    idle: np.ndarray = column(False)  # whether the GPU's latest row was idle


@dataclass(slots=True)
class _Peers:
    """One job's GPUs (slots, in the order they joined; ``members``: those still in it) and its straggler history."""

    slots: list[int]
    members: set[int]
    state: PeerState
    evaluated: int = -1  # last window index judged
    joined: int = -1  # the window of the newest row a GPU joined with


def job_key(cluster: str, wl: Workload | None) -> str | None:
    """The peer group of a GPU running ``wl``: its job, when a context source names one of two GPUs or more."""
    # GPUs of a node running the same (inferred) application are as often independent replicas or renders, each
    # at its own pace (in the evaluation every straggler found on such a guess was a false alarm): peers are the
    # GPUs of one job, as a context source names it, or as the telemetry shows its ranks (rank_groups)
    if wl is None or wl.job_id is None or wl.source == "inferred" or wl.application in ("idle", "unknown"):
        return None
    if wl.job_gpus is not None and wl.job_gpus < 2:
        return None
    # job ids are unique within one cluster (a scheduler's own sequence), not across clusters
    return f"job:{cluster}/{wl.job_id}"


def rank_groups(
    clusters: list[str], nodes: list[str], processes: list[tuple[GpuProcess, ...] | None]
) -> list[str | None]:
    """Per GPU (rows of one batch, one per GPU): the ranks of one job as the telemetry shows them, when no context
    source names the job: GPUs of one node whose compute processes have the same executable and consecutive pids
    (a launcher such as torchrun or mpirun starts one process per GPU, one after the other). Independent jobs
    started apart have unrelated pids, so they never make a group; a multi-node job is grouped node by node."""
    first: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for i, (cluster, node, procs) in enumerate(zip(clusters, nodes, processes, strict=True)):
        compute = [p for p in procs or () if p.kind == "compute"]
        if len(compute) == 1:
            first.setdefault((cluster, node, compute[0].name), []).append((compute[0].pid, i))
    out: list[str | None] = [None] * len(nodes)
    for (cluster, node, name), ranks in first.items():
        ranks.sort()
        start = 0
        for j in range(1, len(ranks) + 1):
            if j == len(ranks) or ranks[j][0] != ranks[j - 1][0] + 1:
                if j - start >= 2:
                    key = f"ranks:{cluster}/{node}/{name}/{ranks[start][0]}"
                    for _pid, i in ranks[start:j]:
                        out[i] = key
                start = j
    return out


def step_proxy(util: np.ndarray, clock: np.ndarray, power: np.ndarray) -> tuple[np.ndarray, bool]:
    """Per GPU of a job, one window's step-time proxy (NaN: not judged), and whether it was judged by power.

    With an SM clock (most of the working GPUs log one): slower clocks, and a duty cycle below the job's, both
    stretch a step (``1 / (clock x duty)``). Without one (nvidia-smi and dcgm-exporter logs often carry only
    utilization, power and memory): a GPU's power is its work rate at the step's pace, so ``1 / power``, judged
    only in windows where the job computes (median utilization >= 50%): at idle, power says nothing about pace.

    Slowness needs work. A straggler still computes the step its peers compute, only slower, and the peers wait on
    it, so their utilization and power dip with every step it holds back. A GPU under ``WORKING_SHARE`` of its
    peers' median utilization is not computing that step: it waits on them, or does other work (a rank 0 writing a
    checkpoint or logs while ranks 1-7 run at 100%: issue 38's real Llama-3-8B run). Its peers running at full
    pace are the evidence that it holds no one back; it is not judged."""
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        # a window where no peer was busy has an all-NaN median: it is simply not judged
        warnings.simplefilter("ignore", RuntimeWarning)
        peer_util = np.nanmedian(util)
        working = util >= WORKING_SHARE * peer_util
        has_clock = np.count_nonzero(working & ~np.isnan(clock))
        by_power = has_clock * 3 < np.count_nonzero(working) * 2
        if by_power:
            step = np.where(working & (peer_util >= _JOB_BUSY_UTIL), 1.0 / power, np.nan)
            if np.count_nonzero(np.isfinite(step)) == 2:
                # two GPUs wait for each other: both draw less, and power cannot say which one is the slow one
                step[:] = np.nan
        else:
            duty = np.minimum(1.0, util / peer_util)
            step = np.where(working, 1.0 / (clock * duty), np.nan)
            if np.count_nonzero(np.isfinite(step)) == 2:
                # two GPUs wait for each other, so their duty cycles cannot say which one is slow: the clock can
                step = np.where(np.isfinite(step), 1.0 / clock, np.nan)
    step[~np.isfinite(step)] = np.nan
    return step, bool(by_power)


class Stragglers:
    """The straggler finding: each GPU's step-time proxy per window (:func:`step_proxy`) judged against its job's
    peers by :func:`peer_step`, a window once every live GPU of the job is past it. A GPU whose slowness another
    finding explains (thermal, a power cap, its links...) is not reported again. Each window of a job also goes to
    the job-level rule (processors.detectors.job_pace), which needs the same per-GPU windows."""

    names = (STRAGGLER,)

    def __init__(
        self,
        slots: GpuSlots,
        settings: DetectorSettings,
        latest: Latest,
        report: Reporter,
        power_waiting: Waiting,
        pace: JobPace | None = None,
    ) -> None:
        self.slots = slots
        self.settings = settings
        # a GPU 25% slower (issue 38's check: utilization and power x0.8) is named after one full window, 18% after two
        self.params = StragglerParams(acute=2, cusum_h=0.15)
        self.latest = latest
        self.report = report
        self.power_waiting = power_waiting
        self.pace = pace
        self.windows = slots.attach(_Windows())
        self._jobs: dict[str, _Peers] = {}
        self._touched: set[str] = set()
        slots.on_free(self._forget)

    def _forget(self, gpus: np.ndarray, _nodes: np.ndarray) -> None:
        """A freed lane's slots go to other GPUs: they leave every peer group, their history with them (a GPU that
        gets such a slot and joins the job starts afresh, as a new worker), without a message (processors.state);
        a group left with no member goes, its pace with it."""
        freed = set(gpus.tolist())
        for key, peers in list(self._jobs.items()):
            keep = np.array([s not in freed for s in peers.slots], dtype=bool)
            if keep.all():
                continue
            peers.slots = [s for s in peers.slots if s not in freed]
            peers.members -= freed
            take(peers.state, keep)
            if self.pace is not None:
                self.pace.forget_workers(key, keep)
            if not peers.members:
                del self._jobs[key]
                self._touched.discard(key)
                if self.pace is not None:
                    self.pace.forget_job(key)

    def regroup(self, slot: int, ts: int, ranks: str | None, out: list[Finding]) -> None:
        """The GPU's workload is the latest, ``ranks`` its rank group from the telemetry (:func:`rank_groups`). Keep
        the GPU in the peer group of its current job (as its context names it, else as its processes show it, else
        none); a GPU that leaves its job is no longer that job's straggler (its finding clears with the job, not at
        the end of the next job)."""
        group = self.windows.group
        key = job_key(self.slots.key(slot)[0], self.latest.workload[slot]) or ranks
        old = group[slot]
        if key is None and old is None:
            return
        if key is not None and old is not None and group_job(old) == key:
            self._touched.add(old)
            return
        if key is not None:
            key = self._group_at(key, ts)
        group[slot] = key
        self.windows.sums[slot] = 0.0  # the readings of its window so far were its previous job's
        if old is not None and old in self._jobs:
            self._jobs[old].members.discard(slot)
            if not self._jobs[old].members:  # the job ended here: its peer group goes with it
                del self._jobs[old]
                self._touched.discard(old)
                if self.pace is not None:
                    self.pace.end(old, ts, out)
        if self.report.gpus.is_open(slot, STRAGGLER):
            self.report.transition(slot, STRAGGLER, False, ts, out)
        if key is not None:
            peers = self._jobs.get(key)
            if peers is None:
                peers = self._jobs[key] = _Peers([], set(), PeerState.empty(0, self.params))
            if slot not in peers.slots:
                peers.slots.append(slot)
                peers.state.join()
            peers.members.add(slot)
            peers.joined = max(peers.joined, ts // int(self.settings.straggler_window_s * S))
            self._touched.add(key)

    def _group_at(self, job: str, ts: int) -> str:
        """The peer group a GPU of ``job`` joins with a row at ``ts``: the job's group whose GPUs are at that time
        (their newest window within the ``_JOIN_WINDOWS`` the judging waits for), else a new one. The same job's
        GPUs at another time (an import of its history while it runs live, a range imported twice) are no peers of
        these: their windows would never be judged together (issue 37)."""
        win_ns = int(self.settings.straggler_window_s * S)
        idx = ts // win_ns
        for key in (k for k in self._jobs if group_job(k) == job):
            peers = self._jobs[key]
            # a GPU that joined in this batch has no window yet: the row it joined with stands for it
            newest = max(int(self.windows.index[list(peers.members)].max(initial=-1)), peers.joined)
            if abs(newest - idx) <= _JOIN_WINDOWS:
                return key
        return job if job not in self._jobs else f"{GROUP_AT}{idx}:{job}"

    def peers_of(self, slot: int) -> list[int]:
        """The other GPUs of the slot's job as it runs now (its peer group's members), in slot order."""
        key = self.windows.group[slot] if slot < len(self.windows.group) else None
        peers = self._jobs.get(key) if key is not None else None
        return sorted(peers.members - {slot}) if peers is not None else []

    def step(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, rel: np.ndarray) -> None:
        """One row per GPU ``g``: add it to the GPU's current window; a GPU entering a new window closes its
        previous one."""
        w = self.windows
        win_ns = int(self.settings.straggler_window_s * S)
        idx = ts // win_ns
        moved = (w.index[g] >= 0) & (idx > w.index[g])
        if moved.any():
            mg = g[moved]
            sums = w.sums[mg]
            with np.errstate(invalid="ignore", divide="ignore"):
                util = sums[:, 0] / sums[:, 1]
                clock = sums[:, 2] / sums[:, 3]
                power = sums[:, 4] / sums[:, 5]
                idle = sums[:, 6] / sums[:, 1]
            ring = np.roll(w.done[mg], -1, axis=1)
            ring[:, -1] = np.column_stack([w.index[mg], util, clock, power, idle, sums[:, 1], sums[:, 7]])
            w.done[mg] = ring
            w.sums[mg] = 0.0
        w.index[g] = idx
        util = col(m, "utilization_gpu_percent")
        clock = rel[:, REL["sm_clock_ratio_of_max"]]
        power = col(m, "power_watts")
        working = gt(util, _BUSY_UTIL)
        busy = working & ~np.isnan(clock)
        drawing = working & ~np.isnan(power)
        idle = lt(util, _IDLE_UTIL)
        begun = idle & ~w.idle[g]
        w.idle[g] = np.where(np.isnan(util), w.idle[g], idle)
        w.sums[g] += np.column_stack(
            [
                np.nan_to_num(util),
                ~np.isnan(util),
                np.where(busy, clock, 0.0),
                busy,
                np.where(drawing, power, 0.0),
                drawing,
                idle,
                begun,
            ]
        )

    def judge(self, out: list[Finding]) -> None:
        """Judge the jobs seen in this batch, window by window: a window once every live GPU of the job is past it.

        A GPU more than 4 windows behind the job's newest (silent, or its partition lagging in a replay) does not
        hold the others back; its value is simply missing from the windows it has not completed.
        """
        for key in sorted(self._touched):
            peers = self._jobs[key]
            if not peers.members:
                continue
            idx = self.windows.index[list(peers.members)]
            newest = int(idx.max())
            ready = int(idx[idx >= newest - _JOIN_WINDOWS].min()) - 1
            for k in range(max(peers.evaluated + 1, newest - _RING + 1), ready + 1):
                self._judge(key, peers, k, out)
                peers.evaluated = k
        self._touched.clear()

    def _judge(self, key: str, peers: _Peers, k: int, out: list[Finding]) -> None:
        slots = np.array(peers.slots)
        ring = self.windows.done[slots]
        hit = ring[:, :, 0] == k
        found = hit.any(axis=1) & np.array([s in peers.members for s in peers.slots])
        util, clock, power, idle, rows, begun = (
            np.where(found, np.where(hit, ring[:, :, f], 0.0).sum(axis=1), np.nan) for f in range(1, _DONE)
        )
        win_ns = int(self.settings.straggler_window_s * S)
        ts = (k + 1) * win_ns
        if self.pace is not None:
            readings = Readings(util, power, idle, rows, begun, clock)
            self.pace.window(key, peers.slots, ts, self.settings.straggler_window_s, readings, out)
        step, by_power = step_proxy(util, clock, power)
        peers.state, verdict = peer_step(peers.state, step, self.params)
        if not verdict.judged:
            return
        was_all = self.report.gpus.active(slots, STRAGGLER)
        # only GPUs flagged now or before need a decision (most windows: none)
        for i in np.flatnonzero(verdict.active | was_all).tolist():
            slot = peers.slots[i]
            now, was = bool(verdict.active[i]), bool(was_all[i])
            # the history behind the verdict reaches `persist` windows back: a cause active in it explains it
            # (a lowered power limit still waiting for its confirmation explains it too)
            history_ns = ts - self.params.persist * win_ns
            explained = self.latest.explained_until[slot] >= history_ns or self.power_waiting(slot)
            holds = bool(verdict.holds[i]) and np.isfinite(verdict.rel[i])
            # the wording says what the windows where a route held showed; a window that judged the GPU otherwise
            # (caught up, or not judged at all) never overwrites it with its own numbers
            detail = self._detail(verdict, i, step, util, power, by_power) if holds else {}
            if holds and not was and not explained:  # holds: a route, not the hysteresis (active)
                self.report.transition(slot, STRAGGLER, True, ts, out, detail)
            elif was and (not now or explained):
                end = {"now_slower": float(verdict.rel[i])} if np.isfinite(verdict.rel[i]) else {}
                self.report.transition(slot, STRAGGLER, False, ts, out, end)
            elif was:
                self.report.gpus.get(slot, STRAGGLER).detail.update(detail)

    def _detail(
        self, verdict: PeerVerdict, i: int, step: np.ndarray, util: np.ndarray, power: np.ndarray, by_power: bool
    ) -> dict[str, float]:
        """A window's numbers behind a straggler (GPU ``i`` of the job) as its finding keeps them."""
        others = np.isfinite(step)
        others[i] = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            peer_power = float(np.nanmedian(power[others])) if others.any() else float("nan")
            peer_util = float(np.nanmedian(util[others])) if others.any() else float("nan")
        return {
            "slower_than_median": float(verdict.rel[i]),
            "robust_z": float(verdict.z[i]),
            "median_slower": float(verdict.median_rel[i]),
            "peers": float(np.count_nonzero(np.isfinite(step))),
            "window_s": self.settings.straggler_window_s,
            "by_power": float(by_power),
            "power_watts": float(power[i]),
            "peer_power_watts": peer_power,
            "window_utilization_percent": float(util[i]),
            "peer_utilization_percent": peer_util,
        }

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description:
        nan, d = float("nan"), episode.detail
        # every number said here was measured in a window where the straggler's route held (``_detail``): none is
        # unknown; the latest row's values are said only where present
        others = f"{d['peers'] - 1:.0f} peers" if "peers" in d else "peers"
        if d.get("peers") == 2:
            than = "its one peer per step (a 2-GPU job: judged by its SM clock)"
        else:
            than = f"the median of its {others} per step (robust z {d.get('robust_z', nan):.1f})"
        what = f"straggler: {d.get('slower_than_median', nan) * 100:.0f}% slower than {than}"
        if d.get("by_power") == 1.0:
            what += (
                f", judged by power (no SM clock logged): {d.get('power_watts', nan):.0f} W against their "
                f"{d.get('peer_power_watts', nan):.0f} W, busy {d.get('window_utilization_percent', nan):.0f}% "
                f"of the window against their {d.get('peer_utilization_percent', nan):.0f}%"
            )
        else:
            clock = gpu.rel.get("sm_clock_ratio_of_max")
            what += f", SM clock {clock * 100:.0f}% of max" if clock is not None else ""
            util = gpu.row.get("utilization_gpu_percent")  # the row the finding describes
            what += f", util {util:.0f}%" if util is not None else ""
        if "now_slower" in d:
            what += f"; caught up: now {d['now_slower'] * 100:.0f}% from its peers' median"
        action = (
            "the whole job runs at this GPU's pace: check its clocks, cooling and PCIe/NVLink, or move the rank off it"
        )
        return Description(
            Severity.WARNING,
            what,
            action,
            {
                "slower_than_median": d.get("slower_than_median", nan),
                "median_slower": d.get("median_slower", nan),
                "robust_z": d.get("robust_z", nan),
                "peers": d.get("peers", nan),
                "sm_clock_ratio": gpu.rel.get("sm_clock_ratio_of_max", nan),
                "utilization_percent": gpu.row.get("utilization_gpu_percent", nan),
                "power_watts": d.get("power_watts", nan),
                "peer_power_watts": d.get("peer_power_watts", nan),
                "now_slower": d.get("now_slower", nan),
            },
        )
