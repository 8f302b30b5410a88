"""Escalation and correlation: what a GPU's and a node's finding *history* adds to the state of now.

The state of now (pipeline.health) reads the findings firing at this moment. Some judgements need the past:

- **repeated fatal errors** -> RMA: ``fatal_count`` episodes that made the GPU unhealthy within ``fatal_window_s``
  (NVSentinel's health-events-analyzer: a fatal XID 5 times in 24 h on one GPU -> contact support);
- **a fault that survives a reset** -> hardware inspection: ``recur_count`` episodes of one kind whose remedy was a
  reset or a reboot, on one GPU within ``recur_window_s``: it came back after the remedy (gpud escalates to
  hardware inspection when two reboots did not help);
- **a lemon node** -> hardware inspection of the node: ``lemon_count`` remediations (episodes asking for a reset or
  more) on its GPUs and itself within ``lemon_window_s`` (NVSentinel's MultipleRemediations rule, 7 days);
- **the same application XID on one GPU across jobs** -> the GPU's, hardware inspection: an XID the catalogue
  blames on the application (13, 31, 43, ...) on one GPU in ``correlate_count`` different jobs, on no other GPU
  of those jobs, within ``correlate_window_s`` (NVSentinel's XID 13/31 workflows: on the same GPU, run
  diagnostics);
- **the same application XID on several GPUs of one job** -> the application's: the GPUs are not blamed (a job
  where the XID was on other GPUs too does not count for the rule above) and each GPU where it still fires gets a
  reason naming the job.

An episode is one finding from its start to its end (its ``since_ns`` identifies it), so a storm of 40 XIDs is one
episode, not 40. Every rule is a pure function of the episodes and ``now``; the reasons it gives join the GPU's (or
node's) reasons in :func:`pipeline.health.fold.assess`, which lifts their state to the one the GPU has now (at least
degraded) so their remedy is the one shown. They hold for their window: a GPU returned for repair comes back with
a new UUID, a repaired node stays a lemon until its window passes (NVSentinel asks an operator to clear it).

An episode that began in a maintenance window (its node held out of service on purpose: pipeline.health) is read
by no rule: the XIDs of a firmware update, the resets and reboots of the work on a node are not faults (nor a
reliability figure's incidents: pipeline.reliability reads the same history).

A rule named in ``health.shadow`` runs in shadow mode: its reasons are worked out and reported apart
(:attr:`pipeline.health.Escalations.shadow`: ``hermeneut health`` lists what it would have done), and change no
state, no remedy, nothing on the health topic: how a new or changed rule is tried on a live fleet.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.config import HealthSettings
from pipeline.events import SEVERITY_RANK, Finding
from pipeline.health.fold import APP_XIDS, Escalations, FiringFinding, GpuKey, NodeKey, Reason, reason_of
from pipeline.health.states import Health, Remedy
from pipeline.vocab import NS_PER_S


@dataclass(frozen=True, slots=True)
class Episode:
    """One finding from its start to now or its end: on a GPU (``gpu`` set) or a node, in a job if known, with
    the XID codes its evidence named."""

    cluster: str
    node: str
    gpu: str | None
    detector: str
    severity: str
    since_ns: int
    job: str | None = None
    xids: frozenset[int] = frozenset()
    #: whether it is still firing (its newest point is active)
    open: bool = False
    #: the time of its newest point (its end once it is closed)
    seen_ns: int = 0
    #: whether its node was in a maintenance window (pipeline.events.Finding.maintenance)
    maintenance: bool = False

    @property
    def reason(self) -> Reason | None:
        """What the episode did to its GPU's state (pipeline.health.reason_of): its worst XID decides."""
        evidence = {"xid": float(min(self.xids, key=lambda c: c in APP_XIDS))} if self.xids else {}
        labels = {"detector": self.detector, "severity": self.severity}
        return reason_of(FiringFinding(labels, "", self.since_ns, evidence))


_REMEDIATION = frozenset({Remedy.RESET_GPU, Remedy.REBOOT_NODE, Remedy.DRAIN, Remedy.INSPECT, Remedy.RMA})


def _within(episodes: Iterable[Episode], now_ns: int, window_s: float) -> list[Episode]:
    start = now_ns - int(window_s * NS_PER_S)
    return [e for e in episodes if start <= e.since_ns <= now_ns]


def _count_words(episodes: list[Episode]) -> str:
    kinds: dict[str, int] = defaultdict(int)
    for e in episodes:
        kinds[e.detector + (f" (XID {', '.join(map(str, sorted(e.xids)))})" if e.xids else "")] += 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))


