"""Scoring of what hermeneut told a user against the ground truth of a simulated fleet: pure functions, no I/O but
reading the PAI step-time files.

Both evaluations hand their output here: ``hermeneut evaluate`` (through real Kafka, processor, sink and InfluxDB,
hermeneut/jobs/evaljob.py) and ``hermeneut evaluate --offline`` (the same interpretation code in one process, at
fleet scale, hermeneut/jobs/fleeteval.py). The rules are built so that the score cannot flatter:

- **Every finding a user is shown counts.** An *episode* is one start of one finding kind on one GPU (or node)
  until it clears; it is *true* when it matches ground truth of its own kind (a fault of that class, a benign XID
  for ``xid``, an allocated-but-idle stretch for ``idle-capacity``), an *extra alert* when it falls inside a fault
  of another kind on a GPU that fault touches (the GPU, the peers it slows, or its node), and a *false alarm*
  otherwise, whatever its kind: a ``baseline-anomaly`` on a healthy GPU is a false alarm like any other.
  False alarms are reported per kind and severity, per healthy GPU-day.
- **Each extra episode inside a fault is an extra alert**: every fault reports how many episodes (of any kind) a
  user saw while it lasted, so a finding that flaps inside a fault costs what it costs an operator. An episode that
  is the true detection of another fault (its own kind, on that fault's GPU or node, in its window) is that fault's
  alert, counted there once, not also against every fault whose window and GPUs it shares.
- **Matching is tight**: an episode of a fault's class detects it when it is active at any time between the
  fault's start minus ``tolerance_s`` and its end plus the class's grace (:data:`GRACE_S`); an episode still
  active from before (the same GPU's earlier fault) is credited with it. An XID storm is detected by its
  ``xid-storm`` finding only (the ``xid`` finding of its first XID is one more alert of it, not its detection). A
  class's precision leaves out only its episodes inside a fault whose signature holds it (:data:`ALSO_SHOWS`: a
  link retrained narrower replays packets too); they still count as that fault's extra alerts.
- **Undetectable tails are excluded by rule and counted**: a fault that starts less than its class's
  :data:`MIN_VISIBLE_S` before the run ends cannot have shown its signature yet; it leaves the denominator and the
  report says how many did.
- Recall is also reported per magnitude band of graded faults (producers.simulator.plan.MAGNITUDES), and the
  plan's injections that never found a target are reported, not silently dropped.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np

from pipeline.events import SEVERITY_RANK, FaultRecord, Finding, Severity
from pipeline.health.fold import FiringFinding, reason_of
from pipeline.health.states import BADNESS, Health
from pipeline.kinds import DEFAULT_GRACE_S, EVENT_KINDS, FAULTS, KINDS, WASTE_KINDS

_S: Final = 1_000_000_000
DAY_S: Final = 86_400.0
#: finding kinds a user is paged for (their false alarms have the tightest budget)
PAGING: Final = (Severity.CRITICAL, Severity.WARNING)
#: the evaluation's columns of the one table of kinds (pipeline.kinds.Kind: ``grace_s``, ``min_visible_s``, ``hard``
#: and ``counted``, ``also_shows``): how long after a fault ends a detection of it still counts, the least time a
#: fault needs to show at all (faults starting closer than this to the end of the run are excluded by rule), the
#: classes judged against the "hard events" bar, and the kinds a class's signature holds (a link retrained narrower
#: replays its packets too: its replay-storm finding is one more alert of that fault, not a false replay storm)
GRACE_S: Final[Mapping[str, float]] = {k.name: k.grace_s for k in KINDS}
MIN_VISIBLE_S: Final[Mapping[str, float]] = {k.name: k.min_visible_s for k in KINDS if k.min_visible_s}
#: the hard classes whose own finding must come at once (a counted one's cannot: its GPU's state must)
PROMPT: Final = tuple(k.name for k in KINDS if k.hard and not k.counted)
ALSO_SHOWS: Final[Mapping[str, tuple[str, ...]]] = {k.name: k.also_shows for k in KINDS if k.also_shows}


#: the state each hard fault class must give its GPU (issue 12: a hard fault makes it unhealthy within 5 s). An
#: application's XID storm (13/31/43/45, as the simulator injects) is the application's (Xid catalog RESTART_APP):
#: its GPU is degraded, restart the job, and calling it unhealthy would be wrong; an NVLink down is at least
#: degraded (unhealthy when critical); a row remap waiting for its reset leaves a GPU that works: degraded, reset it
HEALTH_EXPECTED: Final[Mapping[str, Health]] = {
    "ecc-uncorrectable": Health.UNHEALTHY,
    "fallen-off-bus": Health.UNHEALTHY,
    "nvlink-down": Health.DEGRADED,
    "xid-storm": Health.DEGRADED,
    "row-remap": Health.DEGRADED,
}


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The acceptance thresholds of the evaluation (issue: judgement that holds on real telemetry)."""

    f1_min: float = 0.95
    #: critical and warning findings that page someone
    paging_false_alarms_per_gpu_day_max: float = 1e-3
    #: any finding kind shown to a user
    kind_false_alarms_per_gpu_day_max: float = 0.05
    hard_delay_median_s: float = 5.0
    straggler_delay_median_s: float = 60.0
    #: recall for stragglers at least this slow
    straggler_recall_min: float = 0.9
    straggler_recall_from: float = 0.15
    classification_min: float = 0.9
    #: a hard fault's GPU reaches its state (HEALTH_EXPECTED) within this long of the fault's start
    health_delay_s: float = 5.0
    #: healthy GPUs called unhealthy
    false_unhealthy_per_gpu_day_max: float = 1e-3


