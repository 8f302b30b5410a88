"""A whole job slowed down: one job-level finding (``job-slowdown``) when every GPU of a job runs slower together.

The straggler rule compares a GPU with its peers; when every GPU of a job slows down at once there is no slower
peer, and the job's own past is the reference. Judged per straggler window (30 s) from what every GPU log holds,
utilization and power (nvidia-smi, dcgm-exporter at 1-60 s), over the job's peer group (processors.detectors
.stragglers):

- *brake*: at least ``SHARE_OF_GPUS`` of the job's GPUs busy (window utilization >= ``BUSY_UTIL``) while the job's
  median power is at most ``BRAKE_RATIO`` of what the job drew in its earlier busy windows (their highest median):
  the same work at a fraction of the power, i.e. clocks held down (a power brake, a facility cap, a lowered limit
  the logs do not carry). A checkpoint dip is not this: in it the GPUs stop computing, their utilization falls too.
  Where the GPUs log an SM clock, it decides: the job's median busy SM clock (a share of each GPU's maximum) at most
  ``CLOCK_RATIO`` of the one it ran at busy before confirms the brake (a warning); a clock above that says the power
  fell with the clocks where they were, i.e. lighter work, and nothing is found.
- *starved*: at least ``SHARE_OF_GPUS`` of the job's GPUs idle (utilization under ``IDLE_UTIL``) in a share of
  their readings between ``STARVE_MIN`` and ``STARVE_MAX`` over the last ``SUSTAIN`` windows (90 s) together, in at
  least ``STRETCHES`` separate idle stretches (an idle reading after a working one): working in fits and starts,
  waiting on input (a data loader, a storage or network stall); judged only for a job whose application is named
  and serves no requests (a server idles between requests). A checkpoint is one contiguous dip, one stretch
  however long it lasts; a job that stopped is idle in every reading (the ``utilization-cliff`` rule's case). The
  share is counted over the span's readings, not window by window: a poller every 10 s reads 3 instants a window,
  and a window of 60% idle seconds reads all idle or all busy in 28% of windows (0.6^3 + 0.4^3), which broke the
  run of three part-idle windows the rule asked before; over 90 s it reads 9.

A dip is judged by how many GPUs share it and how long it lasts: a brake must hold in ``SUSTAIN`` consecutive
windows (90 s), starvation over a span of as many. Checkpoint stalls last about 10-30 s (systemoverflow.com,
"Checkpoint Frequency": "the snapshot stall (10 to 30 seconds of idle GPUs)"; Huawei MindCluster's
resumable-training reference: about 30 s to flush a 3B-parameter model's checkpoint); a stall longer than the
sustain span still fails the brake test (its utilization falls) and the starved test (one stretch). The job must
have run busy for ``WARM`` windows first (its reference, and no start-up loading mistaken for starvation).

Spans are counted in time, not in windows with readings: a poller every 60 s fills every other 30 s window, and
each of its readings stands for its minute (as a sample stands for its interval in ``pipeline/usage.py``), so a
window with readings counts for the windows since the job's previous one, up to ``MAX_STEP`` (counting windows with
readings, the 90 s a brake must hold was 150 s at 60 s sampling, and the warm-up 90 s). A longer gap (the job
silent) breaks the runs and the span: what it did meanwhile is unknown. A span also holds ``MIN_READINGS`` (9)
readings, as many as a 10 s poller's 90 s: at 30 s it grows to 4.5 minutes, at 60 s to 9 (90 s at 30 s held 3
instants, and idle, busy, idle is what a healthy job's data-loading pauses give now and then). The
finding clears after ``CLEAR`` windows without either condition. One finding per job, on the node of the job's
first GPU (``gpu_uuid`` None), naming every GPU of the job. Starvation is a warning (idle in fits and starts, the
job runs slower). A brake the SM clock confirms is a warning; one without a clock logged is info: the same
utilization at a fraction of the power is also what lighter work draws (nanoGPT PR #643's co-located run, one job
declared over its BF16 training at ~690 W and an FP32 SGEMM at ~390 W, both at ~100% utilization; the simulator's
healthy jobs' evaluation phases, 76 times in 95 GPU-days), and utilization and power alone cannot tell a held-back GPU
from a lighter kernel mix. Not while a finding that explains a GPU's slowness holds on one of the job's GPUs (a node's
power cap, thermal throttling: ``EXPLAINS_SLOWNESS``): that finding speaks for it.

The 0.95 clock ratio is the physics of a GPU's power: the dynamic power of CMOS logic is ``C V^2 f`` and across the
DVFS range the voltage falls with the clock, so power falls at most with the cube of the clock (less where the
voltage reaches its floor or static power weighs: then nearly in proportion). The same work at ``BRAKE_RATIO`` (0.75)
of its power therefore runs at a clock of at most 0.75^(1/3) = 0.91 of the one before; a clock within 5% of it
cannot have taken a quarter of the power away. Lighter (memory-bound) kernels draw less power at the same or a
higher clock: the power limit no longer holds the clock down.

The 0.75 power ratio: in nanoGPT PR #643's 8xH100 run (tests/testdata) the busy windows' per-GPU power stays within
686-692 W; a job-wide drop of a quarter is far outside its own variation, and the brake of issue 38's check (45% of
the limit, about 315 W against 690 W) far below the ratio. A slowdown that starts with the job (no earlier busy
window) has no reference and is not seen: a known limit.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from pipeline.events import SERVING, Finding, Severity
from pipeline.kinds import JOB_SLOWDOWN
from processors.classify import named
from processors.detectors.columns import fmt
from processors.detectors.findings import Reporter
from processors.detectors.gpus import Latest
from processors.detectors.jobs import group_job
from processors.episodes import Description
from processors.state import GpuSlots

BUSY_UTIL: Final = 80.0
IDLE_UTIL: Final = 5.0
SHARE_OF_GPUS: Final = 0.75
BRAKE_RATIO: Final = 0.75
CLOCK_RATIO: Final = 0.95
STARVE_MIN: Final = 0.3
STARVE_MAX: Final = 0.9
STRETCHES: Final = 2
#: the most windows one window with readings stands for: a poller every 60 s (the coarsest one supported) leaves one
#: 30 s window empty between two with readings
MAX_STEP: Final = 2
SUSTAIN: Final = 3
#: the readings per GPU (median) a span must hold besides its time: as many as a 10 s poller's 90 s hold, which the
#: rule's shares and their standard error were set for; a 30 s poller's span grows to 4.5 minutes, a 60 s one's to 9
MIN_READINGS: Final = 9
CLEAR: Final = 2
WARM: Final = 2
_BRAKE, _STARVED = 1, 2


@dataclass(slots=True)
class JobPaceState:
    """One job's pace: its reference power (highest busy-window median), how many busy windows it had, and the run of
    consecutive windows of each condition."""

    reference_watts: float = float("nan")
    #: the median busy SM clock (a share of the maximum) of its busy windows, the highest (NaN: none logged)
    reference_clock: float = float("nan")
    busy_windows: int = 0
    #: the newest windows with readings covering SUSTAIN windows of time: per GPU its idle readings, readings and idle
    #: stretches begun, and the windows each stands for
    span: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = field(default_factory=list)
    brake_run: int = 0
    starve_run: int = 0
    quiet: int = 0
    active: bool = False
    last_ns: int = -1  # the end of its latest window with readings


@dataclass(frozen=True, slots=True)
class JobWindow:
    """What one window of a job says: the cause holding (0 none, _BRAKE, _STARVED), whether the finding starts or
    clears, and the numbers behind it."""

    cause: int
    starts: bool
    clears: bool
    gpus: int
    power_watts: float
    reference_watts: float
    utilization: float
    idle_share: float
    seconds: float = field(default=0.0)
    #: the job's median busy SM clock and the one it ran busy at before, shares of the maximum (NaN: not logged)
    clock: float = field(default=float("nan"))
    reference_clock: float = field(default=float("nan"))

    @property
    def clock_confirmed(self) -> bool:
        """A brake whose lowered SM clock the logs show."""
        return not (math.isnan(self.clock) or math.isnan(self.reference_clock))


@dataclass(frozen=True, slots=True)
class Readings:
    """One window of a job, per GPU (NaN: no readings in the window): mean utilization, mean power, share of readings
    idle, readings, idle stretches begun (an idle reading after a working one), mean SM clock of its busy readings as
    a share of its maximum (NaN: none logged)."""

    util: np.ndarray
    power: np.ndarray
    idle: np.ndarray
    rows: np.ndarray
    stretches: np.ndarray
    clock: np.ndarray


def span_idle(
    span: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU over a span of windows (GPUs that joined later padded with none): the share of its readings idle, that
    share less its standard error (``sqrt(p(1-p)/n)``: 9 readings of a job idle 10% of its seconds read 3 idle
    ones 5% of the time; the share a starved job is judged by must stand clear of that), the idle stretches begun,
    and its readings."""
    n = max(len(w[0]) for w in span)
    idle, rows, stretches = (
        np.sum([np.pad(a, (0, n - len(a))) for a in arrays], axis=0)
        for arrays in zip(*((i, r, k) for i, r, k, _steps in span), strict=True)
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        share = idle / rows
        low = share - np.sqrt(share * (1.0 - share) / rows)
        return np.asarray(share), np.asarray(low), np.asarray(stretches), np.asarray(rows)


def _covers(span: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]) -> bool:
    """A span long enough to judge: ``SUSTAIN`` windows of time, and ``MIN_READINGS`` readings of its GPUs (their
    median): at 30 s sampling 90 s hold 3 instants, and idle, busy, idle is what a healthy job's own data-loading
    pauses give now and then (seed 55667's day one at 30 s: three false starvation warnings)."""
    if sum(e[3] for e in span) < SUSTAIN:
        return False
    rows = span_idle(span)[3]
    return bool(np.median(rows[rows > 0]) >= MIN_READINGS) if (rows > 0).any() else False