def episode_of(f: Finding) -> Episode:
    """The episode a finding belongs to (its start identifies it), as it stands after this finding."""
    xids = frozenset(int(v) for k in ("xid", "last_xid") if (v := f.evidence.get(k)) is not None and v == v)  # noqa: PLR0124
    job = f.workload.job_id if f.workload else None
    return Episode(
        f.cluster,
        f.node,
        f.gpu_uuid,
        f.detector,
        f.severity.value,
        f.since_ns,
        job,
        xids,
        f.active,
        f.ts_ns,
        bool(f.maintenance),
    )


class History:
    """The episodes of the lookback, for whoever sees the findings go by (the alert manager): seeded from the
    store at start, kept up to date finding by finding, forgotten when older than every rule's window."""

    def __init__(self, rules: HealthSettings, past: Iterable[Episode] = (), keep: frozenset[str] = frozenset()) -> None:
        self.rules = rules
        #: finding kinds kept though they change no state (a reliability report's idle capacity)
        self.keep = keep
        self._episodes: dict[tuple[str, str, str | None, str, int], Episode] = {}
        for e in past:
            self.add(e)

    def __len__(self) -> int:
        """Every episode kept, those of maintenance windows too (which :meth:`episodes` leaves out)."""
        return len(self._episodes)

    def add(self, e: Episode) -> bool:
        """Record an episode (or its newer state); whether anything a rule reads changed. An episode that changes
        no state (info) is not kept: no rule reads it. One that began in a maintenance window is kept apart (so its
        later points, after the window, are known as its) and read by no rule."""
        key = (e.cluster, e.node, e.gpu, e.detector, e.since_ns)
        old = self._episodes.get(key)
        if old is None and e.reason is None and e.detector not in self.keep:
            return False
        if old is not None:
            severity = worse(old.severity, e.severity)
            e = Episode(
                e.cluster,
                e.node,
                e.gpu,
                e.detector,
                severity,
                e.since_ns,
                old.job or e.job,
                old.xids | e.xids,
                e.open,
                max(old.seen_ns, e.seen_ns),
                old.maintenance,
            )
        self._episodes[key] = e
        changed = old is None or (old.severity, old.job, old.xids, old.open) != (e.severity, e.job, e.xids, e.open)
        return changed and not e.maintenance

    def episodes(self) -> list[Episode]:
        """The episodes the rules read (none of a maintenance window)."""
        return [e for e in self._episodes.values() if not e.maintenance]

    def forget(self, now_ns: int) -> None:
        start = now_ns - int(self.rules.lookback_s * NS_PER_S)
        self._episodes = {k: e for k, e in self._episodes.items() if e.since_ns >= start}

    def escalate(self, now_ns: int) -> Escalations:
        return escalate(self.episodes(), now_ns, self.rules)


def worse(a: str, b: str) -> str:
    """The worse of two severities (as finding points store them; an unknown one counts as info)."""
    return max(a, b, key=lambda v: SEVERITY_RANK.get(v, 0))