@dataclass(frozen=True, slots=True)
class Episode:
    """One start of one finding kind on one GPU (``gpu_uuid`` None: on a node) until it cleared (``end_ns``: its
    clear, or the end of the run when it never did), at the highest severity it reached."""

    detector: str
    severity: Severity
    cluster: str
    node: str
    gpu_uuid: str | None
    start_ns: int
    end_ns: int
    #: the XID its first finding's evidence named (a storm: its last), which decides the health it gives
    xid: float | None = None

    def overlaps(self, lo_ns: int, hi_ns: int) -> bool:
        return self.start_ns <= hi_ns and self.end_ns >= lo_ns

    @property
    def health(self) -> Health:
        """The state this episode gives its GPU (pipeline.health): healthy when it changes none."""
        evidence = {} if self.xid is None else {"xid": self.xid}
        reason = reason_of(
            FiringFinding({"detector": self.detector, "severity": self.severity.value}, "", self.start_ns, evidence)
        )
        return Health.HEALTHY if reason is None else reason.state


def episodes(findings: Iterable[Finding], run_end_ns: int) -> list[Episode]:
    """The episodes among findings: a finding's repeats and its clear share its ``since_ns``."""
    seen: dict[tuple[str, str, str, str | None, int], list[Finding]] = {}
    for f in findings:
        seen.setdefault((f.detector, f.cluster, f.node, f.gpu_uuid, f.since_ns), []).append(f)
    out = []
    for (detector, cluster, node, gpu, since), fs in seen.items():
        cleared = [f.ts_ns for f in fs if not f.active]
        severity = max((f.severity for f in fs), key=SEVERITY_RANK.__getitem__)
        xid = fs[0].evidence.get("xid", fs[0].evidence.get("last_xid"))
        end = min(cleared) if cleared else run_end_ns
        out.append(Episode(detector, severity, cluster, node, gpu, since, end, xid))
    return sorted(out, key=lambda e: (e.start_ns, e.detector, e.gpu_uuid or ""))


@dataclass(frozen=True, slots=True)
class Truth:
    """One piece of ground truth: a fault (or benign event, or idle stretch) and every GPU it touches."""

    record: FaultRecord
    #: GPUs the fault touches: its own and the peers it slows (empty for node-level faults: the whole node)
    gpus: frozenset[str]
    #: until when a detection of it still counts
    grace_end_ns: int

    @property
    def kind(self) -> str:
        return self.record.fault

    def touches(self, e: Episode) -> bool:
        """``e`` is on a GPU the fault touches (its own or a peer it slows, on whatever node: a multi-node job's), or
        on the fault's node where the fault or the episode is the node's."""
        r = self.record
        if e.cluster != r.cluster:
            return False
        if e.gpu_uuid is not None and e.gpu_uuid in self.gpus:
            return True
        return e.node == r.node and (r.gpu_uuid is None or e.gpu_uuid is None)

    def places(self, node_of: Mapping[tuple[str, str], str]) -> set[tuple[str, str]]:
        """The (cluster, node)s it touches: its own, and those of the peers it slows (``node_of``: (cluster, GPU
        uuid) -> node)."""
        r = self.record
        peers = {(r.cluster, node_of[(r.cluster, u)]) for u in self.gpus if (r.cluster, u) in node_of}
        return {(r.cluster, r.node)} | peers

    def matches(self, e: Episode, tolerance_ns: int) -> bool:
        """``e`` is an episode of this truth's kind on its GPU (or node), active while it could be detected."""
        r = self.record
        same_place = (e.cluster, e.node) == (r.cluster, r.node) and (r.gpu_uuid is None or e.gpu_uuid == r.gpu_uuid)
        return e.detector == r.fault and same_place and e.overlaps(r.start_ns - tolerance_ns, self.grace_end_ns)


