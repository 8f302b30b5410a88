"""Health: a state per GPU and per node, the findings behind it, and one remedy from a fixed vocabulary.

What an operator of a fleet asks after the findings: which GPUs and nodes are healthy now, and what to do about
the others. The model follows the tools GPU clouds adopted for it: gpud reports each component as Healthy,
Degraded or Unhealthy with a reason and a suggested repair action (leptonai/gpud, ``api/v1``); NVSentinel
quarantines, drains and remediates on fatal errors (NVIDIA/NVSentinel). Here the state is *derived*, never stored
apart from its evidence: it is a pure fold of the findings firing now (the alert manager's alerts) and of when each
GPU last reported, so it can never disagree with the findings it names.

The rules (pipeline.kinds: each kind's ``health`` column): a finding kind gives a state at each severity and a
remedy. Info findings never change a state (they describe a job or a property: an idle GPU, a narrow link from the
first sample). A GPU's state is the worst of its findings', its remedy the strongest of those that gave that state.
A node's state is the worst of its GPUs' and of its own findings (a node-level finding has no GPU), its remedy the
strongest of the findings behind that. A GPU that reported within the lookback but
not for ``silent_after`` is ``unknown``: no telemetry is no evidence of health, and its reason says where to look
(``gpu-silent``: its node reports, so the GPU is gone or its collector lost it; ``node-silent``: the node or its
collector is down; the fallen-off-bus finding says the GPU is gone once it is sure).

Maintenance windows: a node its scheduler holds out of service on purpose (``maintenance``: a Slurm drain, a
maintenance reservation or reboot, a Kubernetes cordon; producers.context.nodestate, carried by the node's topology
and its findings) is ``maintenance``, remedy none, whatever fires on it: its silence is expected, its findings are
listed as reasons (kept, never paged: alerting mutes them) and left out of fleet incidents.

The circuit breaker: one finding kind on :data:`INCIDENT_SHARE` of a cluster's GPUs at once (a driver, a firmware,
a cooling loop, a bad job image) is one fleet :class:`Incident` naming what the GPUs share, and none of them gets a
per-GPU remedy: nobody drains a third of a fleet one GPU at a time (NVSentinel's circuit breaker against mass
quarantine). It needs the fleet's membership (the CLI and the API have it; the alert manager's topic does not).

Remedies, strongest last: none, restart job, reset GPU, reboot node, drain, hardware inspection, RMA. Each rule's
source is beside it; the XID-derived ones read NVIDIA's Xid catalog resolution buckets (RESTART_APP, RESET_GPU,
RESTART_BM, CONTACT_SUPPORT) as processors/detectors/hard_errors.py does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.afid import CONTAINED
from pipeline.events import Severity
from pipeline.health.states import BADNESS, STRENGTH, Health, Remedy
from pipeline.kinds import RAS, RULES
from pipeline.topology import NodeTopology
from pipeline.vocab import NS_PER_S, format_duration, utc_text

#: the circuit breaker (as NVSentinel's against mass quarantine): one finding kind on this share of a cluster's GPUs
#: at once, and at least INCIDENT_MIN_GPUS of them, is a fleet incident (a driver, a firmware, a cooling loop, a
#: bad job image): its GPUs keep their state, but get no per-GPU remedy (no drain, no reset of a third of a fleet)
INCIDENT_SHARE: Final = 0.3
INCIDENT_MIN_GPUS: Final = 4
#: the same for a place: one finding kind on GPUs of this many nodes of one rack, or behind one leaf switch, at once
#: is that place's incident (a rack's power or cooling, a switch), whatever share of the cluster that is. Independent
#: faults run at ~2e-3 per node-day (the StepFun trace): three at once in one rack is not chance
INCIDENT_MIN_NODES: Final = 3
#: where a node sits, as its topology names it (pipeline.topology.NodeTopology)
PLACES: Final = ("rack", "switch")
_SHARED_LABELS: Final = ("driver_version", *PLACES, "gpu_model", "application", "job")
#: warning-severity XIDs are the application's (Xid catalog RESTART_APP): the job is restarted, the GPU is fine
_APP_XID_REMEDY: Final = Remedy.RESTART_JOB
#: XID 154 (recovery action changed: reboot required) and 79 are the node's
_REBOOT_XIDS: Final = frozenset({79, 154})
#: the application's XIDs (Xid catalog RESTART_APP; processors/detectors/hard_errors.py marks them "app"): a storm
#: of them degrades the job, not the GPU
APP_XIDS: Final = frozenset({8, 13, 31, 43, 45, 69, 109})


@dataclass(frozen=True, slots=True)
class Reason:
    """A firing finding behind a state."""

    detector: str
    severity: str
    summary: str
    since_ns: int
    state: Health
    remedy: Remedy


GpuKey = tuple[str, str, str]
NodeKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Escalations:
    """The reasons a finding history adds (pipeline.escalation), per GPU (cluster, node, gpu) and per node; those of
    rules in shadow mode apart, per GPU (cluster, node, gpu) or node (cluster, node, None): they change nothing."""

    gpus: Mapping[GpuKey, list[Reason]] = field(default_factory=dict)
    nodes: Mapping[NodeKey, list[Reason]] = field(default_factory=dict)
    shadow: Mapping[tuple[str, str, str | None], list[Reason]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Assessment:
    """The health of one GPU (``gpu`` set) or one node (``gpu`` None)."""

    cluster: str
    node: str
    gpu: str | None
    state: Health
    remedy: Remedy
    reasons: tuple[Reason, ...] = ()
    last_seen_ns: int | None = None


@dataclass(frozen=True, slots=True)
class FiringFinding:
    """What the fold needs of a firing alert: its labels (detector, severity, cluster, node, gpu), summary, start
    and evidence."""

    labels: Mapping[str, str]
    summary: str
    since_ns: int
    evidence: Mapping[str, float] = field(default_factory=dict)
    #: its finding stopped repeating (the last one's time; 0: fresh): still a reason, told as stale
    stale_since_ns: int = 0


@dataclass(frozen=True, slots=True)
class Incident:
    """One finding kind on many GPUs of a cluster (or of one rack's or switch's nodes) at once: a fleet incident, not N
    sick GPUs. ``of_gpus``: the cluster's GPUs (a place's: its affected nodes' GPUs). ``shared``: the labels every
    affected GPU has in common (driver version, rack, switch, model, application, job), the first place to look."""

    cluster: str
    detector: str
    gpus: int
    of_gpus: int
    shared: tuple[tuple[str, str], ...]
    since_ns: int


@dataclass(frozen=True, slots=True)
class FleetHealth:
    gpus: tuple[Assessment, ...]
    nodes: tuple[Assessment, ...]
    incidents: tuple[Incident, ...] = ()
    #: what rules in shadow mode would have added: ((cluster, node, GPU or None), reason)
    shadow: tuple[tuple[tuple[str, str, str | None], Reason], ...] = ()

    def counts(self, of: str = "gpus") -> dict[str, int]:
        """How many GPUs (or nodes) are in each state (every state named, zeros included)."""
        out = {h.value: 0 for h in Health}
        for a in self.gpus if of == "gpus" else self.nodes:
            out[a.state.value] += 1
        return out


def reason_of(f: FiringFinding) -> Reason | None:
    """The finding as a reason for a state; None: it does not change one (info, or a kind without a rule)."""
    detector, severity = f.labels.get("detector", ""), f.labels.get("severity", "")
    rule = RULES.get(detector)
    if rule is None or severity not in (Severity.WARNING, Severity.CRITICAL):
        return None
    state = rule.critical if severity == Severity.CRITICAL else rule.warning
    remedy = rule.remedy
    if detector in ("xid", "xid-storm"):
        raw = f.evidence.get("xid", f.evidence.get("last_xid"))  # a storm's evidence names its last XID
        code = int(raw) if raw is not None and raw == raw else None  # noqa: PLR0124 (NaN: no code)
        if code in _REBOOT_XIDS:
            remedy = Remedy.REBOOT_NODE
        elif code in APP_XIDS or severity == Severity.WARNING:
            state, remedy = Health.DEGRADED, _APP_XID_REMEDY
    elif detector == RAS:
        cper = f.evidence.get("cper")
        if cper == CONTAINED:  # contained where it happened: the application's to restart, the GPU works
            state, remedy = Health.DEGRADED, _APP_XID_REMEDY
        elif severity == Severity.WARNING:  # corrected: watch it
            state, remedy = Health.DEGRADED, Remedy.NONE
    summary = f.summary
    if f.stale_since_ns:  # silence is no evidence of health: the finding still counts, and says it went quiet
        summary += f" (stale: no word of it since {utc_text(f.stale_since_ns)}; kept until a finding clears it)"
    return Reason(detector, severity, summary, f.since_ns, state, remedy)


def _fold(reasons: list[Reason]) -> tuple[Health, Remedy]:
    if not reasons:
        return Health.HEALTHY, Remedy.NONE
    worst = max((r.state for r in reasons), key=BADNESS.__getitem__)
    remedy = max((r.remedy for r in reasons if r.state is worst), key=STRENGTH.__getitem__)
    return worst, remedy


def assess(
    firing: Iterable[FiringFinding],
    fleet: Iterable[tuple[str, str, str, int | None]] = (),
    now_ns: int = 0,
    silent_after_ns: int = 120 * 10**9,
    history: Escalations = Escalations(),
    topologies: Iterable[NodeTopology] = (),
) -> FleetHealth:
    """The health of every GPU in ``fleet`` ((cluster, node, gpu, last reported or None)) and of every GPU and
    node a firing finding or the ``history`` names, and of their nodes. A reason from the history takes the state
    its GPU (node) has from the findings firing now, at least degraded, so its remedy is the one shown. The nodes'
    ``topologies`` say which are in a maintenance window (as their findings do) and where each sits (a place
    incident counts its rack's or switch's GPUs)."""
    firing, topologies = list(firing), list(topologies)
    out_of_service = {(t.cluster, t.node): t.maintenance for t in topologies if t.maintenance} | {
        (f.labels.get("cluster", ""), f.labels.get("node", "")): f.labels["maintenance"]
        for f in firing
        if f.labels.get("maintenance")
    }
    by_gpu: dict[tuple[str, str, str], list[Reason]] = {}
    by_node: dict[tuple[str, str], list[Reason]] = {}
    seen: dict[tuple[str, str, str], int | None] = {}
    for cluster, node, gpu, last in fleet:
        seen[(cluster, node, gpu)] = last
        by_gpu.setdefault((cluster, node, gpu), [])
        by_node.setdefault((cluster, node), [])
    judged = [(f, reason_of(f)) for f in firing]
    # a maintenance window's findings are the work on the node, not a fleet's incident
    incidents, breaker = _incidents([(f, r) for f, r in judged if not f.labels.get("maintenance")], seen, topologies)
    for f, reason in judged:
        cluster, node, uuid = f.labels.get("cluster", ""), f.labels.get("node", ""), f.labels.get("gpu")
        by_node.setdefault((cluster, node), [])
        in_incident = reason is not None and (cluster, node, uuid, reason.detector) in breaker
        # part of a fleet incident: no per-GPU action
        r = dataclasses.replace(reason, remedy=Remedy.NONE) if reason is not None and in_incident else reason
        if uuid:
            by_gpu.setdefault((cluster, node, uuid), [])
            if r is not None:
                by_gpu[(cluster, node, uuid)].append(r)
        elif r is not None:
            by_node[(cluster, node)].append(r)
    for gkey in history.gpus:
        by_gpu.setdefault(gkey, [])
        by_node.setdefault(gkey[:2], [])
    for nkey in history.nodes:
        by_node.setdefault(nkey, [])
    node_last: dict[tuple[str, str], int] = {}
    for (cluster, node, _gpu), last in seen.items():
        node_last[(cluster, node)] = max(node_last.get((cluster, node), 0), last or 0)
    gpus = []
    for key in sorted(by_gpu):
        reasons = _by_badness(by_gpu[key] + _lifted(history.gpus.get(key, ()), _fold(by_gpu[key])[0]))
        last, why = seen.get(key), out_of_service.get(key[:2])
        if why:
            reasons = [_maintenance(why), *reasons]
        elif not reasons and key in seen and (last is None or now_ns - last > silent_after_ns):
            reasons = [_silence(now_ns, last, node_last[key[:2]], silent_after_ns)]
        state, remedy = (Health.MAINTENANCE, Remedy.NONE) if why else _fold(reasons)
        gpus.append(Assessment(*key, state, remedy, tuple(reasons), last))
    nodes = []
    for cluster, node in sorted(by_node):
        members = [a for a in gpus if a.cluster == cluster and a.node == node]
        # a node's silence is said once, not once per GPU
        mine = by_node[(cluster, node)] + [r for a in members for r in a.reasons]
        found = list({(r.detector, r.summary): r for r in mine}.values())
        reasons = _by_badness(found + _lifted(history.nodes.get((cluster, node), ()), _fold(found)[0]))
        state, remedy = _fold(reasons)
        # the worst of its GPUs (a silent GPU leaves its node unknown, not healthy)
        state = max([state, *(a.state for a in members)], key=BADNESS.__getitem__)
        if why := out_of_service.get((cluster, node)):
            state, remedy = Health.MAINTENANCE, Remedy.NONE
            if not members:
                reasons = [_maintenance(why), *reasons]
        nodes.append(Assessment(cluster, node, None, state, remedy, tuple(reasons)))
    shadow = tuple((key, r) for key in sorted(history.shadow, key=str) for r in history.shadow[key])
    return FleetHealth(tuple(gpus), tuple(nodes), incidents, shadow)


def _maintenance(why: str) -> Reason:
    return Reason(
        "maintenance",
        "info",
        f"held out of service on purpose ({why}): its findings are kept, not paged",
        0,
        Health.MAINTENANCE,
        Remedy.NONE,
    )


#: a silence is said only of a GPU with no open finding: what it was when its telemetry stopped
_LAST_HEARD: Final = "no finding was open on it when it was last heard from"


def _silence(now_ns: int, last: int | None, node_last: int, silent_after_ns: int) -> Reason:
    """Why a GPU with nothing firing is unknown: telemetry gaps are evidence of where to look. Its node still
    reports (another GPU of it does): the GPU is gone from the bus, or its collector lost it (the fallen-off-bus
    detector says the first once it is sure); none of the node's GPUs reports: the node, or its collector, is down."""
    if now_ns - node_last <= silent_after_ns:
        age = (
            "in the lookback"
            if last is None
            else f"for {format_duration(max(0, now_ns - last) // NS_PER_S * NS_PER_S)}"
        )
        return Reason(
            "gpu-silent",
            "warning",
            f"no sample {age} while its node reports: gone from the bus, or its collector lost it; {_LAST_HEARD}",
            last or 0,
            Health.UNKNOWN,
            Remedy.NONE,
        )
    age = format_duration(max(0, now_ns - node_last) // NS_PER_S * NS_PER_S)
    return Reason(
        "node-silent",
        "warning",
        f"no sample from any GPU of its node for {age}: the node, or its collector, is down; {_LAST_HEARD}",
        node_last,
        Health.UNKNOWN,
        Remedy.NONE,
    )


def _by_badness(reasons: list[Reason]) -> list[Reason]:
    return sorted(reasons, key=lambda r: (-BADNESS[r.state], r.since_ns))


def _lifted(reasons: Iterable[Reason], now: Health) -> list[Reason]:
    """History's reasons at the state of now (at least degraded): they change the remedy, not the verdict."""
    state = max(now, Health.DEGRADED, key=BADNESS.__getitem__)
    return [dataclasses.replace(r, state=max(r.state, state, key=BADNESS.__getitem__)) for r in reasons]


def _incidents(
    judged: list[tuple[FiringFinding, Reason | None]],
    fleet: Mapping[tuple[str, str, str], int | None],
    topologies: Sequence[NodeTopology] = (),
) -> tuple[tuple[Incident, ...], set[tuple[str, str, str | None, str]]]:
    """Fleet incidents, and the (cluster, node, GPU, finding kind) they cover (the circuit breaker's). Per cluster
    whose membership is known (``fleet``): each finding kind that changes a state (its reason is not None) and fires
    on :data:`INCIDENT_SHARE` of its GPUs (at least :data:`INCIDENT_MIN_GPUS`); else on GPUs of at least
    :data:`INCIDENT_MIN_NODES` nodes of one place (:data:`PLACES`), out of the place's GPUs (its nodes' by their
    ``topologies``; the affected nodes' where no topology names the place)."""
    size: dict[str, int] = {}
    per_node: dict[tuple[str, str], int] = {}
    for cluster, node, _ in fleet:
        size[cluster] = size.get(cluster, 0) + 1
        per_node[(cluster, node)] = per_node.get((cluster, node), 0) + 1
    hit: dict[tuple[str, str], dict[str, FiringFinding]] = {}
    for f, reason in judged:
        cluster, gpu, detector = f.labels.get("cluster", ""), f.labels.get("gpu"), f.labels.get("detector", "")
        if gpu and reason is not None:
            hit.setdefault((cluster, detector), {})[gpu] = f
    out, covered = [], set()
    for (cluster, detector), gpus in sorted(hit.items()):
        whole = cluster in size and len(gpus) >= max(INCIDENT_MIN_GPUS, INCIDENT_SHARE * size[cluster])
        for found, place in [(list(gpus.values()), None)] if whole else _same_place(gpus.values()):
            nodes = {f.labels.get("node", "") for f in found} | _nodes_at(cluster, place, topologies)
            of = size[cluster] if whole else sum(per_node.get((cluster, n), 0) for n in nodes) or len(found)
            out.append(Incident(cluster, detector, len(found), of, _shared(found), min(f.since_ns for f in found)))
            covered |= {(cluster, f.labels.get("node", ""), f.labels.get("gpu"), detector) for f in found}
    return tuple(out), covered


def _nodes_at(cluster: str, place: tuple[str, str] | None, topologies: Sequence[NodeTopology]) -> set[str]:
    """The nodes of ``cluster`` whose topology puts them at ``place`` ((rack or switch, its name))."""
    if place is None:
        return set()
    kind, name = place
    return {t.node for t in topologies if t.cluster == cluster and getattr(t, kind) == name}


def _same_place(found: Iterable[FiringFinding]) -> list[tuple[list[FiringFinding], tuple[str, str]]]:
    """The firing findings (of one kind) grouped by each place they name; the groups that span enough nodes, each
    finding in one group at most (the rack's before the switch's), with their place."""
    out: list[tuple[list[FiringFinding], tuple[str, str]]] = []
    left = list(found)
    for place in PLACES:
        groups: dict[str, list[FiringFinding]] = {}
        for f in left:
            if f.labels.get(place):
                groups.setdefault(f.labels[place], []).append(f)
        for value, group in sorted(groups.items()):
            if len({f.labels.get("node") for f in group}) >= INCIDENT_MIN_NODES:
                out.append((group, (place, value)))
                left = [f for f in left if f not in group]
    return out


def _shared(found: list[FiringFinding]) -> tuple[tuple[str, str], ...]:
    """The labels every finding has in common (driver version, rack, switch, model, application, job)."""
    first = found[0].labels
    return tuple(
        (k, first[k]) for k in _SHARED_LABELS if k in first and all(f.labels.get(k) == first[k] for f in found)
    )


def assessment_json(a: Assessment) -> dict[str, Any]:
    return {
        "cluster": a.cluster,
        "node": a.node,
        "gpu": a.gpu,
        "state": a.state.value,
        "remedy": a.remedy.value,
        "last_seen_ns": a.last_seen_ns,
        "reasons": [
            {
                "detector": r.detector,
                "severity": r.severity,
                "state": r.state.value,
                "remedy": r.remedy.value,
                "since_ns": r.since_ns,
                "summary": r.summary,
            }
            for r in a.reasons
        ],
    }
