"""The simulated scheduler: places jobs on GPUs, starts and ends them, and cycles each job through its phases.

Multi-node LLM pre-training runs on reserved partitions of whole NVLink nodes (2-8 nodes: 16-64 GPUs with 8 per
node), as large training runs do; when such a job ends or crashes it is restarted (a new job id, after a few
minutes) once every GPU of the partition is healthy again. Every other node is shared: when GPUs free up they stay
idle for a while (an exponential gap, mean per node kind), then the next job is drawn from the node kind's
application mix, sized from the application's GPU counts, and packed onto the lowest free GPUs.

Time is in seconds since the fleet's first round. Per-GPU state lives in numpy arrays (the fleet reads them every
round); per-job bookkeeping is Python, touched only when a job has something due (a phase change, its end).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pipeline.events import Workload
from producers.simulator.hardware import NodeKind
from producers.simulator.profiles import (
    APP_IDLE,
    APP_INDEX,
    P_CHECKPOINT,
    P_COMPUTE,
    P_EVAL,
    P_IDLE,
    P_LOADING,
    PROFILES,
    Profile,
)

_USERS = (
    "alice", "bob", "chen", "dmitri", "eva", "farah", "gus", "hana", "ivan", "jun", "kofi", "lena", "mateo",
    "nadia", "omar", "priya", "quinn", "ravi", "sofia", "tomas", "uma", "victor", "wei", "yusuf", "zoe",
)  # fmt: skip
_TENANTS = {
    "llm-pretraining": ("foundation-models",),
    "llm-finetuning": ("foundation-models", "applied-ml", "search"),
    "llm-serving": ("inference", "search", "support-bot"),
    "bert-training": ("search", "applied-ml"),
    "resnet-training": ("vision", "applied-ml"),
    "stable-diffusion-inference": ("creative", "inference"),
    "rendering": ("render-farm", "creative"),
    "hashing": ("rented-capacity",),
    "idle": ("applied-ml", "vision", "research"),
}
#: a pre-training partition waits this long (s) after its job ended before the next one starts
_RESTART_S = (120.0, 600.0)


@dataclass
class Job:
    slot: int
    job_id: str
    app: str
    gpus: list[int]
    start_s: float
    end_s: float
    workload: Workload
    pid: int
    phase: int = P_COMPUTE
    phase_end_s: float = math.inf
    next_s: dict[int, float] = field(default_factory=dict)
    partition: int | None = None

    @property
    def profile(self) -> Profile:
        return PROFILES[self.app]


@dataclass
class Partition:
    nodes: list[int]
    gpus: list[int]
    job: Job | None = None
    restart_s: float = 0.0


class Scheduler:
    """Jobs on the fleet's GPUs. ``advance(now_s)`` returns the GPUs whose workload changed."""

    def __init__(
        self,
        kinds: list[NodeKind],
        gpus_per_node: int,
        rng: np.random.Generator,
        memory_gib: np.ndarray,
        multi_node: bool = True,
    ) -> None:
        self.kinds = kinds
        self.memory_gib = memory_gib
        self.gpn = gpus_per_node
        self.rng = rng
        n = len(kinds) * gpus_per_node
        self.gpu_job = np.full(n, -1, dtype=np.int64)
        self.gpu_app = np.full(n, APP_IDLE, dtype=np.int64)
        self.gpu_busy = np.zeros(n, dtype=bool)  # a job (not an idle session) runs
        self.free_at = np.zeros(n)
        self.job_start = np.zeros(n)
        self.mem_target = np.zeros(n)  # fraction of the GPU's memory the job settles at
        self.mem_tau = np.full(n, 30.0)  # how fast it gets there, s
        self.multi = np.zeros(n, dtype=bool)  # the job spans several GPUs
        self.multi_node = np.zeros(n, dtype=bool)
        # faults tell the scheduler which GPUs cannot take jobs and which jobs must keep running
        self.unavailable = np.zeros(n, dtype=bool)
        self.hold = np.zeros(n, dtype=bool)
        #: the GPUs of each job ended since the round began (the fault injector's teardown XIDs read them)
        self.ended: list[list[int]] = []
        self.jobs: dict[int, Job] = {}
        self._slots = 0
        self._free_slots: list[int] = []
        self.job_phase = np.zeros(16, dtype=np.int64)
        self.job_next = np.full(16, math.inf)
        self.job_intensity = np.ones(16)
        self.job_load_mid = np.zeros(16)
        self.job_load_amp = np.zeros(16)
        self.job_peak_hour = np.zeros(16)
        self._seq = 0
        self.partitions: list[Partition] = []
        self.in_partition = np.zeros(n, dtype=bool)
        if multi_node:
            self._make_partitions()

    # --- set-up -----------------------------------------------------------------------------------------
    def _make_partitions(self) -> None:
        """Reserve groups of whole nodes of one kind for multi-node pre-training (consecutive nodes, one rack)."""
        node = 0
        nodes = len(self.kinds)
        while node < nodes:
            kind = self.kinds[node]
            run = node
            while run < nodes and self.kinds[run].name == kind.name:
                run += 1
            block = list(range(node, run))
            reserved = round(len(block) * kind.pretraining_share)
            at = 0
            while reserved - at >= 2:
                size = int(min(self.rng.choice([2, 4, 4, 8]), reserved - at))
                members = block[at : at + size]
                gpus = [n * self.gpn + g for n in members for g in range(self.gpn)]
                self.partitions.append(Partition(members, gpus))
                self.in_partition[gpus] = True
                at += size
            node = run

    def fill(self, now_s: float) -> list[int]:
        """The state at the first round: jobs already running (started at random times before it)."""
        changed: list[int] = []
        for part in self.partitions:
            profile = PROFILES["llm-pretraining"]
            length = self._length(profile)
            start = now_s - self.rng.uniform(0, length)
            job = self._start(part.gpus, "llm-pretraining", start, length, part, fresh=False)
            part.job = job
            changed += part.gpus
        for node, kind in enumerate(self.kinds):
            gpus = [node * self.gpn + g for g in range(self.gpn) if not self.in_partition[node * self.gpn + g]]
            while gpus:
                # the chance that the node's remaining GPUs sit in an idle gap right now
                if self.rng.random() < 0.25:
                    self.free_at[gpus] = now_s + self.rng.exponential(kind.idle_gap_s, len(gpus))
                    break
                app, size = self._draw(kind, len(gpus))
                profile = PROFILES[app]
                length = self._length(profile)
                placed = gpus[:size]
                self._start(placed, app, now_s - self.rng.uniform(0, length), length, fresh=False)
                changed += placed
                gpus = gpus[size:]
        return changed

    # --- per round --------------------------------------------------------------------------------------
    def advance(self, now_s: float) -> list[int]:
        """End, re-phase and start jobs up to ``now_s``; returns the GPUs whose job changed."""
        changed: list[int] = []
        self.ended = []
        for slot in np.flatnonzero(self.job_next[: self._slots] <= now_s).tolist():
            job = self.jobs.get(slot)
            if job is not None:
                changed += self._due(job, now_s)
        for part in self.partitions:
            if part.job is None and now_s >= part.restart_s and not self.unavailable[part.gpus].any():
                length = self._length(PROFILES["llm-pretraining"])
                part.job = self._start(part.gpus, "llm-pretraining", now_s, length, part)
                changed += part.gpus
        ready = (self.gpu_job < 0) & (self.free_at <= now_s) & ~self.unavailable & ~self.in_partition
        if ready.any():
            changed += self._place(np.flatnonzero(ready).tolist(), now_s)
        return changed

    def _due(self, job: Job, now_s: float) -> list[int]:
        if now_s >= job.end_s:
            if self.hold[job.gpus].any():
                job.end_s = now_s + 60.0  # a job under a fault that needs it running keeps running
            else:
                return self.end(job, now_s)
        if job.phase not in (P_COMPUTE, P_IDLE) and now_s >= job.phase_end_s:
            job.phase, job.phase_end_s = P_COMPUTE, math.inf
        if job.phase == P_COMPUTE:
            due = [p for p in (P_CHECKPOINT, P_EVAL, P_LOADING) if job.next_s.get(p, math.inf) <= now_s]
            if due:
                phase = due[0]  # a checkpoint wins over an eval over a data-loading stall
                every = self._every(job.profile, phase)
                assert every is not None
                job.phase, job.phase_end_s = phase, now_s + self.rng.uniform(every[2], every[3])
                for p in due:  # what was due at the same time is not made up for later
                    cycle = self._every(job.profile, p)
                    assert cycle is not None
                    job.next_s[p] = now_s + self.rng.uniform(cycle[0], cycle[1])
        self.job_phase[job.slot] = job.phase
        self.job_next[job.slot] = min(job.end_s, job.phase_end_s, *job.next_s.values())
        return []

    def end(self, job: Job, now_s: float) -> list[int]:
        """End a job (finished, or killed by a fault): its GPUs go idle for a gap."""
        del self.jobs[job.slot]
        self._free_slots.append(job.slot)
        self.job_next[job.slot] = math.inf
        gpus = job.gpus
        self.ended.append(list(gpus))
        self.gpu_job[gpus] = -1
        self.gpu_app[gpus] = APP_IDLE
        self.gpu_busy[gpus] = False
        self.multi[gpus] = False
        self.multi_node[gpus] = False
        self.mem_target[gpus] = 0.0
        if job.partition is not None:
            part = self.partitions[job.partition]
            part.job = None
            part.restart_s = now_s + self.rng.uniform(*_RESTART_S)
        else:
            kind = self.kinds[gpus[0] // self.gpn]
            self.free_at[gpus] = now_s + self.rng.exponential(kind.idle_gap_s, len(gpus))
        return list(gpus)

    def _place(self, ready: list[int], now_s: float) -> list[int]:
        changed: list[int] = []
        by_node: dict[int, list[int]] = {}
        for g in ready:
            by_node.setdefault(g // self.gpn, []).append(g)
        for node, gpus in by_node.items():
            kind = self.kinds[node]
            app, size = self._draw(kind, len(gpus))
            placed = gpus[:size]
            self._start(placed, app, now_s, self._length(PROFILES[app]))
            changed += placed
            rest = gpus[size:]
            # the node's other free GPUs wait for a later job
            self.free_at[rest] = now_s + self.rng.exponential(kind.idle_gap_s, len(rest))
        return changed

    # --- jobs -------------------------------------------------------------------------------------------
    def _draw(self, kind: NodeKind, free: int) -> tuple[str, int]:
        names = [a for a, _ in kind.apps]
        weights = np.array([w for _, w in kind.apps])
        app = names[int(self.rng.choice(len(names), p=weights / weights.sum()))]
        sizes = [(s, w) for s, w in PROFILES[app].sizes if s <= free] or [(1, 1.0)]
        sw = np.array([w for _, w in sizes])
        return app, sizes[int(self.rng.choice(len(sizes), p=sw / sw.sum()))][0]

    def _length(self, profile: Profile) -> float:
        return float(profile.duration_median_s * math.exp(profile.duration_sigma * self.rng.standard_normal()))

    @staticmethod
    def _every(profile: Profile, phase: int) -> tuple[float, float, float, float] | None:
        return {P_LOADING: profile.loading, P_CHECKPOINT: profile.checkpoint, P_EVAL: profile.evaluation}[phase]

    def _slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        if self._slots == len(self.job_phase):
            grow = len(self.job_phase)
            self.job_phase = np.concatenate([self.job_phase, np.zeros(grow, dtype=np.int64)])
            self.job_next = np.concatenate([self.job_next, np.full(grow, math.inf)])
            self.job_intensity = np.concatenate([self.job_intensity, np.ones(grow)])
            self.job_load_mid = np.concatenate([self.job_load_mid, np.zeros(grow)])
            self.job_load_amp = np.concatenate([self.job_load_amp, np.zeros(grow)])
            self.job_peak_hour = np.concatenate([self.job_peak_hour, np.zeros(grow)])
        self._slots += 1
        return self._slots - 1

    def _start(
        self,
        gpus: list[int],
        app: str,
        start_s: float,
        length_s: float,
        part: Partition | None = None,
        fresh: bool = True,
    ) -> Job:
        rng = self.rng
        profile = PROFILES[app]
        slot = self._slot()
        self._seq += 1
        framework = str(rng.choice(profile.frameworks))
        workload = Workload(
            application=app,
            job_id=f"job-{self._seq:06d}",
            user=str(rng.choice(_USERS)),
            source="simulator",
            confidence=1.0,
            tenant=str(rng.choice(_TENANTS[app])),
            model=str(rng.choice(profile.models)),
            framework=framework,
            job_gpus=len(gpus),
        )
        index = None if part is None else self.partitions.index(part)
        job = Job(
            slot,
            workload.job_id or "",
            app,
            list(gpus),
            start_s,
            start_s + length_s,
            workload,
            int(rng.integers(1_000, 4_000_000)),
            partition=index,
        )
        if app == "idle":
            job.phase = P_IDLE
        elif fresh and profile.loading is not None:
            # a job starts by loading its model and data: low utilisation, host-to-device traffic
            job.phase, job.phase_end_s = P_LOADING, start_s + rng.uniform(20, 90)
        for phase in (P_LOADING, P_CHECKPOINT, P_EVAL):
            every = self._every(profile, phase)
            if every is not None:
                # jobs are not in step with one another: the first event falls anywhere in the first cycle
                job.next_s[phase] = max(start_s, 0.0) + rng.uniform(0, every[1])
        self.jobs[slot] = job
        self.job_phase[slot] = job.phase
        self.job_next[slot] = min(job.end_s, job.phase_end_s, *job.next_s.values())
        self.job_intensity[slot] = rng.uniform(*profile.intensity)
        self.job_load_mid[slot] = rng.uniform(0.35, 0.6)
        self.job_load_amp[slot] = rng.uniform(0.15, 0.35)
        self.job_peak_hour[slot] = rng.uniform(13, 21)
        self.gpu_job[gpus] = slot
        self.gpu_app[gpus] = APP_INDEX[app]
        self.gpu_busy[gpus] = app != "idle"
        self.job_start[gpus] = start_s
        self.multi[gpus] = len(gpus) > 1
        self.multi_node[gpus] = len({g // self.gpn for g in gpus}) > 1
        self.mem_target[gpus] = self._memory(profile, framework, gpus)
        self.mem_tau[gpus] = 600.0 if framework == "tgi" else float(rng.uniform(8, 30))
        return job

    def _memory(self, profile: Profile, framework: str, gpus: list[int]) -> np.ndarray:
        """The fraction of each GPU's memory the job settles at (the same amount on every GPU of the job)."""
        lo, hi = profile.memory
        value = float(self.rng.uniform(lo, hi))
        if framework == "tgi":
            value = float(self.rng.uniform(0.55, 0.8))  # TGI's KV cache grows with traffic, it is not preallocated
        if profile.memory_unit == "gib":
            return np.minimum(value / self.memory_gib[gpus], 0.9)
        return np.full(len(gpus), value)

    def workload_of(self, gpu: int) -> Workload | None:
        slot = int(self.gpu_job[gpu])
        return None if slot < 0 else self.jobs[slot].workload

    def job_of(self, gpu: int) -> Job | None:
        slot = int(self.gpu_job[gpu])
        return None if slot < 0 else self.jobs[slot]