def truths(
    records: Iterable[FaultRecord], run_end_ns: int, peers: Mapping[tuple[str, int], Sequence[str]]
) -> list[Truth]:
    """One :class:`Truth` per record (a fault sent at its start and again at its end counts once, the latest end
    winning; a fault still open lasts until the end of the run). ``peers``: (GPU uuid, fault start) -> the GPUs of
    its job it slows down (where the producer knows them)."""
    merged: dict[tuple[str, str, str | None, str, int], FaultRecord] = {}
    for r in records:
        key = (r.cluster, r.node, r.gpu_uuid, r.fault, r.start_ns)
        old = merged.get(key)
        if old is None or r.end_ns > old.end_ns:
            merged[key] = r
    out = []
    for r in merged.values():
        instant = r.fault in EVENT_KINDS
        end = r.start_ns if instant else (r.end_ns if r.end_ns > r.start_ns else run_end_ns)
        rec = FaultRecord(r.cluster, r.node, r.gpu_uuid, r.fault, r.start_ns, end, r.detail, r.magnitude)
        own = () if r.gpu_uuid is None else (r.gpu_uuid,)
        gpus = frozenset((*own, *peers.get((r.gpu_uuid or "", r.start_ns), ())))
        grace = 0.0 if instant or r.fault in WASTE_KINDS else GRACE_S.get(r.fault, DEFAULT_GRACE_S)
        out.append(Truth(rec, gpus, end + int(grace * _S)))
    return sorted(out, key=lambda t: (t.record.start_ns, t.kind))


@dataclass(frozen=True, slots=True)
class ClassScore:
    """One fault class (or event / waste kind): faults, detections, episodes and delays."""

    fault: str
    faults: int
    detected: int
    episodes: int
    true_episodes: int
    delays_s: tuple[float, ...] = ()
    #: faults left out because they started too close to the end of the run to show
    excluded: int = 0
    #: (band low, band high, faults, detected) for graded classes
    bands: tuple[tuple[float, float, int, int], ...] = ()
    #: episodes of any kind a user saw per fault of this class (1 = exactly one alert)
    alerts_per_fault: tuple[int, ...] = ()

    @property
    def precision(self) -> float | None:
        return self.true_episodes / self.episodes if self.episodes else None

    @property
    def recall(self) -> float | None:
        return self.detected / self.faults if self.faults else None

    @property
    def f1(self) -> float | None:
        p, r = self.precision, self.recall
        if self.faults == 0:
            return None
        if not p or not r:
            return 0.0
        return 2 * p * r / (p + r)

    @property
    def delay_median_s(self) -> float | None:
        return float(np.median(self.delays_s)) if self.delays_s else None

    @property
    def delay_p95_s(self) -> float | None:
        return float(np.percentile(self.delays_s, 95)) if self.delays_s else None

    @property
    def alerts_mean(self) -> float | None:
        return float(np.mean(self.alerts_per_fault)) if self.alerts_per_fault else None

    def recall_from(self, magnitude: float, milder_above: bool = False) -> float | None:
        """Recall over the graded faults at least as strong as ``magnitude``."""
        keep = [(f, d) for lo, hi, f, d in self.bands if (hi <= magnitude if milder_above else lo >= magnitude)]
        faults = sum(f for f, _ in keep)
        return sum(d for _, d in keep) / faults if faults else None


