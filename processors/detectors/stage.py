"""The detectors stage: the detector families composed over one batch, in the order the rules depend on.

A batch is sorted by (GPU slot, time) and walked in *levels*: level k holds the k-th row of every GPU in the batch, so
each level is one vectorized update of all its GPUs (one level per sampling round; a live batch has one, a
fast-forward batch a few dozen). Per level: job boundaries (a new job in the workload context, or one the telemetry
shows starting), the row becomes the GPU's latest (a finding started on a row describes that row and its job), then
the debounced levels (thermal, HBM, power brake, links, idle), power, memory, straggler windows, the GPU's return
after a silence, and its error counters. After the levels: the stragglers of the jobs seen, the batch's GPU events
(each told with its GPU's job at its own time), and the time-based conclusions (silent GPUs, quiet errors,
repeats). Last, the summary of every active finding is appended to the ``explanation`` of the GPU's rows.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from typing import Final

import numpy as np

from pipeline.config import DetectorSettings
from pipeline.events import METRIC_INDEX, SERVING, Finding, GpuEvent, InterpretedBatch, Workload
from pipeline.kinds import PCIE_NARROW
from processors import classify
from processors.detectors import brake, idle, links, thermal
from processors.detectors.brake import Brake
from processors.detectors.changes import Changes
from processors.detectors.columns import S
from processors.detectors.debounce import Debounce
from processors.detectors.findings import Reporter
from processors.detectors.gpus import Latest, NodeClock
from processors.detectors.hard_errors import HardErrors
from processors.detectors.idle import Idle
from processors.detectors.job_pace import JobPace
from processors.detectors.jobs import Jobs, computing
from processors.detectors.links import Links
from processors.detectors.memory import Memory
from processors.detectors.power import Power
from processors.detectors.storms import Storms
from processors.detectors.stragglers import Stragglers, rank_groups
from processors.detectors.thermal import DieTail, HbmThermal, Thermal
from processors.features import PHASE_INDEX
from processors.interpret import TopologyOf
from processors.state import GpuSlots

#: a GPU as its events name it: (cluster, node, UUID)
GpuId = tuple[str, str, str]
#: a GPU's slot, and from which times which workload held within a batch, oldest first
Shifts = tuple[int, list[int], list[Workload | None]]
#: the time from which the workload before a batch's rows held
_BEFORE: Final = -(2**63)

#: the level conditions, debounced together (one score column each, in this order)
LEVELS = (thermal.LEVEL, thermal.HBM_LEVEL, brake.LEVEL, links.NVLINK_LEVEL, links.PCIE_LEVEL, idle.LEVEL)
_DIE, _HBM = LEVELS.index(thermal.LEVEL), LEVELS.index(thermal.HBM_LEVEL)
_PCIE: Final = LEVELS.index(links.PCIE_LEVEL)


def level_conditions(
    m: np.ndarray,
    rel: np.ndarray,
    allocated: np.ndarray,
    expected_links: np.ndarray,
    full_width_seen: np.ndarray | None = None,
    nvlinks_trained: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, each level's condition and whether it can be judged from this row (columns: LEVELS).

    Pure: a table of rows in, two bool matrices out.
    """
    hot, hot_seen, hbm, hbm_seen = thermal.conditions(m, rel)
    braked, braked_seen = brake.condition(m, rel)
    nvlink, nvlink_seen, pcie, pcie_seen = links.conditions(m, expected_links, full_width_seen, nvlinks_trained)
    unused, unused_seen = idle.condition(m, allocated)
    n = m.shape[0]
    cond = np.column_stack([hot, hbm, braked, nvlink, pcie, unused]).reshape(n, len(LEVELS))
    seen = np.column_stack([hot_seen, hbm_seen, braked_seen, nvlink_seen, pcie_seen, unused_seen]).reshape(
        n, len(LEVELS)
    )
    return cond, seen