def escalate(history: Iterable[Episode], now_ns: int, rules: HealthSettings) -> Escalations:
    """Every escalation and correlation rule (module docstring) over the episodes of the history."""
    episodes = sorted(
        {(e.cluster, e.node, e.gpu, e.detector, e.since_ns): e for e in history}.values(), key=lambda e: e.since_ns
    )
    by_gpu: dict[GpuKey, list[Episode]] = defaultdict(list)
    by_node: dict[NodeKey, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_node[(e.cluster, e.node)].append(e)
        if e.gpu:
            by_gpu[(e.cluster, e.node, e.gpu)].append(e)
    out = Escalations(defaultdict(list), defaultdict(list))
    for gpu, mine in by_gpu.items():
        _fatal(gpu, mine, now_ns, rules, out)
        _recurring(gpu, mine, now_ns, rules, out)
    for node, mine in by_node.items():
        _lemon(node, mine, now_ns, rules, out)
    _application_xids(episodes, now_ns, rules, out)
    return _shadowed(out, rules.shadow_rules)


def _shadowed(out: Escalations, shadow: frozenset[str]) -> Escalations:
    """The reasons of rules in shadow mode moved apart: reported as what they would have done, applied to nothing."""
    if not shadow:
        return out
    apart: dict[tuple[str, str, str | None], list[Reason]] = defaultdict(list)
    for (c, n, g), reasons in out.gpus.items():
        apart[(c, n, g)] += [r for r in reasons if r.detector in shadow]
    for (c, n), reasons in out.nodes.items():
        apart[(c, n, None)] += [r for r in reasons if r.detector in shadow]
    gpus = {k: kept for k, v in out.gpus.items() if (kept := [r for r in v if r.detector not in shadow])}
    nodes = {k: kept for k, v in out.nodes.items() if (kept := [r for r in v if r.detector not in shadow])}
    return Escalations(gpus, nodes, {k: v for k, v in apart.items() if v})


def _fatal(key: GpuKey, mine: list[Episode], now_ns: int, rules: HealthSettings, out: Escalations) -> None:
    fatal = [e for e in _within(mine, now_ns, rules.fatal_window_s) if (r := e.reason) and r.state is Health.UNHEALTHY]
    if len(fatal) >= rules.fatal_count:
        hours = rules.fatal_window_s / 3600
        out.gpus[key].append(
            Reason(
                "repeated-fatal",
                "critical",
                f"{len(fatal)} fatal errors on this GPU within {hours:g} h ({_count_words(fatal)}): return it (RMA)",
                fatal[0].since_ns,
                Health.UNHEALTHY,
                Remedy.RMA,
            )
        )


def _recurring(key: GpuKey, mine: list[Episode], now_ns: int, rules: HealthSettings, out: Escalations) -> None:
    kinds: dict[str, list[Episode]] = defaultdict(list)
    for e in _within(mine, now_ns, rules.recur_window_s):
        r = e.reason
        if r is not None and r.remedy in (Remedy.RESET_GPU, Remedy.REBOOT_NODE):
            kinds[e.detector].append(e)
    for detector, seen in sorted(kinds.items()):
        if len(seen) >= rules.recur_count:
            days = rules.recur_window_s / 86_400
            out.gpus[key].append(
                Reason(
                    "recurring-fault",
                    "warning",
                    f"{detector} came back {len(seen) - 1} times after its reset within {days:g} d: the reset does not "
                    "mend it; inspect the hardware",
                    seen[0].since_ns,
                    Health.DEGRADED,
                    Remedy.INSPECT,
                )
            )


def _lemon(key: NodeKey, mine: list[Episode], now_ns: int, rules: HealthSettings, out: Escalations) -> None:
    fixes = [e for e in _within(mine, now_ns, rules.lemon_window_s) if (r := e.reason) and r.remedy in _REMEDIATION]
    if len(fixes) >= rules.lemon_count:
        gpus = len({e.gpu for e in fixes if e.gpu})
        days = rules.lemon_window_s / 86_400
        out.nodes[key].append(
            Reason(
                "lemon-node",
                "warning",
                f"{len(fixes)} remediations on this node within {days:g} d, on {gpus} of its GPUs "
                f"({_count_words(fixes)}): a lemon node; drain it and inspect the node (board, power, cooling), "
                "not GPU by GPU",
                fixes[0].since_ns,
                Health.DEGRADED,
                Remedy.INSPECT,
            )
        )


def _application_xids(episodes: list[Episode], now_ns: int, rules: HealthSettings, out: Escalations) -> None:
    """Per application XID code: on several GPUs of one job -> the application's (said on each GPU where it is
    open); on one GPU in several jobs and on no other GPU of those jobs -> the GPU's."""
    seen = [e for e in _within(episodes, now_ns, rules.correlate_window_s) if e.gpu and e.job and e.xids & APP_XIDS]
    for code in sorted({c for e in seen for c in e.xids & APP_XIDS}):
        with_code = [e for e in seen if code in e.xids]
        gpus_of_job: dict[str, set[GpuKey]] = defaultdict(set)
        jobs_of_gpu: dict[GpuKey, set[str]] = defaultdict(set)
        for e in with_code:
            key = (e.cluster, e.node, str(e.gpu))
            gpus_of_job[str(e.job)].add(key)
            jobs_of_gpu[key].add(str(e.job))
        for e in with_code:
            key, spread = (e.cluster, e.node, str(e.gpu)), len(gpus_of_job[str(e.job)])
            if e.open and spread >= rules.correlate_count:
                out.gpus[key].append(
                    Reason(
                        "xid-across-job",
                        "warning",
                        f"XID {code} on {spread} GPUs of job {e.job}: the application's, not this GPU's; "
                        "restart the job",
                        e.since_ns,
                        Health.DEGRADED,
                        Remedy.RESTART_JOB,
                    )
                )
        for key, jobs in sorted(jobs_of_gpu.items()):
            alone = sorted(j for j in jobs if gpus_of_job[j] == {key})
            if len(alone) >= rules.correlate_count and len(alone) == len(jobs):
                first = min(e.since_ns for e in with_code if (e.cluster, e.node, e.gpu) == key)
                out.gpus[key].append(
                    Reason(
                        "xid-follows-gpu",
                        "warning",
                        f"XID {code} on this GPU in {len(alone)} different jobs ({', '.join(alone)}) and on no "
                        "other GPU of them: the GPU's, not the application's; run diagnostics (dcgmi diag -r 3)",
                        first,
                        Health.DEGRADED,
                        Remedy.INSPECT,
                    )
                )