@dataclass(frozen=True, slots=True)
class HealthScore:
    """How soon the GPUs of one hard fault class reached the state the class must give them (by any finding)."""

    fault: str
    expected: Health
    faults: int
    #: seconds from each fault's start to its GPU's first reaching the state, for the faults where it did
    delays_s: tuple[float, ...]

    def in_time(self, limit_s: float) -> int:
        return sum(1 for d in self.delays_s if d <= limit_s)

    @property
    def delay_median_s(self) -> float | None:
        return float(np.median(self.delays_s)) if self.delays_s else None


@dataclass(frozen=True, slots=True)
class Classification:
    """Inferred application vs the true one, over the rows whose context was withheld."""

    rows: int
    correct: int
    confusion: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.rows if self.rows else None


@dataclass(frozen=True, slots=True)
class Evaluation:
    classes: tuple[ClassScore, ...]
    #: false alarms per (finding kind, severity)
    false_alarms: dict[tuple[str, Severity], int]
    healthy_gpu_days: float
    classification: Classification | None = None
    false_alarm_examples: tuple[Episode, ...] = ()
    #: injections a quota plan never placed, per class
    unplaced: dict[str, int] = field(default_factory=dict)
    health: tuple[HealthScore, ...] = ()
    #: episodes that called a GPU unhealthy outside every fault and true event
    false_unhealthy: int = 0

    def false_alarm_rate(
        self, kinds: Iterable[str] | None = None, severities: Iterable[Severity] = tuple(Severity)
    ) -> float | None:
        """False alarms per healthy GPU-day, of the given kinds (all: None) and severities."""
        if self.healthy_gpu_days <= 0:
            return None
        wanted, sev = None if kinds is None else set(kinds), set(severities)
        n = sum(c for (k, s), c in self.false_alarms.items() if s in sev and (wanted is None or k in wanted))
        return n / self.healthy_gpu_days

    @property
    def false_alarm_total(self) -> int:
        return sum(self.false_alarms.values())

    @property
    def paging_false_alarms(self) -> int:
        """False alarms of the severities that page (critical, warning)."""
        return sum(n for (_, sev), n in self.false_alarms.items() if sev in PAGING)

    def by_class(self, fault: str) -> ClassScore | None:
        return next((c for c in self.classes if c.fault == fault), None)