class Detectors:
    """Emits :class:`pipeline.events.Finding` s of the detector families (see the package docstring).

    ``slots`` is the interpreter's per-GPU slot table (a stage built alone makes its own); ``topology_of`` gives a
    node's topology (the NVLinks each GPU should have, the paths between GPUs).
    """

    def __init__(
        self,
        settings: DetectorSettings | None = None,
        topology_of: TopologyOf | None = None,
        slots: GpuSlots | None = None,
    ) -> None:
        self.settings = settings = settings or DetectorSettings()
        self.slots = slots = slots if slots is not None else GpuSlots()
        self.latest = slots.attach(Latest())
        self.clock = slots.attach(NodeClock(), per="node")
        self.report = report = Reporter(slots, self.latest)
        self.jobs = Jobs(slots)
        self.debounce = Debounce(slots, LEVELS)
        self.die_tail = DieTail(slots)
        self.links = Links(slots, topology_of or (lambda _cluster, _node: None))
        self.power = Power(slots, settings, self.latest, self.jobs.at, report)
        self.memory = Memory(slots, settings, self.jobs.at, report)
        self.pace = JobPace(slots, report, self.latest, self.power.waiting)
        self.stragglers = Stragglers(slots, settings, self.latest, report, self.power.waiting, self.pace)
        self.hard_errors = HardErrors(slots, settings, self.latest, self.clock, report)
        self.changes = Changes(slots, self.jobs.at, report)
        self.storms = Storms(slots, report)
        families = (
            Thermal(),
            HbmThermal(),
            Brake(),
            self.links,
            self.power,
            self.memory,
            self.stragglers,
            self.hard_errors,
            Idle(),
            self.changes,
            self.storms,
        )
        report.peers_of = self.stragglers.peers_of
        for family in families:
            report.wording |= dict.fromkeys(family.names, family)
        report.node_wording |= dict.fromkeys(self.power.names, self.power)
        report.node_wording |= dict.fromkeys(self.pace.names, self.pace)

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        if not self.settings.enabled:
            return batch, []
        out: list[Finding] = []
        if len(batch):
            slots = self.slots.rows(batch)
            order = np.lexsort((batch.ts_ns, slots))
            workloads, changed, shifts = self._context(batch, order, slots[order], out)
            self._samples(batch, order, slots[order], workloads, changed, out)
        else:
            shifts = {}
        if batch.gpu_events:
            self._events(batch.gpu_events, shifts, out)
        self._post(out)
        if len(batch) and (self.report.gpus or self.report.nodes):
            explanation = self.report.explain(
                self.slots.rows(batch),
                batch.ts_ns,
                batch.explanation,
                self.power.speaking_for() + self.report.waited_on(),
            )
            if explanation != batch.explanation:
                batch = replace(batch, explanation=explanation)
        return batch, out

    def tick(self, now_ns: int) -> list[Finding]:
        """Time-based conclusions on data time: GPUs gone silent while their node reports, and repeats."""
        out: list[Finding] = []
        if self.settings.enabled:
            self._post(out)
        return out

    def _context(
        self, b: InterpretedBatch, order: np.ndarray, s: np.ndarray, out: list[Finding]
    ) -> tuple[np.ndarray, np.ndarray, dict[GpuId, Shifts]]:
        """The latest workload per GPU, job boundaries (and peer groups), and the NVLinks the topology expects.
        Returns the rows' workloads and job boundaries (in ``order``: Jobs.context) and, per GPU whose job changed
        within the batch, its workloads over the batch's time (:meth:`_events`)."""
        ts = b.ts_ns[order]
        wls = [b.workload[i] for i in order.tolist()]
        last, changed = self.jobs.context(s, wls)
        shifts = self._shifts(b, order, s, ts, wls, changed[:, 1])
        rows = np.flatnonzero(last).tolist()
        named = [wls[i] is not None and wls[i].job_id is not None and wls[i].source != "inferred" for i in rows]
        if all(named):
            ranks: list[str | None] = [None] * len(rows)
        else:
            original = order[rows].tolist()
            ranks = rank_groups(
                [b.cluster[i] for i in original], [b.node[i] for i in original], [b.processes[i] for i in original]
            )
        for i, group in zip(rows, ranks, strict=True):
            slot = int(s[i])
            self.latest.workload[slot] = wls[i]
            self.stragglers.regroup(slot, int(ts[i]), group, out)
        self.links.refresh(s, int(ts[-1]))
        return np.fromiter(wls, dtype=object, count=len(wls)), changed, shifts

    def _shifts(
        self,
        b: InterpretedBatch,
        order: np.ndarray,
        s: np.ndarray,
        ts: np.ndarray,
        wls: list[Workload | None],
        changed: np.ndarray,
    ) -> dict[GpuId, Shifts]:
        """Per GPU whose job or application changed within the batch (rows sorted by slot and time): its slot, and
        from which times which workload held (the first from before the batch's rows). Read before the GPU's latest
        workload moves on."""
        out: dict[GpuId, Shifts] = {}
        for i in np.flatnonzero(changed).tolist():
            slot, row = int(s[i]), int(order[i])
            gpu = (b.cluster[row], b.node[row], b.gpu_uuid[row])
            if gpu not in out:
                before = self.latest.workload[slot] if i == 0 or s[i - 1] != s[i] else wls[i - 1]
                out[gpu] = (slot, [_BEFORE], [before])
            out[gpu][1].append(int(ts[i]))
            out[gpu][2].append(wls[i])
        return out

    def _events(self, events: tuple[GpuEvent, ...], shifts: dict[GpuId, Shifts], out: list[Finding]) -> None:
        """The batch's GPU events. An event on a GPU whose job changed within the batch (a processor catching up, a
        replay, a backfill: minutes of rows at once) is told with the workload of its own time, not the batch's
        last: an application XID in job A, then in job B, is two jobs (pipeline/escalation.py's xid-follows-gpu)."""
        if not shifts:
            self.hard_errors.events(events, out)
            return
        for e in sorted(events, key=lambda ev: ev.ts_ns):
            shift = shifts.get((e.cluster, e.node, e.gpu_uuid))
            if shift is not None:
                slot, since, wls = shift
                self.latest.workload[slot] = wls[bisect_right(since, e.ts_ns) - 1]
            self.hard_errors.events((e,), out)
        for slot, _since, wls in shifts.values():
            self.latest.workload[slot] = wls[-1]

    def _samples(
        self,
        b: InterpretedBatch,
        order: np.ndarray,
        s: np.ndarray,
        workloads: np.ndarray,
        changed: np.ndarray,
        out: list[Finding],
    ) -> None:
        ts = b.ts_ns[order]
        m, rel = b.metrics[order], b.relative[order]
        n = len(s)
        links.links_from_samples(m, [b.links[i] for i in order.tolist()])
        first = np.r_[True, s[1:] != s[:-1]]
        rank = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0))
        prev_ts = np.where(first, self.latest.ts[s], np.r_[0, ts[:-1]])
        dt_s = np.where(prev_ts < 0, 1.0, np.clip((ts - prev_ts) / S, 0.0, 60.0))
        allocated = idle.allocated(b.workload[i] for i in order.tolist())
        # a job holds the GPU: a context source says so, or compute processes run on it (a display server's graphics
        # process is not a job)
        held = allocated | computing([b.processes[i] for i in order.tolist()], m[:, METRIC_INDEX["process_count"]])
        serving = np.array([(w := b.workload[i]) is not None and w.application in SERVING for i in order.tolist()])
        named = np.array([classify.named(b.workload[i]) for i in order])
        phase = np.array([PHASE_INDEX.get(b.phase[i] or "", -1) for i in order.tolist()], dtype=np.int64)
        full_width, narrow_opens, narrow_closes = self.links.widths(s, m)
        back = (prev_ts >= 0) & (ts - prev_ts >= links.REBOOT_S * S)
        trained = self.links.trained(s, ts, m, back)
        cond, seen = level_conditions(m, rel, allocated, self.links.expected.links[s], full_width, trained)
        deltas = self.latest.counter_deltas(s, first, m, late=ts < self.latest.ts[s])
        job_start = self.jobs.process_starts(b, order, s)
        for k in range(int(rank.max()) + 1):
            rows = np.flatnonzero(rank == k)
            g, t = s[rows], ts[rows]
            started = job_start[rows]
            self.jobs.boundaries(g, t, changed[rows])
            self.jobs.started(g[started], t[started])
            self.latest.workload[g] = workloads[rows]
            self.latest.row[g] = m[rows]
            self.latest.rel[g] = rel[rows]
            for i in rows[narrow_opens[rows] | narrow_closes[rows]].tolist():
                self.report.transition(int(s[i]), PCIE_NARROW, bool(narrow_opens[i]), int(ts[i]), out)
            self._levels(g, t, cond[rows], seen[rows], dt_s[rows], out)
            self.power.step(g, t, m[rows], out)
            leak_fell = self.memory.step(g, t, m[rows], rel[rows], out)
            self.stragglers.step(g, t, m[rows], rel[rows])
            self.changes.step(
                g, t, m[rows], phase[rows], dt_s[rows], held[rows], started, serving[rows], named[rows], out, leak_fell
            )
            self.hard_errors.returns(g, t)
            self.latest.ts[g] = np.maximum(self.latest.ts[g], t)  # a late row of the lane does not set it back
            self.hard_errors.counters(g, t, m[rows], deltas[rows], out)
            self.storms.step(g, t, deltas[rows], dt_s[rows], out, cond[rows, _PCIE] & seen[rows, _PCIE])
        np.maximum.at(self.clock.latest, self.slots.node_of[s], ts)
        self.stragglers.judge(out)

    def _levels(
        self, g: np.ndarray, ts: np.ndarray, cond: np.ndarray, seen: np.ndarray, dt_s: np.ndarray, out: list[Finding]
    ) -> None:
        active = np.column_stack([self.report.gpus.active(g, level.name) for level in LEVELS])
        tail = self.die_tail.step(g, ts, cond[:, _DIE] & seen[:, _DIE], cond[:, _HBM], active[:, _DIE])
        if tail.any():
            cond = cond.copy()
            cond[:, _DIE] |= tail
            cond[:, _HBM] &= ~tail
        starts, clears = self.debounce.step(g, cond, seen, dt_s, active)
        for r, c in zip(*np.nonzero(starts | clears), strict=True):
            self.report.transition(int(g[r]), LEVELS[c].name, bool(starts[r, c]), int(ts[r]), out)

    def _post(self, out: list[Finding]) -> None:
        """Time-based conclusions: GPUs fallen off the bus (and back), errors quiet long enough, and repeats."""
        used = len(self.slots)
        if not used:
            return
        self.hard_errors.lost_and_back(out)
        now = np.maximum(self.latest.ts[:used], self.clock.latest[self.slots.node_of[:used]])
        repeat_ns = self.settings.repeat_s * S
        for slot, name, episode in self.report.gpus.listed():
            t = int(now[slot])
            quiet = self.hard_errors.quiet_end(slot, name, episode)
            if quiet is not None and quiet <= t:  # dated when it went quiet, not when this batch noticed
                self.report.transition(slot, name, False, quiet, out)
            elif self.changes.quiet(slot, name, episode, t):
                self.report.transition(slot, name, False, t, out)
            elif t - episode.last_sent_ns >= repeat_ns:
                self.report.send(slot, name, True, t, out)
        for node, name, episode in self.report.nodes.listed():
            t = int(self.clock.latest[node])
            if t - episode.last_sent_ns >= repeat_ns:
                self.report.send_node(node, name, True, t, out)