def pace_step(
    state: JobPaceState, w: Readings, explained: bool = False, steps: int = 1, trains: bool = True
) -> JobWindow:
    """Advance one job by one window of :class:`Readings`, ``steps`` windows after its previous one with readings;
    ``explained``: a finding that slows its GPUs (a power cap, thermal...) holds, so low power is that finding's,
    not a brake of this rule's; ``trains``: its application is named and serves no requests, so idling in fits and
    starts is waiting on its input (a server idles between requests). Pure apart from ``state``, which it updates."""
    util, power = w.util, w.power
    seen = ~np.isnan(util)
    n = int(seen.sum())
    if n < 2:
        return JobWindow(0, False, False, n, np.nan, state.reference_watts, np.nan, np.nan)
    if steps > MAX_STEP:  # the job was silent: its runs and span start again
        state.brake_run, state.starve_run, state.span = 0, 0, []
    steps = min(steps, MAX_STEP)
    span = [
        *state.span,
        (np.where(seen, w.idle * w.rows, 0.0), np.where(seen, w.rows, 0.0), np.where(seen, w.stretches, 0.0), steps),
    ]
    while len(span) > 1 and _covers(span[1:]):
        span.pop(0)
    state.span = span
    share, low, stretches, _rows = span_idle(span)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a window with no power column: an all-NaN median
        busy = np.count_nonzero(util >= BUSY_UTIL) >= SHARE_OF_GPUS * n
        spread = seen & (low >= STARVE_MIN) & (share <= STARVE_MAX) & (stretches >= STRETCHES)
        full = _covers(span)
        fits = full and np.count_nonzero(spread) >= SHARE_OF_GPUS * n
        watts = float(np.nanmedian(power))
        mid_util, mid_idle = float(np.nanmedian(util)), float(np.nanmedian(share[seen]))
        clocked = np.count_nonzero(~np.isnan(w.clock[seen])) >= SHARE_OF_GPUS * n
        clock = float(np.nanmedian(w.clock[seen])) if clocked else np.nan
    ref, ref_clock = state.reference_watts, state.reference_clock
    warm = state.busy_windows >= WARM
    low_power = warm and busy and watts <= BRAKE_RATIO * ref and not explained
    # with a clock on both sides, the clock decides: held down (a brake) or where it was (lighter work)
    clock_known = not (math.isnan(clock) or math.isnan(ref_clock))
    lighter = low_power and clock_known and clock > CLOCK_RATIO * ref_clock
    braked = low_power and not lighter
    starved = warm and fits and trains
    if busy and not low_power and not explained and watts == watts:  # noqa: PLR0124 (NaN test)
        state.reference_watts = watts if ref != ref else max(ref, watts)  # noqa: PLR0124
        state.busy_windows += steps
        if not math.isnan(clock):
            state.reference_clock = clock if math.isnan(ref_clock) else max(ref_clock, clock)
    state.brake_run = state.brake_run + steps if braked else 0
    state.starve_run = state.starve_run + steps if starved else 0
    cause = _BRAKE if state.brake_run >= SUSTAIN else _STARVED if starved else 0
    state.quiet = 0 if (braked or starved) else state.quiet + 1
    starts = bool(cause) and not state.active
    clears = state.active and state.quiet >= CLEAR
    state.active = (state.active or starts) and not clears
    run = state.brake_run if cause == _BRAKE else state.starve_run + SUSTAIN - 1
    known = clock_known and cause == _BRAKE
    return JobWindow(
        cause,
        starts,
        clears,
        n,
        watts,
        ref,
        mid_util,
        mid_idle,
        float(run),
        clock if known else np.nan,
        ref_clock if known else np.nan,
    )