def score(
    findings: Iterable[Finding],
    records: Iterable[FaultRecord],
    observed: dict[tuple[str, str, str], tuple[int, int]],
    *,
    run_end_ns: int,
    tolerance_s: float = 30.0,
    peers: Mapping[tuple[str, int], Sequence[str]] | None = None,
    classification: Classification | None = None,
    unplaced: Mapping[str, int] | None = None,
    magnitudes: Mapping[str, tuple[float, ...]] | None = None,
) -> Evaluation:
    """Score findings against ground truth by the rules in the module docstring. ``observed`` maps each GPU
    (cluster, node, uuid) to the first and last time it was seen (its share of healthy GPU-days); ``magnitudes``
    gives each graded class's band edges."""
    tol = int(tolerance_s * _S)
    eps = episodes(findings, run_end_ns)
    truth = truths(records, run_end_ns, peers or {})
    by_node: dict[tuple[str, str], list[int]] = {}
    for i, e in enumerate(eps):
        by_node.setdefault((e.cluster, e.node), []).append(i)
    node_of = _nodes_of(observed, eps)
    faults = [t for t in truth if t.kind in FAULTS]
    # a fault is looked up on every node it touches: a multi-node job's peers wait on it from their own nodes
    faults_at: dict[tuple[str, str], list[Truth]] = {}
    near_of: dict[int, list[int]] = {}
    for t in faults:
        places = t.places(node_of)
        for place in places:
            faults_at.setdefault(place, []).append(t)
        near_of[id(t)] = sorted(i for place in places for i in by_node.get(place, []))

    def in_fault(e: Episode, showing: bool = False) -> bool:
        """``e`` falls inside a fault (``showing``: a fault of a class whose signature holds ``e``'s kind)."""
        return any(
            t.touches(e)
            and e.overlaps(t.record.start_ns - tol, t.grace_end_ns)
            and (not showing or e.detector in ALSO_SHOWS.get(t.kind, ()))
            for t in faults_at.get((e.cluster, e.node), ())
        )

    inside = [in_fault(e) for e in eps]
    # the faults each episode is a true detection of: such an episode is the alert of its own fault, not one more
    # alert of every other fault whose window and GPUs it shares (two faults in one job, on one node)
    detects: dict[int, set[int]] = {}
    for t in faults:
        for i in by_node.get((t.record.cluster, t.record.node), []):
            if t.matches(eps[i], tol):
                detects.setdefault(i, set()).add(id(t))
    matched: set[int] = set()
    classes = []
    for kind in (*FAULTS, *EVENT_KINDS, *WASTE_KINDS):
        mine = [t for t in truth if t.kind == kind]
        found = [i for i, e in enumerate(eps) if e.detector == kind]
        if kind not in FAULTS:
            # an XID or an idle stretch inside a fault belongs to the fault (an extra alert of it), not to this kind
            mine = [t for t in mine if not in_fault(_as_episode(t))]
            found = [i for i in found if not inside[i]]
        else:
            found = [i for i in found if not in_fault(eps[i], showing=True)]
        min_visible = int(MIN_VISIBLE_S.get(kind, 0.0) * _S)
        visible = [run_end_ns - t.record.start_ns >= min_visible for t in mine]
        delays, alerts, hit = [], [], []
        for t, shows in zip(mine, visible, strict=True):
            near = by_node.get((t.record.cluster, t.record.node), [])
            hits = [i for i in near if t.matches(eps[i], tol)]
            matched.update(hits)
            hit.append(bool(hits))
            if not shows:
                continue
            if hits:
                delays.append(max(0.0, (min(eps[i].start_ns for i in hits) - t.record.start_ns) / _S))
            if kind in FAULTS:
                seen, me = (t.record.start_ns, t.grace_end_ns), id(t)
                alerts.append(
                    sum(
                        1
                        for i in near_of[id(t)]
                        if t.touches(eps[i]) and eps[i].overlaps(*seen) and me in detects.get(i, {me})
                    )
                )
        bands = _bands(mine, visible, hit, (magnitudes or {}).get(kind, ()))
        classes.append(
            ClassScore(
                kind,
                sum(visible),
                sum(1 for v, h in zip(visible, hit, strict=True) if v and h),
                len(found),
                sum(1 for i in found if i in matched),
                tuple(delays),
                len(mine) - sum(visible),
                bands,
                tuple(alerts),
            )
        )
    unexplained = [e for i, e in enumerate(eps) if i not in matched and not inside[i]]
    false, examples, false_unhealthy = _false_alarms(unexplained)
    return Evaluation(
        tuple(classes),
        false,
        healthy_gpu_days(observed, faults),
        classification,
        examples,
        dict(unplaced or {}),
        _health_scores(eps, truth, by_node, tol, run_end_ns),
        false_unhealthy,
    )


def _bands(
    mine: list[Truth], visible: list[bool], hit: list[bool], edges: tuple[float, ...]
) -> tuple[tuple[float, float, int, int], ...]:
    """Per magnitude band of a graded class: (low edge, high edge, visible faults in it, found); the top band
    holds its high edge."""
    out = []
    for j, (lo, hi) in enumerate(itertools.pairwise(edges)):
        band = [k for k, t in enumerate(mine) if visible[k] and _in_band(t, lo, hi, j == len(edges) - 2)]
        out.append((lo, hi, len(band), sum(1 for k in band if hit[k])))
    return tuple(out)


def _false_alarms(false_eps: list[Episode]) -> tuple[dict[tuple[str, Severity], int], tuple[Episode, ...], int]:
    """The episodes neither matched to a fault nor inside one, counted by (detector, severity); the first 20 as
    examples; how many made a GPU unhealthy."""
    counts: dict[tuple[str, Severity], int] = {}
    for e in false_eps:
        counts[(e.detector, e.severity)] = counts.get((e.detector, e.severity), 0) + 1
    return counts, tuple(false_eps[:20]), sum(e.health is Health.UNHEALTHY for e in false_eps)


