"""The fault injector: seeded faults with physically plausible signatures, and their exact ground truth.

What to inject, how often, how long and how strong is the plan (:mod:`producers.simulator.plan`).

A fault only starts where it can show (thermal throttling on a GPU drawing enough power to overheat, NVLink loss
on a GPU exchanging traffic over NVLink, a straggler in a multi-GPU job, ECC where the GPU has ECC...), never on a
GPU or node that already has one, and jobs under a fault keep running until it ends, so each ground-truth record
names a fault whose signature is in the telemetry. Signatures (what the fleet reads from :class:`Effects`):

- thermal-throttling: the GPU's cooling degrades (thermal resistance x2-6, inlet warmer); temperature climbs with
  the thermal time constant to the slowdown threshold, where the GPU's controller lowers clocks (and so power) to
  hold it, with NVML's SW thermal (0x20) and, at the threshold, HW thermal slowdown (0x40) reasons; util stays.
- power-capping (node-level, as after a power-supply failure): the node's GPUs are capped at 50-70 % of the
  highest power limit in force there (the default, or what the operator set: a capped pool, miners' own limits);
  busy GPUs run at the new limit with the SW power cap reason (0x4) and lower clocks.
- nvlink-down: some or all of the GPU's links go inactive, NVLink traffic stops, the same traffic moves to PCIe
  (up to what the link carries), CRC/replay/recovery counters jump; the job's GPUs wait on the slower path.
- pcie-link-degraded: the link retrains at a lower width (x8/x4) or generation while busy; the replay counter
  rises and PCIe throughput is capped at the narrower link.
- memory-leak: memory used grows linearly to ~98.5 % of the usable memory; at the end the process runs out of
  memory and restarts (memory drops and ramps up again).
- straggler: one GPU of a synchronous multi-GPU job runs slower (GPU-side: SM clock x0.6-0.8; host-side: its
  compute duty cycle x0.55-0.8); its peers wait on it every step (periodic dips of SM activity and power).
- xid-storm: XIDs 13/31/43/45 every few seconds; after a 43/45 the application restarts (seconds at idle).
- ecc-uncorrectable: a DBE: ``ecc_uncorrected_total`` increments, XID 48 and NVML's double-bit ECC event; on
  Ampere+ XID 94/95 and a row remap (XID 63, ``row_remap_pending``; 10 %: the remap fails, XID 64 and
  ``row_remap_failure``), on Volta a retired page (``retired_pages_dbe_total``, ``retired_pages_pending``). The job
  dies; the GPU is drained until a reset at the end of the fault.
- fallen-off-bus: XID 79 and a GPU_LOST event, then the GPU's samples stop (the node's others keep reporting);
  its job dies; the GPU is back after the fault.
- power-brake: the board's external power-brake signal holds its SM clock at 30-60 %, with NVML's HW slowdown and
  HW power brake reasons (0x08 | 0x80), the GPU cool (NVSentinel #1666); a synchronous job's peers wait on it.
- row-remap: correctable errors in one row of a GPU's memory: Ampere+ marks the row for remapping
  (``row_remap_correctable_total`` +1, ``row_remap_pending``, XID 63 and NVML's row-remap event), Volta retires the
  page (``retired_pages_sbe_total`` +1, ``retired_pages_pending``, XID 63); the job runs on, the remap waits for the
  GPU's reset at the end of the fault. (A remap that fails comes with an uncorrectable error: ecc-uncorrectable.)
- hbm-thermal: the thermal interface over an HBM GPU's memory stacks degrades: the memory heats (with power) towards
  2-20 C over its max operating temperature, where the driver lowers clocks (SW thermal slowdown, 0x20) to hold it;
  the die stays cool.
- nvlink-crc-storm, pcie-replay-storm, ecc-sbe-storm: a marginal NVLink, PCIe link or HBM stack; the corrected error
  counter (one link's CRC errors, the PCIe replay counter while busy, corrected ECC errors) rises at a rate drawn
  from just above DCGM's limit (``processors.detectors.storms``) to a storm (DCGM #313's 17,700 ECC errors/s); the
  GPU and its job run on.
- pcie-aer-storm: a marginal PCIe link whose errors the port above the GPU sees: ``pcie_aer_correctable_total`` rises
  at a rate drawn from just above DCGM's replay limit (8/min) to 600/min, whatever the load (receiver errors are the
  physical layer's), while the GPU's own replay counter does not move: the case the AER counters exist for (the
  kernel's AER ABI document: an endpoint's errors may be counted at its link partner only). Uncorrectable AER errors
  are not injected.

Healthy GPUs also accumulate the rare counter increments real ones do (corrected ECC on some "weak" GPUs, the
odd PCIe replay or NVLink CRC error) and, when events are on, an occasional single application XID (13/31), whose
ground truth is a record of its own (``xid``: an event, not a fault).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from pipeline.events import EventKind, FaultRecord, GpuEvent
from pipeline.kinds import (
    BRAKE,
    ECC,
    FAULTS,
    HBM,
    LEAK,
    LOST_BUS,
    NVLINK,
    NVLINK_CRC,
    PCIE,
    PCIE_AER,
    PCIE_REPLAY,
    POWER,
    REMAP,
    SBE,
    STORM,
    STRAGGLER,
    THERMAL,
    XID,
)
from producers.simulator.effects import Effects, GpuView, Now
from producers.simulator.plan import TRACE_CLASSES, FaultPlan, Injection
from producers.simulator.profiles import APP_INDEX, BUSY_APPS, L_NVLINK, PROFILES, SYNC_APPS
from producers.simulator.scheduler import Scheduler

_MIB = 2**20
_DAY_S = 86_400.0
#: the ground-truth name of a single benign XID (an event the detectors should report, not a fault)
BENIGN_XID: Final = XID
_RETRY_S: Final = 60.0


#: the share of ended jobs torn down with work in flight, whose GPUs log XID 45 (preemptive cleanup). An assumption:
#: no public trace gives the share; NVIDIA's catalogue says 45 follows a killed or crashed application
TEARDOWN_SHARE: Final = 0.2
#: XIDs of an application-level storm and their weights, with the kernel log's wording
STORM_XIDS: Final = ((13, 0.3), (31, 0.3), (43, 0.25), (45, 0.15))
XID_TEXT: Final[dict[int, str]] = {
    13: "Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address",
    31: "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_1c000000. Fault is of type FAULT_PDE",
    43: "GPU stopped processing",
    45: "Preemptive Cleanup, due to previous errors -- Most likely to see when running multiple cuda applications",
    48: "DBE (Double Bit Error) ECC Error",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate",
    64: "Row Remapper: Error when marking a row for remapping",
    79: "GPU has fallen off the bus",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
}
#: the faults an AMD Instinct GPU's source (AMD's device-metrics-exporter, producers.amd.exporter) can show:
#: throttling by cause, temperatures, memory, the PCIe replay and corrected ECC counters. It has no XIDs (AMD
#: reports AFIDs), no power limit of its own (the catalogue's), no PCIe width, NVLink, power brake or row remapping
AMD_SHOWS: Final = frozenset({THERMAL, HBM, LEAK, STRAGGLER, PCIE_REPLAY, SBE})
#: classes whose signature needs the job to keep running
_HOLDS_JOB: Final = frozenset({THERMAL, NVLINK, PCIE, LEAK, STRAGGLER, STORM, BRAKE, PCIE_REPLAY, HBM})


@dataclass
class ActiveFault:
    record: FaultRecord
    node: int
    gpu: int | None
    end_s: float
    peers: list[int] = field(default_factory=list)


@dataclass
class Started:
    detail: str
    peers: list[int] = field(default_factory=list)
    events: list[tuple[int, GpuEvent]] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)


@dataclass
class Round:
    """What one round of the injector produced: new ground truth, (node, event) pairs, GPUs whose job changed."""

    records: list[FaultRecord] = field(default_factory=list)
    events: list[tuple[int, GpuEvent]] = field(default_factory=list)
    changed: list[int] = field(default_factory=list)


class FaultInjector:
    """Starts and ends faults each round and keeps :class:`Effects` current; collects events and ground truth."""

    def __init__(self, plan: FaultPlan, view: GpuView, rng: np.random.Generator, benign_events: bool) -> None:
        self.plan = plan
        self.view = view
        self.rng = rng
        self.benign_events = benign_events
        # a stream of its own, so the teardown XIDs leave every other draw of a seed as it was
        self._teardown_rng = rng.spawn(1)[0]
        n = len(view.uuids)
        self.n = n
        self.effects = Effects(n, int(view.nvlink_count.max()) if n else 0)
        self.active: list[ActiveFault] = []
        self.gpu_fault = np.zeros(n, dtype=bool)  # a fault on the GPU, or it is a peer a fault slows down
        self.node_fault = np.zeros(len(view.nodes), dtype=bool)
        #: attempts that found no eligible target, and quota injections never placed
        self.skipped: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.unplaced: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self._pending = sorted(plan.injections, key=lambda i: i.at_s)
        self._quota = plan.quota_times(rng) if plan.quota else []
        self._node_of = np.arange(n) // view.gpus_per_node
        self._node_starts = np.arange(0, n, view.gpus_per_node)
        self._has_ecc = np.array([k != "" for k in view.ecc], dtype=bool)
        self._busy_apps = np.array([a in BUSY_APPS for a in APP_INDEX])
        self._sync_apps = np.array([a in SYNC_APPS for a in APP_INDEX])
        # thermal faults go where power is steady enough to hold the GPU at its threshold (not request-driven)
        self._steady_busy = np.array([a in BUSY_APPS and PROFILES[a].dynamics == "steady" for a in APP_INDEX])
        self._nvlink_level = np.array(
            [PROFILES[a].phases["compute"][L_NVLINK] if a in PROFILES else 0.0 for a in APP_INDEX]
        )
        e = self.effects
        e.link_exists[:] = np.arange(e.links) < view.nvlink_count[:, None]
        # healthy history: some GPUs carry corrected errors, remapped rows or retired pages from the past
        e.ecc_corrected[:] = np.where(self._has_ecc, rng.poisson(3.0, n), np.nan)
        e.ecc_uncorrected[:] = np.where(self._has_ecc, 0.0, np.nan)
        remap = np.array([k == "remap" for k in view.ecc], dtype=bool)
        e.remap_correctable[:] = np.where(remap, rng.poisson(0.05, n), 0)
        e.retired_sbe[:] = np.where(np.array([k == "retire" for k in view.ecc], dtype=bool), rng.poisson(0.3, n), 0)
        self._weak = (rng.random(n) < 0.03) & self._has_ecc  # weak cells: a corrected error every hour or so
        self._replay_noise = rng.random(n) < 0.05  # marginal links: a PCIe replay and an AER correctable error a day

    # --- per round --------------------------------------------------------------------------------------
    def advance(self, now: Now) -> Round:
        """End due faults, start new ones, tick the running ones."""
        out = Round()
        teardown = list(now.sched.ended)  # the jobs the scheduler ended this round, before a fault kills one
        for due in [f for f in self.active if now.now_s >= f.end_s]:
            self._end(due, now)
        while self._pending and self._pending[0].at_s <= now.now_s:
            injection = self._pending.pop(0)
            self._start(injection.fault, now, out, injection)
        if self.plan.quota:
            self._due_quota(now, out)
        else:
            for fault in self.plan.classes:
                rate = self.plan.rate_per_node_s(fault) * len(self.view.nodes) * now.dt
                for _ in range(int(self.rng.poisson(rate)) if rate > 0 else 0):
                    self._start(fault, now, out, None)
        self._tick(now, out, teardown)
        return out

    def _due_quota(self, now: Now, out: Round) -> None:
        """Place the quota injections that are due; one that finds no target is retried a minute later, until the
        window closes (then it is counted as unplaced)."""
        due = [q for q in self._quota if q[0] <= now.now_s]
        if not due:
            return
        self._quota = self._quota[len(due) :]
        retry = []
        for at_s, fault in due:
            if self._start(fault, now, out, None):
                continue
            if at_s + _RETRY_S < self.plan.quota_window_s[1]:
                retry.append((now.now_s + _RETRY_S, fault))
            else:
                self.unplaced[fault] += 1
        self._quota = sorted(self._quota + retry)

    def _tick(self, now: Now, out: Round, teardown: list[list[int]]) -> None:
        e, rng, n, dt = self.effects, self.rng, self.n, now.dt
        if dt <= 0:
            return
        e.leak_bytes += e.leak_rate * dt
        busy = now.sched.gpu_busy & ~e.lost
        e.pcie_replay += rng.poisson(e.replay_rate * dt * busy + self._replay_noise * dt / _DAY_S)
        e.aer_correctable += rng.poisson((e.aer_rate + self._replay_noise / _DAY_S) * dt)
        ecc = self._has_ecc
        e.ecc_corrected[ecc] += rng.poisson((self._weak[ecc] / 3600.0 + e.sbe_rate[ecc]) * dt)
        if e.links:
            crc = rng.poisson((1 / (3 * _DAY_S) + e.crc_rate) * dt) * (e.link_up & e.link_exists)
            e.nvl_crc += crc
            e.nvl_replay += rng.binomial(crc, 0.02)  # a CRC error is a replayed flit; a few need a second try
        storm = np.flatnonzero(e.xid_interval > 0)
        if len(storm):
            # XIDs come in real time, however seldom the GPU is sampled: a Poisson count over the time since the
            # last round (or the storm's start), each at its own moment in it
            span = np.minimum(dt, now.now_s - e.xid_from_s[storm])
            counts = rng.poisson(span / e.xid_interval[storm])
            for g, k, within in zip(storm.tolist(), counts.tolist(), span.tolist(), strict=True):
                for ago in np.sort(rng.uniform(0.0, within, k))[::-1].tolist():
                    code = _draw_xid(rng)
                    event = self._event(g, now.ts_ns - int(ago * 1e9), EventKind.XID, code)
                    out.events.append((int(self._node_of[g]), event))
                    if code in (43, 45):  # the channel was torn down: the application restarts
                        e.stall_until[g] = now.now_s + rng.uniform(2, 6)
        if self.benign_events:
            # a user's bug now and then: a single application XID on a healthy GPU, about one per 5 GPU-days
            benign = busy & ~self.gpu_fault & (rng.random(n) < dt * 0.2 / _DAY_S) & self.view.nvidia
            for g in np.flatnonzero(benign).tolist():
                code = 13 if rng.random() < 0.5 else 31
                node = int(self._node_of[g])
                out.events.append((node, self._event(g, now.ts_ns, EventKind.XID, code)))
                v = self.view
                out.records.append(
                    FaultRecord(
                        v.cluster,
                        v.nodes[node],
                        v.uuids[g],
                        BENIGN_XID,
                        now.ts_ns,
                        now.ts_ns,
                        f"application XID {code}: a user's bug, not the GPU's",
                    )
                )
            for gpus in teardown:
                self._teardown_xids(gpus, now, out)

    def _teardown_xids(self, gpus: list[int], now: Now, out: Round) -> None:
        """XID 45 (preemptive cleanup) on the GPUs of a job torn down with work in flight (killed, crashed, timed
        out): :data:`TEARDOWN_SHARE` of the ended jobs, 1-12 on each GPU within 6 s, as NVSentinel #1629 saw after a
        crashed job (12 on each GPU within 6 s). Benign: ground truth records one benign XID per GPU."""
        rng, v = self._teardown_rng, self.view
        if rng.random() >= TEARDOWN_SHARE:
            return
        span_ns = int(min(6.0, now.dt) * 1e9)
        for g in gpus:
            if self.gpu_fault[g] or not v.nvidia[g] or self.effects.lost[g]:
                continue
            offsets = np.sort(rng.integers(0, span_ns + 1, int(rng.integers(1, 13))))[::-1]
            for off in offsets.tolist():
                out.events.append((int(self._node_of[g]), self._event(g, now.ts_ns - off, EventKind.XID, 45)))
            first = now.ts_ns - int(offsets[0])
            out.records.append(
                FaultRecord(
                    v.cluster,
                    v.nodes[int(self._node_of[g])],
                    v.uuids[g],
                    BENIGN_XID,
                    first,
                    first,
                    f"{len(offsets)} XID 45 (preemptive cleanup) as its job was torn down: benign",
                )
            )

    # --- starting and ending faults -----------------------------------------------------------------------
    def eligible(self, fault: str, now: Now) -> np.ndarray:
        """Mask of GPUs (or nodes, for power capping) where the fault can start now and show its signature.

        Faults do not meet: a GPU or node already under a fault, and every GPU of a job that has a GPU under a
        fault (or on a power-capped node), is left alone, so each fault's signature stays its own.
        """
        v, e, sched = self.view, self.effects, now.sched
        clean = self._job_clean(sched)
        if fault == POWER:
            hot = (now.busy_power >= 0.5) & sched.gpu_busy & ~e.lost
            busy_nodes = np.add.reduceat(hot.astype(np.int64), self._node_starts) > 0
            tainted = np.add.reduceat((self.gpu_fault | ~clean).astype(np.int64), self._node_starts) > 0
            nvidia = np.logical_and.reduceat(v.nvidia, self._node_starts)
            mask: np.ndarray = busy_nodes & ~tainted & ~self.node_fault & nvidia
            return mask
        free = ~self.gpu_fault & ~self.node_fault[self._node_of] & ~e.lost & clean
        app, busy = sched.gpu_app, sched.gpu_busy
        where: dict[str, np.ndarray] = {
            THERMAL: busy & self._steady_busy[app] & (now.busy_power >= 0.45),
            HBM: busy & self._steady_busy[app] & (now.busy_power >= 0.45) & ~np.isnan(v.memory_max_c),
            NVLINK: v.has_nvlink & sched.multi & (self._nvlink_level[app] > 0),
            PCIE: busy & self._busy_apps[app],
            LEAK: (sched.gpu_job >= 0) & (now.memory_frac < 0.7),
            STRAGGLER: sched.multi & self._sync_apps[app],
            STORM: busy,
            ECC: self._has_ecc,
            BRAKE: busy & self._busy_apps[app],
            NVLINK_CRC: v.has_nvlink,
            PCIE_REPLAY: busy & self._busy_apps[app],
            SBE: self._has_ecc,
            REMAP: self._has_ecc,
        }
        out: np.ndarray = free & where[fault] if fault in where else free  # fallen-off-bus, pcie-aer-storm: any GPU
        return out if fault in AMD_SHOWS else out & v.nvidia

    def _job_clean(self, sched: Scheduler) -> np.ndarray:
        """GPUs without a job, or whose job has no GPU under a fault or on a power-capped node."""
        jobs = sched.gpu_job
        touched = (self.gpu_fault | self.node_fault[self._node_of]) & (jobs >= 0)
        mask: np.ndarray = (jobs < 0) | ~np.isin(jobs, np.unique(jobs[touched]))
        return mask

    def _start(self, fault: str, now: Now, out: Round, inj: Injection | None) -> bool:
        """Start a fault (at the injection's target, else an eligible one); False when there is none."""
        v, rng = self.view, self.rng
        node_level = fault in TRACE_CLASSES and TRACE_CLASSES[fault].scope == "node"
        mask = self.eligible(fault, now)
        if inj is not None and inj.node is not None:
            target = inj.node if node_level else inj.node * v.gpus_per_node + (inj.gpu or 0)
            if not mask[target]:
                self.skipped[fault] += 1
                return False
        else:
            candidates = np.flatnonzero(mask)
            if not len(candidates):
                self.skipped[fault] += 1
                return False
            if not node_level and self.plan.compound and rng.random() < self.plan.compound:
                # a compound fault: another GPU of a node that already has one, where there is such a GPU
                faulty_nodes = np.unique(self._node_of[self.gpu_fault])
                beside = candidates[np.isin(self._node_of[candidates], faulty_nodes)]
                candidates = beside if len(beside) else candidates
            target = int(rng.choice(candidates))
        magnitude = self.plan.magnitude(fault, rng)
        duration = inj.duration_s if inj is not None and inj.duration_s is not None else None
        if duration is None:
            duration = self.plan.draw_duration_s(fault, rng)
        if fault == LEAK and magnitude is not None:
            duration = magnitude * 60.0  # a graded leak runs out of memory after its magnitude in minutes
        started = INJECTORS[fault](self, target, now, duration, magnitude)
        node = target if node_level else int(self._node_of[target])
        gpu = None if node_level else target
        record = FaultRecord(
            v.cluster,
            v.nodes[node],
            None if gpu is None else v.uuids[gpu],
            fault,
            now.ts_ns,
            now.ts_ns + round(duration * 1e9),
            started.detail,
            magnitude,
        )
        self.active.append(ActiveFault(record, node, gpu, now.now_s + duration, started.peers))
        if gpu is None:
            self.node_fault[node] = True
        else:
            self.gpu_fault[[gpu, *started.peers]] = True
            if fault in _HOLDS_JOB:
                now.sched.hold[gpu] = True
        out.records.append(record)
        out.events += started.events
        out.changed += started.changed
        return True

    def _end(self, fault: ActiveFault, now: Now) -> None:
        self.active.remove(fault)
        e, v, sched = self.effects, self.view, now.sched
        name, g = fault.record.fault, fault.gpu
        if g is None:  # power capping: the node's limits come back
            lo = fault.node * v.gpus_per_node
            e.cap_watts[lo : lo + v.gpus_per_node] = np.inf
            self.node_fault[fault.node] = False
            return
        self.gpu_fault[[g, *fault.peers]] = False
        sched.hold[g] = False
        sched.unavailable[g] = False
        if name == THERMAL:
            e.thermal_k[g], e.inlet_add[g] = 1.0, 0.0
        elif name == NVLINK:
            e.link_up[g] = True
            e.nvlink_fallback[g] = False
            e.wait[[g, *fault.peers]] = 0.0
        elif name == PCIE:
            e.gen_cap[g], e.width_cap[g], e.replay_rate[g] = 99.0, 99.0, 0.0
        elif name == LEAK:
            # out of memory: the process dies and its supervisor restarts it
            e.leak_rate[g], e.leak_bytes[g] = 0.0, 0.0
            e.restarted_at[g] = now.now_s
            e.stall_until[g] = now.now_s + self.rng.uniform(10, 30)
        elif name == STRAGGLER:
            e.clock_factor[g], e.duty[g] = 1.0, 1.0
            e.wait[fault.peers] = 0.0
        elif name == STORM:
            e.xid_interval[g] = 0.0
        elif name in (ECC, REMAP):
            # the GPU reset applied the remap (or retired the page)
            e.remap_pending[g], e.retired_pending[g], e.remap_failure[g] = 0.0, 0.0, 0.0
        elif name == LOST_BUS:
            e.lost[g] = False
        elif name == HBM:
            e.hbm_add[g] = 0.0
        elif name == BRAKE:
            e.brake[g], e.clock_factor[g] = False, 1.0
            e.wait[fault.peers] = 0.0
        elif name == NVLINK_CRC:
            e.crc_rate[g] = 0.0
        elif name == PCIE_REPLAY:
            e.replay_rate[g] = 0.0
        elif name == SBE:
            e.sbe_rate[g] = 0.0
        elif name == PCIE_AER:
            e.aer_rate[g] = 0.0

    # one starter per class: (target GPU or node, now, duration) -> what happened
    def _start_thermal_throttling(self, g: int, now: Now, _duration: float, magnitude: float | None) -> Started:
        v, e, rng = self.view, self.effects, self.rng
        add = float(rng.uniform(3, 8))
        rise = v.thermal_rise_c[g] * max(0.8 * float(now.busy_power[g]), 0.3)
        # cooling degrades enough that the equilibrium lies above the slowdown threshold (12 C unless graded)
        over = 12.0 if magnitude is None else magnitude
        need = (v.slowdown_c[g] + over - now.inlet_c[g] - add) / max(rise, 1.0)
        k = float(np.clip(need if magnitude is not None else max(rng.uniform(2.0, 2.6), need), 1.0, 6.0))
        e.thermal_k[g], e.inlet_add[g] = k, add
        return Started(f"cooling degraded (fan/airflow): thermal resistance x{k:.1f}, inlet +{add:.0f} C")

    def _start_power_capping(self, node: int, now: Now, _duration: float, magnitude: float | None) -> Started:
        v, e = self.view, self.effects
        frac = float(self.rng.uniform(0.5, 0.7)) if magnitude is None else magnitude
        gpus = slice(node * v.gpus_per_node, (node + 1) * v.gpus_per_node)
        # one cap for the node, a share of the highest limit in force there (a pool capped by its operator, miners'
        # own limits): a share of the default could sit above every limit in force and change nothing at all
        in_force = float(now.limit_w[gpus].max())
        e.cap_watts[gpus] = np.maximum(np.round(in_force * frac), v.min_watts[gpus])
        watts = float(e.cap_watts[node * v.gpus_per_node])
        return Started(
            f"power supply failure: GPU power limit lowered to {watts:.0f} W ({frac:.0%} of the {in_force:.0f} W in "
            f"force; default {v.default_watts[node * v.gpus_per_node]:.0f} W)"
        )

    def _start_nvlink_down(self, g: int, now: Now, _duration: float, magnitude: float | None) -> Started:
        v, e, rng = self.view, self.effects, self.rng
        count = int(v.nvlink_count[g])
        if magnitude is not None:
            down = int(np.clip(math.ceil(magnitude * count), 1, count))
        else:
            down = count if count == 1 or rng.random() < 0.6 else int(rng.integers(1, count))
        which = rng.choice(count, size=down, replace=False)
        e.link_up[g, which] = False
        e.nvlink_fallback[g] = True
        e.nvl_crc[g, which] += rng.poisson(200, down)
        e.nvl_replay[g, which] += rng.poisson(20, down)
        e.nvl_recovery[g, which] += rng.integers(1, 4, down)
        peers = self._peers(g, now.sched)
        # the job's traffic to this GPU now crosses PCIe: every GPU of the job waits for the slower path
        wanted = self._nvlink_level[now.sched.gpu_app[g]] * v.nvlink_bytes_per_s[g]
        wait = float(np.clip(1 - 0.85 * v.pcie_bytes_per_s[g] / max(wanted, 1.0), 0.1, 0.6))
        self._wait([g, *peers], wait)
        return Started(
            f"{down} of {count} NVLinks inactive: peer traffic falls back to PCIe, job waits ~{wait:.0%}", peers
        )

    def _start_pcie_link_degraded(self, g: int, _now: Now, _duration: float, magnitude: float | None) -> Started:
        v, e, rng = self.view, self.effects, self.rng
        gen, width = int(v.gen_max[g]), int(v.width_max[g])
        # bandwidth lost -> the link's width divided by 2/4/8, or its generation lowered by 1/2 (each halves it)
        graded = None if magnitude is None else max(1, round(-math.log2(1.0 - magnitude)))
        if rng.random() < 0.7 or gen <= 1:
            e.width_cap[g] = max(1, width >> (graded or int(rng.choice([1, 2]))))
        else:
            e.gen_cap[g] = max(1, gen - min(graded or int(rng.integers(1, 3)), 2))
        e.replay_rate[g] = float(rng.uniform(0.5, 20))
        got = f"Gen{int(min(gen, e.gen_cap[g]))} x{int(min(width, e.width_cap[g]))}"
        return Started(f"PCIe link trained at {got} (max Gen{gen} x{width}), replays ~{e.replay_rate[g]:.0f}/s")

    def _start_memory_leak(self, g: int, now: Now, duration: float, _magnitude: float | None) -> Started:
        e, v = self.effects, self.view
        # leak so that memory nears the top when the fault ends: that is when the process runs out of memory
        top = 0.985 * v.usable_bytes[g]
        rate = max(top - now.memory_frac[g] * v.usable_bytes[g], 0.0) / duration
        e.leak_rate[g], e.leak_bytes[g] = rate, 0.0
        return Started(f"memory leak of {rate / _MIB:.1f} MiB/s until the process runs out of memory")

    def _start_straggler(self, g: int, now: Now, _duration: float, magnitude: float | None) -> Started:
        e, rng = self.effects, self.rng
        peers = self._peers(g, now.sched)
        if rng.random() < 0.6:
            factor = float(rng.uniform(0.6, 0.8)) if magnitude is None else 1.0 - magnitude
            e.clock_factor[g] = factor
            what = f"GPU-side straggler: SM clock x{factor:.2f}"
        else:
            factor = float(rng.uniform(0.55, 0.8)) if magnitude is None else 1.0 - magnitude
            e.duty[g] = factor
            what = f"host-side straggler: compute duty cycle x{factor:.2f}"
        wait = 1 - factor
        self._wait(peers, wait)
        return Started(f"{what}; {len(peers)} peers wait ~{wait:.0%} of each step", peers)

    def _start_xid_storm(self, g: int, now: Now, _duration: float, magnitude: float | None) -> Started:
        interval = float(self.rng.uniform(3, 15)) if magnitude is None else magnitude
        self.effects.xid_interval[g] = interval
        self.effects.xid_from_s[g] = now.now_s
        code = _draw_xid(self.rng)
        event = (int(self._node_of[g]), self._event(g, now.ts_ns, EventKind.XID, code))
        codes = "/".join(str(c) for c, _ in STORM_XIDS)
        return Started(f"XID storm: XIDs {codes} about every {interval:.0f} s", events=[event])

    def _start_ecc_uncorrectable(self, g: int, now: Now, _duration: float, _magnitude: float | None) -> Started:
        v, e, rng = self.view, self.effects, self.rng
        node, ts = int(self._node_of[g]), now.ts_ns
        errors = int(rng.integers(1, 5))
        e.ecc_uncorrected[g] += errors
        events = [
            (node, self._event(g, ts, EventKind.ECC_DOUBLE_BIT, 0, f"{errors} double-bit ECC errors")),
            (node, self._event(g, ts, EventKind.XID, 48)),
        ]
        if v.ecc[g] == "remap":
            events.append((node, self._event(g, ts, EventKind.XID, 94 if rng.random() < 0.7 else 95)))
            e.remap_uncorrectable[g] += 1
            if rng.random() < 0.1:
                e.remap_failure[g] = 1
                events.append((node, self._event(g, ts, EventKind.XID, 64)))
                what = "row remap failed: the GPU needs service"
            else:
                e.remap_pending[g] = 1
                events.append((node, self._event(g, ts, EventKind.XID, 63)))
                events.append((node, self._event(g, ts, EventKind.ROW_REMAP, 1, "row remap pending")))
                what = "row remap pending until reset"
        else:
            e.retired_dbe[g] += 1
            e.retired_pending[g] = 1
            events.append((node, self._event(g, ts, EventKind.XID, 63, "ECC page retirement recording event")))
            what = "page retirement pending until reset"
        changed = self._kill(g, now)
        return Started(f"{errors} uncorrectable ECC errors (DBE), {what}; job killed", [], events, changed)

    def _start_row_remap(self, g: int, now: Now, _duration: float, _magnitude: float | None) -> Started:
        v, e = self.view, self.effects
        node, ts = int(self._node_of[g]), now.ts_ns
        if v.ecc[g] == "remap":
            e.remap_correctable[g] += 1
            e.remap_pending[g] = 1
            events = [
                (node, self._event(g, ts, EventKind.XID, 63)),
                (node, self._event(g, ts, EventKind.ROW_REMAP, 1, "row remap pending")),
            ]
            what = "a row remapped for correctable errors, pending until reset"
        else:
            e.retired_sbe[g] += 1
            e.retired_pending[g] = 1
            events = [(node, self._event(g, ts, EventKind.XID, 63, "ECC page retirement recording event"))]
            what = "a page retired for repeated single-bit errors, pending until reset"
        return Started(what, events=events)

    def _start_fallen_off_bus(self, g: int, now: Now, _duration: float, _magnitude: float | None) -> Started:
        node = int(self._node_of[g])
        events = [
            (node, self._event(g, now.ts_ns, EventKind.XID, 79)),
            (node, self._event(g, now.ts_ns, EventKind.GPU_LOST, 0, "NVML: GPU is lost (NVML_ERROR_GPU_IS_LOST)")),
        ]
        self.effects.lost[g] = True
        changed = self._kill(g, now)
        return Started("XID 79: GPU has fallen off the bus; its samples stop until it is back", [], events, changed)

    def _start_hbm_thermal(self, g: int, now: Now, _duration: float, magnitude: float | None) -> Started:
        v, e = self.view, self.effects
        over = float(self.rng.uniform(6, 15)) if magnitude is None else magnitude
        power = max(float(now.busy_power[g]), 0.2)
        die = now.inlet_c[g] + v.thermal_rise_c[g] * max(0.8 * power, 0.3)
        # heat enough that the memory would settle `over` C above its maximum at this power
        e.hbm_add[g] = max(v.memory_max_c[g] + over - (0.7 * die + 21), 1.0) / min(power, 1.0)
        top = float(v.memory_max_c[g])
        return Started(f"HBM thermal interface degraded: memory would settle {over:.0f} C over its {top:.0f} C maximum")

    def _start_power_brake(self, g: int, now: Now, _duration: float, _magnitude: float | None) -> Started:
        e = self.effects
        factor = float(self.rng.uniform(0.3, 0.6))
        e.brake[g], e.clock_factor[g] = True, factor
        peers = self._peers(g, now.sched) if now.sched.multi[g] and self._sync_apps[now.sched.gpu_app[g]] else []
        self._wait(peers, 1 - factor)
        return Started(f"external power brake asserted: SM clock x{factor:.2f}, {len(peers)} peers wait", peers)

    def _start_nvlink_crc_storm(self, g: int, _now: Now, _duration: float, magnitude: float | None) -> Started:
        v, e, rng = self.view, self.effects, self.rng
        rate = float(rng.uniform(500, 20_000)) if magnitude is None else magnitude
        link = int(rng.integers(int(v.nvlink_count[g])))
        e.crc_rate[g, link] = rate
        return Started(f"marginal NVLink {link}: {rate:.0f} CRC errors/s, the link stays up")

    def _start_pcie_replay_storm(self, g: int, _now: Now, _duration: float, magnitude: float | None) -> Started:
        per_min = float(self.rng.uniform(30, 600)) if magnitude is None else magnitude
        self.effects.replay_rate[g] = per_min / 60.0
        return Started(f"marginal PCIe link: {per_min:.0f} replays/min while busy, the link keeps its width")

    def _start_ecc_sbe_storm(self, g: int, _now: Now, _duration: float, magnitude: float | None) -> Started:
        rate = float(self.rng.uniform(100, 20_000)) if magnitude is None else magnitude
        self.effects.sbe_rate[g] = rate
        return Started(f"HBM wearing out: {rate:.0f} corrected (single-bit) ECC errors/s")

    def _start_pcie_aer_storm(self, g: int, _now: Now, _duration: float, magnitude: float | None) -> Started:
        per_min = float(self.rng.uniform(30, 600)) if magnitude is None else magnitude
        self.effects.aer_rate[g] = per_min / 60.0
        return Started(f"marginal PCIe link: {per_min:.0f} AER correctable errors/min at its upstream port, no replays")

    # --- helpers ------------------------------------------------------------------------------------------
    def _wait(self, gpus: list[int], share: float) -> None:
        """A synchronous job's GPUs wait ``share`` of each step for a slow one, deeper every few seconds."""
        self.effects.wait[gpus] = share
        self.effects.wait_period[gpus] = int(self.rng.integers(3, 8))

    def _kill(self, g: int, now: Now) -> list[int]:
        now.sched.unavailable[g] = True
        job = now.sched.job_of(g)
        return now.sched.end(job, now.now_s) if job is not None else []

    @staticmethod
    def _peers(g: int, sched: Scheduler) -> list[int]:
        job = sched.job_of(g)
        return [] if job is None else [p for p in job.gpus if p != g]

    def _event(self, g: int, ts_ns: int, kind: EventKind, code: int, detail: str = "") -> GpuEvent:
        v = self.view
        if kind == EventKind.XID and not detail:
            detail = f"NVRM: Xid: {code}, {XID_TEXT.get(code, 'unknown')}"
        return GpuEvent(
            v.cluster, v.nodes[int(self._node_of[g])], v.uuids[g], g % v.gpus_per_node, ts_ns, kind, code, detail
        )


#: how the simulator starts each fault class of pipeline.kinds.FAULTS (a test holds the two together): the target (a
#: GPU's index, a node's for node-level classes), the round, the duration and the magnitude, to what it changed
INJECTORS: Final[dict[str, Callable[[FaultInjector, int, Now, float, float | None], Started]]] = {
    THERMAL: FaultInjector._start_thermal_throttling,
    POWER: FaultInjector._start_power_capping,
    NVLINK: FaultInjector._start_nvlink_down,
    PCIE: FaultInjector._start_pcie_link_degraded,
    LEAK: FaultInjector._start_memory_leak,
    STRAGGLER: FaultInjector._start_straggler,
    STORM: FaultInjector._start_xid_storm,
    ECC: FaultInjector._start_ecc_uncorrectable,
    REMAP: FaultInjector._start_row_remap,
    LOST_BUS: FaultInjector._start_fallen_off_bus,
    HBM: FaultInjector._start_hbm_thermal,
    BRAKE: FaultInjector._start_power_brake,
    NVLINK_CRC: FaultInjector._start_nvlink_crc_storm,
    PCIE_REPLAY: FaultInjector._start_pcie_replay_storm,
    SBE: FaultInjector._start_ecc_sbe_storm,
    PCIE_AER: FaultInjector._start_pcie_aer_storm,
}


def _draw_xid(rng: np.random.Generator) -> int:
    codes = [c for c, _ in STORM_XIDS]
    weights = np.array([w for _, w in STORM_XIDS])
    return int(codes[int(rng.choice(len(codes), p=weights / weights.sum()))])