class JobPace:
    """The ``job-slowdown`` finding (see module docstring): fed one window of a job at a time by the straggler
    family, which keeps the per-GPU windows and the jobs' peer groups."""

    names = (JOB_SLOWDOWN,)

    def __init__(self, slots: GpuSlots, report: Reporter, latest: Latest, power_waiting: Callable[[int], bool]) -> None:
        self.slots = slots
        self.report = report
        self.latest = latest
        self.power_waiting = power_waiting
        self._jobs: dict[str, JobPaceState] = {}
        #: per node holding an open finding: its job, the job's GPUs and the numbers last said
        self._open: dict[int, tuple[str, list[int], JobWindow, float]] = {}
        slots.on_free(self._forget)

    def _forget(self, gpus: np.ndarray, nodes: np.ndarray) -> None:
        """A freed lane's node id and slots go to others: its open finding goes unsent (processors.state), and its
        GPUs leave the GPUs another node's finding names."""
        for node in nodes.tolist():
            self._open.pop(node, None)
        freed = set(gpus.tolist())
        for node, (key, members, w, window_s) in list(self._open.items()):
            if freed.intersection(members):
                self._open[node] = (key, [s for s in members if s not in freed], w, window_s)

    def forget_workers(self, key: str, keep: np.ndarray) -> None:
        """Job ``key`` keeps only its GPUs ``keep`` (a mask over its GPUs in the order they joined; the straggler
        family's peer group lost some to a freed lane): its span's per-GPU readings follow."""
        state = self._jobs.get(key)
        if state is not None:
            state.span = [(i[keep[: len(i)]], r[keep[: len(r)]], k[keep[: len(k)]], n) for i, r, k, n in state.span]

    def forget_job(self, key: str) -> None:
        """Job ``key`` 's peer group went with a freed lane: its history goes, and its finding, if one is open (on a
        GPU's node that left the job before the lane's did), closes without a message: no GPU of it is left to
        repeat it for."""
        self._jobs.pop(key, None)
        for node, (open_key, *_rest) in list(self._open.items()):
            if open_key == key:
                if self.report.nodes.is_open(node, JOB_SLOWDOWN):
                    self.report.nodes.close(node, JOB_SLOWDOWN)
                del self._open[node]

    def window(
        self,
        key: str,
        members: list[int],
        ts: int,
        window_s: float,
        readings: Readings,
        out: list[Finding],
    ) -> None:
        """One window of job ``key`` (its GPUs ``members``, in the order of the arrays), ending at ``ts``."""
        state = self._jobs.setdefault(key, JobPaceState())
        # a GPU whose slowness a finding explains (a node's power cap, thermal throttling...), now or over the span
        # a brake is sustained, or whose lowered limit waits for its confirmation: that finding speaks for the job
        since = ts - int((SUSTAIN + 1) * window_s * 1e9)
        explained = bool((self.latest.explained_until[members] >= since).any()) or any(
            self.power_waiting(s) for s in members
        )
        window_ns = int(window_s * 1e9)
        steps = 1 if state.last_ns < 0 else max(1, round((ts - state.last_ns) / window_ns))
        # starvation is a computing job's: a server idles between requests, and a job nobody named may be one (seed
        # 55667's day one at 30 s: a Stable Diffusion server's quiet minutes read as "waits on its input")
        workloads = [w for w in self.latest.workload[members] if w is not None]
        trains = bool(workloads) and all(named(w) and w.application not in SERVING for w in workloads)
        verdict = pace_step(state, readings, explained, steps, trains)
        if verdict.gpus >= 2:
            state.last_ns = ts
        node = int(self.slots.node_of[members[0]])
        if verdict.starts:
            self._open[node] = (key, members, verdict, window_s)
            self.report.node_starts(node, JOB_SLOWDOWN, ts, out)
        elif verdict.clears and node in self._open:
            self.report.node_clears(node, JOB_SLOWDOWN, ts, out)
            del self._open[node]
        elif verdict.cause and node in self._open:
            self._open[node] = (key, members, verdict, window_s)

    def end(self, key: str, ts: int, out: list[Finding]) -> None:
        """The job ended (its last GPU left its peer group): its finding clears, its history goes."""
        self._jobs.pop(key, None)
        for node, (open_key, *_rest) in list(self._open.items()):
            if open_key == key:
                self.report.node_clears(node, JOB_SLOWDOWN, ts, out)
                del self._open[node]

    def describe_node(self, name: str, slots: np.ndarray) -> Description:
        node = int(self.slots.node_of[int(slots[0])])
        key, members, w, window_s = self._open[node]
        group = group_job(key)
        gpus = (
            f"all {w.gpus} GPUs of job {group.split('/', 1)[-1]}"
            if group.startswith("job:")
            else (f"all {w.gpus} GPUs of one job")
        )
        minutes = fmt(w.seconds * window_s / 60, " min", 1)
        severity = Severity.WARNING
        if w.cause == _BRAKE and w.clock_confirmed:
            what = (
                f"job slowdown: {gpus} held back for {minutes} at {fmt(w.utilization, '%')} utilization: SM clock "
                f"{fmt(w.clock * 100, '%')} of max against {fmt(w.reference_clock * 100, '%')} busy before, power "
                f"{fmt(w.power_watts, ' W')}, {fmt(w.power_watts / w.reference_watts * 100, '%')} of the "
                f"{fmt(w.reference_watts, ' W')} the job drew busy before: every GPU's clocks held down together"
            )
            action = (
                "check what holds every GPU's clocks down at once: a power brake or cap of the node, rack or facility, "
                "lowered power limits or application clocks, cooling"
            )
        elif w.cause == _BRAKE:
            what = (
                f"job slowdown: {gpus} held at {fmt(w.power_watts, ' W')} for {minutes} at "
                f"{fmt(w.utilization, '%')} utilization, {fmt(w.power_watts / w.reference_watts * 100, '%')} of the "
                f"{fmt(w.reference_watts, ' W')} the job drew busy before: held back (a power brake or cap) or at "
                "lighter work; utilization and power alone do not tell which"
            )
            action = (
                "if the job's work did not change, check what holds every GPU's clocks down: a power brake or cap of "
                "the node, rack or facility, lowered power limits, cooling (an SM clock or clock-event reasons column "
                "would tell)"
            )
            severity = Severity.INFO
        else:
            what = (
                f"job slowdown: {gpus} idle {fmt(w.idle_share * 100, '%')} of the time, in fits and starts, for "
                f"{minutes} after running busy: the job waits on its input"
            )
            action = "check the job's data loading: storage or network throughput, data-loader workers, CPU"
        gpu_ids = ", ".join(str(self.slots.index(s)) for s in members)
        evidence = {
            "job_gpus": float(w.gpus),
            "power_watts": w.power_watts,
            "reference_power_watts": w.reference_watts,
            "utilization_percent": w.utilization,
            "idle_share": w.idle_share,
            "sustained_s": w.seconds * window_s,
        }
        if w.clock_confirmed:
            evidence |= {"sm_clock_ratio": w.clock, "reference_sm_clock_ratio": w.reference_clock}
        return Description(severity, f"{what} (GPUs {gpu_ids})", action, evidence)