def _health_scores(
    eps: list[Episode], truth: list[Truth], by_node: Mapping[tuple[str, str], list[int]], tol: int, run_end_ns: int
) -> tuple[HealthScore, ...]:
    """Per hard fault class: from each visible fault's start, how long until an episode on its GPU (node) gave the
    state the class must give (or a worse one), while the fault could be detected."""
    out = []
    for kind, expected in HEALTH_EXPECTED.items():
        min_visible = int(MIN_VISIBLE_S.get(kind, 0.0) * _S)
        shown = [t for t in truth if t.kind == kind and run_end_ns - t.record.start_ns >= min_visible]
        delays = []
        for t in shown:
            starts = [
                eps[i].start_ns
                for i in by_node.get((t.record.cluster, t.record.node), ())
                if t.touches(eps[i])
                and eps[i].overlaps(t.record.start_ns - tol, t.grace_end_ns)
                and BADNESS[eps[i].health] >= BADNESS[expected]
            ]
            if starts:
                delays.append(max(0.0, (min(starts) - t.record.start_ns) / _S))
        out.append(HealthScore(kind, expected, len(shown), tuple(delays)))
    return tuple(out)


def _as_episode(t: Truth) -> Episode:
    """A piece of ground truth as if it were an episode (for asking whether it falls inside a fault)."""
    r = t.record
    return Episode(r.fault, Severity.INFO, r.cluster, r.node, r.gpu_uuid, r.start_ns, r.end_ns)


def combine(evs: Sequence[Evaluation]) -> Evaluation:
    """Several evaluations (seeds) as one: counts added, delays and alerts pooled, rates recomputed."""
    classes = []
    for kind in [c.fault for c in evs[0].classes]:
        cs = [c for e in evs for c in e.classes if c.fault == kind]
        bands: dict[tuple[float, float], tuple[int, int]] = {}
        for c in cs:
            for lo, hi, n, d in c.bands:
                n0, d0 = bands.get((lo, hi), (0, 0))
                bands[(lo, hi)] = (n0 + n, d0 + d)
        classes.append(
            ClassScore(
                kind,
                sum(c.faults for c in cs),
                sum(c.detected for c in cs),
                sum(c.episodes for c in cs),
                sum(c.true_episodes for c in cs),
                tuple(d for c in cs for d in c.delays_s),
                sum(c.excluded for c in cs),
                tuple((lo, hi, n, d) for (lo, hi), (n, d) in bands.items()),
                tuple(a for c in cs for a in c.alerts_per_fault),
            )
        )
    false: dict[tuple[str, Severity], int] = {}
    unplaced: dict[str, int] = {}
    for e in evs:
        for k, v in e.false_alarms.items():
            false[k] = false.get(k, 0) + v
        for f, n in e.unplaced.items():
            unplaced[f] = unplaced.get(f, 0) + n
    cls = [e.classification for e in evs if e.classification is not None]
    classification = Classification(sum(c.rows for c in cls), sum(c.correct for c in cls)) if cls else None
    examples = tuple(x for e in evs for x in e.false_alarm_examples)[:20]
    health = tuple(
        HealthScore(h.fault, h.expected, sum(x.faults for x in hs), tuple(d for x in hs for d in x.delays_s))
        for h in evs[0].health
        for hs in [[x for e in evs for x in e.health if x.fault == h.fault]]
    )
    return Evaluation(
        tuple(classes),
        false,
        sum(e.healthy_gpu_days for e in evs),
        classification,
        examples,
        unplaced,
        health,
        sum(e.false_unhealthy for e in evs),
    )


def _in_band(t: Truth, lo: float, hi: float, last: bool) -> bool:
    m = t.record.magnitude
    return m is not None and lo <= m and (m <= hi if last else m < hi)


def healthy_gpu_days(observed: dict[tuple[str, str, str], tuple[int, int]], faults: Sequence[Truth]) -> float:
    """GPU-days observed without a fault touching the GPU (its own, one slowing it as a peer, or its node's),
    fault windows extended by their grace; events and idle stretches are not faults."""
    node_of = _nodes_of(observed, ())
    spans_of: dict[tuple[str, str], list[Truth]] = {}
    for t in (t for t in faults if t.kind in FAULTS):
        for place in t.places(node_of):
            spans_of.setdefault(place, []).append(t)
    total = 0.0
    for (cluster, node, uuid), (first, last) in observed.items():
        spans = sorted(
            (max(first, t.record.start_ns), min(last, t.grace_end_ns))
            for t in spans_of.get((cluster, node), ())
            if uuid in t.gpus or (t.record.gpu_uuid is None and node == t.record.node)
        )
        faulty, cursor = 0, first
        for a, b in spans:
            lo = max(a, cursor)
            if b > lo:
                faulty += b - lo
                cursor = b
        total += max(0, last - first - faulty) / _S / DAY_S
    return total


def _nodes_of(
    observed: Mapping[tuple[str, str, str], tuple[int, int]], eps: Iterable[Episode]
) -> dict[tuple[str, str], str]:
    """(cluster, GPU uuid) -> its node, from the GPUs observed and the episodes."""
    found = {(c, u): n for c, n, u in observed}
    found.update({(e.cluster, e.gpu_uuid): e.node for e in eps if e.gpu_uuid is not None})
    return found


def classify_score(pairs: Iterable[tuple[str | None, str]]) -> Classification:
    """Accuracy of (predicted, true) application pairs; a missing prediction counts as wrong."""
    rows = correct = 0
    confusion: dict[tuple[str, str], int] = {}
    for predicted, true in pairs:
        rows += 1
        got = predicted or "none"
        correct += got == true
        confusion[(true, got)] = confusion.get((true, got), 0) + 1
    return Classification(rows, correct, confusion)


def number(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def failures(ev: Evaluation, thresholds: Thresholds, milder_above: Mapping[str, bool] | None = None) -> list[str]:
    """Every acceptance threshold the evaluation missed, one line each (empty: accepted)."""
    out = []
    for c in ev.classes:
        if c.fault not in FAULTS:
            continue
        if c.faults == 0:
            out.append(f"{c.fault}: no fault of this class was injected, so it was not evaluated")
        elif (c.f1 or 0.0) < thresholds.f1_min:
            out.append(f"{c.fault}: F1 {c.f1:.2f} < {thresholds.f1_min}")
        median = c.delay_median_s
        if c.fault in PROMPT and median is not None and median >= thresholds.hard_delay_median_s:
            out.append(f"{c.fault}: median detection delay {median:.0f} s >= {thresholds.hard_delay_median_s:g} s")
    for fault, n in sorted(ev.unplaced.items()):
        if n:
            out.append(f"{fault}: {n} injection(s) of the plan never found a target")
    straggler = ev.by_class("straggler")
    if straggler is not None and straggler.faults:
        median = straggler.delay_median_s
        if median is None or median > thresholds.straggler_delay_median_s:
            out.append(
                f"straggler: median detection delay {number(median, '.0f')} s "
                f"> {thresholds.straggler_delay_median_s:g} s"
            )
        recall = straggler.recall_from(thresholds.straggler_recall_from)
        if straggler.bands and (recall is None or recall < thresholds.straggler_recall_min):
            out.append(
                f"straggler: recall {number(recall)} for stragglers >= {thresholds.straggler_recall_from:.0%} "
                f"slow < {thresholds.straggler_recall_min}"
            )
    paging = ev.false_alarm_rate(severities=PAGING)
    if paging is None:
        out.append("no healthy GPU time observed")
    else:
        if paging > thresholds.paging_false_alarms_per_gpu_day_max:
            out.append(
                f"paging false alarms {paging:.2g} per healthy GPU-day > "
                f"{thresholds.paging_false_alarms_per_gpu_day_max:g}"
            )
        for kind in sorted({k for k, _ in ev.false_alarms}):
            rate = ev.false_alarm_rate([kind]) or 0.0
            if rate > thresholds.kind_false_alarms_per_gpu_day_max:
                out.append(
                    f"{kind}: {rate:.3f} false alarms per healthy GPU-day > "
                    f"{thresholds.kind_false_alarms_per_gpu_day_max:g}"
                )
    for h in ev.health:
        late = h.faults - h.in_time(thresholds.health_delay_s)
        if late:
            out.append(
                f"{h.fault}: {late} of {h.faults} GPUs not {h.expected.value} (or worse) within "
                f"{thresholds.health_delay_s:g} s"
            )
    if (
        ev.healthy_gpu_days > 0
        and ev.false_unhealthy / ev.healthy_gpu_days > thresholds.false_unhealthy_per_gpu_day_max
    ):
        out.append(
            f"false unhealthy {ev.false_unhealthy / ev.healthy_gpu_days:.2g} per healthy GPU-day > "
            f"{thresholds.false_unhealthy_per_gpu_day_max:g}"
        )
    acc = ev.classification.accuracy if ev.classification else None
    if acc is None:
        out.append("workload classification was not measured (no withheld context)")
    elif acc < thresholds.classification_min:
        out.append(f"workload classification {acc:.3f} < {thresholds.classification_min}")
    return out
