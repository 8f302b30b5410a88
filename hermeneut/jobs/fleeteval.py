"""The offline, fleet-scale evaluation (``hermeneut evaluate --offline``): thousands of simulated GPU-days through the
processor's own interpretation code in this process, scored by the rules of :mod:`hermeneut.jobs.evaluation`.

**Offline** means without Kafka and InfluxDB: each round of a seeded :class:`~producers.simulator.Fleet` is encoded
as the raw node messages a collector would publish and goes through the same functions the faust agent calls
(``process_raw``, then :func:`processors.app.interpreter_from`'s stages: enrichment, scoring, detectors, with
``tick`` once per round), so every verdict and finding is the one a live processor would reach on that data. What
this cannot show (message sizes, delivery, storage) the Kafka evaluation (``hermeneut evaluate``) keeps measuring.

One run, per seed:

1. A fleet whose node kinds and application mixes are drawn from the seed (``mix="seeded"``), sampled every
   ``interval_s``, with per-link NVLink samples, processes, NIC ports and benign XIDs.
2. **Day one** (``learn_hours``): the fleet runs healthy, no fault injected, with no learned baselines, as a new
   installation would; its findings are scored too (a new installation's false alarms).
3. The rows of that stretch whose application a context source named train baselines and the classifier
   (``processors.baselines.fit.fit_version``, the same fit ``hermeneut baselines train`` runs), which the running
   interpreter then uses, as a processor hot-reloads a published version. With ``learn_seed`` they are learned on
   another fleet instead: that seed's node kinds, application mix and jobs, as many healthy hours, the same
   cluster (the installation's fleet as it was when it learned; an (application, model) it never ran is judged
   by the public priors alone), so the baselines never judge the very fleet they were fitted on.
4. **After learning** (``hours``): faults injected by quota (each class ``per_class`` times, graded magnitudes,
   compound faults), a share of nodes (``withhold``) without any context (classification is measured there).
5. Ground truth: the injector's faults (with the peers each slows), every XID the fleet reported, and
   allocated-but-idle stretches (a job holds the GPU, its utilization stays under 5 % for 10 minutes or more).
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
from tqdm import tqdm

from hermeneut.jobs.evaljob import Interrupt, withheld
from hermeneut.jobs.evaluation import Evaluation, classify_score, combine, score
from pipeline.baselines import BaselineManifest
from pipeline.codec import encode_samples
from pipeline.config import Settings
from pipeline.events import (
    METRIC_INDEX,
    EventKind,
    FaultRecord,
    Finding,
    GpuContext,
    InterpretedBatch,
    SampleBatch,
    node_key,
)
from processors.app import interpreter_from
from processors.baselines.fit import LabelledRows, fit_version
from processors.baselines.store import BaselineSet
from processors.enrich import ContextTimeline
from processors.features import PHASE_INDEX, features_of
from processors.interpret import Interpreter
from processors.normalize import RawMessage, process_raw
from producers.agent import stamp_interval
from producers.simulator import Fleet
from producers.simulator.plan import MAGNITUDES, FaultPlan

_S: Final = 1_000_000_000
T0: Final = 1_800_000_000 * _S
#: an allocated GPU whose utilization averaged under this over this long is idle capacity in the ground truth
IDLE_UTIL: Final = 5.0
IDLE_TRUTH_S: Final = 600.0
T = TypeVar("T")

#: raw partitions the messages are spread over (as the processor's takes are split per partition)
PARTITIONS: Final = 6
#: ``--learn-from other``: a seed learns on the fleet of this seed plus its own
LEARN_SEED: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """One offline evaluation run (see the module docstring)."""

    seed: int
    nodes: int = 64
    gpus: int = 8
    #: hours judged after learning, with faults
    hours: float = 46.9
    interval_s: float = 10.0
    #: healthy hours of day one (no baselines), learned from afterwards
    learn_hours: float = 3.0
    per_class: int = 12
    withhold: float = 0.25
    compound: float = 0.2
    #: the least time before the end of the run a quota fault may start (its signature must have time to show)
    tail_s: float = 1800.0
    #: learn the baselines on this seed's fleet (None: on the judged fleet's own day one)
    learn_seed: int | None = None

    @property
    def gpu_days(self) -> float:
        return self.nodes * self.gpus * self.hours / 24.0


@dataclass
class Outcome:
    """What one run measured: day one (healthy, no baselines) and after learning (faults, baselines)."""

    plan: FleetPlan
    day_one: Evaluation
    after: Evaluation
    samples: int
    dead_lettered: int
    baselines: int
    seconds: float
    withheld_nodes: list[str] = field(default_factory=list)
    #: every finding of the run, and the ground truth (for a closer look at what the scores count)
    findings: list[Finding] = field(default_factory=list)
    truth: list[FaultRecord] = field(default_factory=list)


class _Truth:
    """The ground truth a run collects: fault records with their peers, idle stretches, each GPU's true app."""

    def __init__(
        self, fleet_cluster: str, nodes: list[str], uuids: list[str], gpus_per_node: int, interval_s: float
    ) -> None:
        self.cluster = fleet_cluster
        self.node_of = [nodes[i // gpus_per_node] for i in range(len(uuids))]
        self.uuids = uuids
        self.records: list[FaultRecord] = []
        self.peers: dict[tuple[str, int], tuple[str, ...]] = {}
        self.apps: dict[str, list[tuple[int, str]]] = {}
        self._idle_since = np.full(len(uuids), -1, dtype=np.int64)
        #: each GPU's utilization over the last IDLE_TRUTH_S (NaN: not allocated then, or not reported)
        self._window = np.full((len(uuids), max(1, round(IDLE_TRUTH_S / interval_s))), np.nan)

    def see(self, ts: int, records: list[FaultRecord], peers: Callable[[FaultRecord], tuple[str, ...]]) -> None:
        for r in records:
            self.records.append(r)
            self.peers[(r.gpu_uuid or "", r.start_ns)] = peers(r)

    def xids(self, batches: list[SampleBatch]) -> None:
        """Every XID the fleet reported is true: an ``xid`` finding about it tells the user what happened."""
        self.records += [
            FaultRecord(e.cluster, e.node, e.gpu_uuid, "xid", e.ts_ns, e.ts_ns, f"XID {e.code}")
            for b in batches
            for e in b.events
            if e.kind == EventKind.XID
        ]

    def idle(self, ts: int, allocated: np.ndarray, util: np.ndarray, last: bool = False) -> None:
        """Track allocated-but-idle stretches: a job held the GPU for the whole of the last IDLE_TRUTH_S and its
        utilization averaged under IDLE_UTIL over it (``util`` NaN: the GPU did not report)."""
        self._window = np.roll(self._window, -1, axis=1)
        self._window[:, -1] = np.where(allocated, util, np.nan)
        with np.errstate(invalid="ignore"):
            idle = ~np.isnan(self._window).any(axis=1) & (self._window.mean(axis=1) < IDLE_UTIL)
        start = idle & (self._idle_since < 0)
        self._idle_since[start] = ts - int(IDLE_TRUTH_S * _S)
        ended = (~idle | last) & (self._idle_since >= 0)
        for g in np.flatnonzero(ended).tolist():
            since = int(self._idle_since[g])
            what = "allocated, utilization under 5%"
            self.records.append(
                FaultRecord(self.cluster, self.node_of[g], self.uuids[g], "idle-capacity", since, ts, what)
            )
            self._idle_since[g] = -1

    def app_at(self, uuid: str, ts: int) -> str | None:
        seen = self.apps.get(uuid)
        if not seen:
            return None
        k = int(np.searchsorted([t for t, _ in seen], ts, side="right")) - 1
        return seen[k][1] if k >= 0 else None


def _fleet(plan: FleetPlan, cluster: str, learn_s: float) -> Fleet:
    """The seeded fleet, its faults drawn by grade and class quota into the judged hours (none while it learns)."""
    window = (learn_s + 600.0, max(learn_s + 601.0, learn_s + plan.hours * 3600 - plan.tail_s))
    faults = FaultPlan(
        rate_scale=0.0,
        graded=True,
        quota=plan.per_class,
        quota_window_s=window,
        compound=plan.compound,
        min_duration_s=300.0,
        max_duration_s=2400.0,
    )
    return Fleet(plan.nodes, plan.gpus, cluster, plan.seed, faults=faults, extras=True, mix="seeded")


def _scores(
    fleet: Fleet,
    truth: _Truth,
    findings: list[Finding],
    observed: list[dict[tuple[str, str, str], tuple[int, int]]],
    times: tuple[int, int, int],
    pairs: list[tuple[str | None, str]],
    classified: bool,
) -> tuple[Evaluation, Evaluation]:
    """Day one and after learning scored apart: ``times`` is (the first judged round, the last round, a round's
    length) in ns; the classification is scored where nodes were withheld from their context."""
    split, end_ns, dt = times
    day_one = score(
        [f for f in findings if f.since_ns < split],
        [t for t in truth.records if t.start_ns < split],
        observed[0],
        run_end_ns=split - dt,
        peers=truth.peers,
    )
    after = score(
        [f for f in findings if f.since_ns >= split],
        [t for t in truth.records if t.start_ns >= split],
        observed[1],
        run_end_ns=end_ns,
        peers=truth.peers,
        classification=classify_score(pairs) if classified else None,
        unplaced=fleet.injector.unplaced,
        magnitudes={k: m.bands for k, m in MAGNITUDES.items()},
    )
    return day_one, after


def run(plan: FleetPlan, settings: Settings | None = None, progress: bool = True) -> Outcome:
    """One offline evaluation run (see the module docstring)."""
    settings = settings or Settings()
    started = time.monotonic()
    dt = int(plan.interval_s * _S)
    learn_rounds = max(1, round(plan.learn_hours * 3600 / plan.interval_s))
    judged_rounds = max(1, round(plan.hours * 3600 / plan.interval_s))
    cluster = f"offline-{plan.seed}"
    fleet = _fleet(plan, cluster, learn_rounds * plan.interval_s)
    hidden = sorted({n for n in fleet.nodes if withheld(n, plan.withhold, plan.seed)})
    truth = _Truth(cluster, fleet.nodes, fleet.uuids, plan.gpus, plan.interval_s)

    contexts: dict[bytes, GpuContext] = {}
    timeline = ContextTimeline()
    current: list[BaselineSet | None] = [None]
    interpreter = _interpreter(settings, fleet, contexts, timeline, lambda: current[0])
    limits = settings.validation

    findings: list[Finding] = []
    observed: list[dict[tuple[str, str, str], tuple[int, int]]] = [{}, {}]
    pairs: list[tuple[str | None, str]] = []
    learned: dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
    samples = dead = 0
    util_col = METRIC_INDEX["utilization_gpu_percent"]
    total = learn_rounds + judged_rounds
    rounds = total + (learn_rounds if plan.learn_seed is not None else 0)
    bar = tqdm(total=rounds, desc=f"seed {plan.seed}: day one", unit=" rounds", disable=not progress, mininterval=2.0)
    gpu_index = {u: i for i, u in enumerate(fleet.uuids)}
    for r in range(total):
        ts = T0 + r * dt
        phase = 0 if r < learn_rounds else 1
        if r == learn_rounds:
            if plan.learn_seed is not None:
                bar.set_description(f"seed {plan.seed}: learning on seed {plan.learn_seed}'s fleet")
                learned = _learn_elsewhere(plan, plan.learn_seed, cluster, settings, learn_rounds, bar)
            current[0] = _fit(learned, frozenset({cluster}), settings, ts)
            bar.set_description(f"seed {plan.seed}: after learning")
        rnd = fleet.round(ts)
        truth.see(ts, rnd.ground_truth, _peers_of(fleet))
        truth.xids(rnd.batches)
        for c in rnd.contexts:
            app = c.workload.application if c.workload is not None else "idle"
            truth.apps.setdefault(c.gpu_uuid, []).append((c.ts_ns, app))
            if c.node not in hidden:
                contexts[c.kafka_key] = c
                timeline.see(c.kafka_key, c)
        outcome = process_raw(_messages(rnd.batches, cluster, r, plan.interval_s), ts, limits)
        samples += outcome.samples_ok
        dead += len(outcome.dead)
        util = np.full(fleet.size, np.nan)
        allocated = np.zeros(fleet.size, dtype=bool)
        for _part, normalized in outcome.forward:
            batch, found = interpreter.apply(normalized, ts)
            findings += found
            _observe(batch, observed[phase])
            rows = [gpu_index[u] for u in batch.gpu_uuid]
            util[rows] = batch.metrics[:, util_col]
            allocated[rows] = [_allocated(truth, u, ts) for u in batch.gpu_uuid]
            if phase == 0:
                if plan.learn_seed is None:
                    _remember(batch, learned)
            else:
                pairs += [
                    (wl.application if wl is not None else None, true)
                    for n, u, wl in zip(batch.node, batch.gpu_uuid, batch.workload, strict=True)
                    if n in hidden and (true := truth.app_at(u, ts)) is not None
                ]
        truth.idle(ts, allocated, util, last=r == total - 1)
        findings += interpreter.tick(ts)
        bar.update(1)
    bar.close()
    split = T0 + learn_rounds * dt
    day_one, after = _scores(fleet, truth, findings, observed, (split, T0 + (total - 1) * dt, dt), pairs, bool(hidden))
    baselines = 0 if current[0] is None else len(current[0].baselines)
    return Outcome(
        plan, day_one, after, samples, dead, baselines, time.monotonic() - started, hidden, findings, truth.records
    )


def _learn_elsewhere(
    plan: FleetPlan, seed: int, cluster: str, settings: Settings, rounds: int, bar: tqdm[Any]
) -> Learned:
    """The rows baselines are learned from, taken on another fleet: ``seed``'s, healthy, for ``rounds`` rounds,
    through the same interpretation (its own contexts and topology, no baselines), every node with its context."""
    dt = int(plan.interval_s * _S)
    fleet = Fleet(plan.nodes, plan.gpus, cluster, seed, extras=True, mix="seeded")
    contexts: dict[bytes, GpuContext] = {}
    timeline = ContextTimeline()
    interpreter = _interpreter(settings, fleet, contexts, timeline, lambda: None)
    learned: Learned = {}
    for r in range(rounds):
        ts = T0 + r * dt
        rnd = fleet.round(ts)
        for c in rnd.contexts:
            contexts[c.kafka_key] = c
            timeline.see(c.kafka_key, c)
        outcome = process_raw(_messages(rnd.batches, f"{cluster}/learn", r, plan.interval_s), ts, settings.validation)
        for _part, normalized in outcome.forward:
            batch, _found = interpreter.apply(normalized, ts)
            _remember(batch, learned)
        interpreter.tick(ts)
        bar.update(1)
    return learned


def _interpreter(
    settings: Settings,
    fleet: Fleet,
    contexts: dict[bytes, GpuContext],
    timeline: ContextTimeline,
    baselines: Callable[[], BaselineSet | None],
) -> Interpreter:
    """The processor's interpretation of ``fleet``: its topology, the contexts given so far, ``baselines``."""
    topologies = {t.kafka_key: t for t in fleet.topologies(T0)}
    return interpreter_from(settings, contexts.get, lambda c, n: topologies.get(node_key(c, n)), baselines, timeline)


def _messages(batches: Sequence[SampleBatch], prefix: str, r: int, interval_s: float) -> list[RawMessage]:
    """Round ``r``'s node batches as the raw messages a collector publishes (each sample stamped with its interval,
    as the node agent stamps it: the detectors read a GPU's silence in its own intervals), spread over PARTITIONS."""
    for b in batches:
        stamp_interval(b, interval_s)
    return [
        RawMessage(b.kafka_key, encode_samples(b), f"{prefix}/{i % PARTITIONS}/{r}", i % PARTITIONS)
        for i, b in enumerate(batches)
    ]


def _peers_of(fleet: Fleet) -> Callable[[FaultRecord], tuple[str, ...]]:
    """The GPUs of the fault's job that it slows down, as the injector recorded them."""

    def peers(record: FaultRecord) -> tuple[str, ...]:
        active = next((a for a in fleet.injector.active if a.record == record), None)
        return () if active is None else tuple(fleet.uuids[p] for p in active.peers)

    return peers


def _allocated(truth: _Truth, uuid: str, ts: int) -> bool:
    app = truth.app_at(uuid, ts)
    return app is not None and app not in ("idle", "unknown")


def _observe(batch: InterpretedBatch, observed: dict[tuple[str, str, str], tuple[int, int]]) -> None:
    for key, ts in zip(zip(batch.cluster, batch.node, batch.gpu_uuid, strict=True), batch.ts_ns.tolist(), strict=True):
        first, last = observed.get(key, (ts, ts))
        observed[key] = (min(first, ts), max(last, ts))


Learned = dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]]


def _remember(batch: InterpretedBatch, learned: Learned) -> None:
    """Rows whose application a context source named, per (application, GPU model), for training."""
    f = features_of(batch)
    named = np.array([wl is not None and wl.source != "inferred" for wl in batch.workload], dtype=bool)
    if not named.any():
        return
    apps = np.array([wl.application if wl is not None else "" for wl in batch.workload], dtype=object)
    models = np.asarray(batch.gpu_model, dtype=object)
    phase = np.array([PHASE_INDEX.get(p or "", 0) for p in batch.phase], dtype=np.int64)
    gpus = np.asarray(batch.gpu_uuid, dtype=object)
    for app, model in {(a, m) for a, m in zip(apps[named].tolist(), models[named].tolist(), strict=True)}:
        rows = named & (apps == app) & (models == model)
        learned.setdefault((app, model), []).append((f[rows], phase[rows], gpus[rows], batch.ts_ns[rows]))


def _fit(learned: Learned, clusters: frozenset[str], settings: Settings, ts: int) -> BaselineSet:
    """Fit a baselines version from the day-one rows, as ``hermeneut baselines train`` would."""
    parts = []
    for (app, model), chunks in sorted(learned.items()):
        f = np.vstack([c[0] for c in chunks])
        phase = np.concatenate([c[1] for c in chunks])
        gpu = np.unique(np.concatenate([c[2] for c in chunks]), return_inverse=True)[1]
        ts_ns = np.concatenate([c[3] for c in chunks])
        parts.append(LabelledRows(app, model, f, phase, gpu, ts_ns, clusters))
    cfg = settings.baselines
    fitted = fit_version(parts, 1, ts, cfg.min_samples, cfg.classifier_window, cfg.classifier_min_confidence)
    manifest = BaselineManifest(1, ts, T0, ts, tuple(r.baseline_id for r in fitted.records), classifier=True)
    return BaselineSet(manifest, fitted.records, fitted.classifier)


def seed_line(o: Outcome) -> str:
    """One line per seed for the report: what ran, and its own paging false alarms after learning (the tables
    score the seeds together, so a miss is traced to its seed here)."""
    where = "" if o.plan.learn_seed is None else f" on seed {o.plan.learn_seed}'s fleet"
    return (
        f"seed {o.plan.seed}: {o.samples:,} samples ({o.dead_lettered} dead-lettered), {o.baselines} baselines "
        f"learned{where}, {len(o.withheld_nodes)} nodes without context, {o.seconds:.0f} s; after learning "
        f"{o.after.paging_false_alarms} paging false alarm(s) in {o.after.healthy_gpu_days:.1f} healthy GPU-days"
    )


def write_findings(o: Outcome, path: Path) -> int:
    """Every finding of a run and its ground truth as JSON lines (``{"truth": ...}`` / ``{"finding": ...}``, in that
    order), so that each miss and false alarm the report counts can be read one by one; returns the lines written."""
    with path.open("w") as out:
        for kind, items in (("truth", o.truth), ("finding", o.findings)):
            for item in items:
                out.write(json.dumps({kind: dataclasses.asdict(item)}, default=str) + "\n")
    return len(o.truth) + len(o.findings)


def combined(outcomes: list[Outcome]) -> tuple[Evaluation, Evaluation]:
    """Day one and after learning summed over several runs (counts added, rates recomputed)."""
    return combine([o.day_one for o in outcomes]), combine([o.after for o in outcomes])


def _worker_signals() -> None:
    # a terminal's Ctrl-C reaches the whole process group: the parent answers it; the pool's SIGTERM ends a worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def in_workers(fn: Callable[..., T], calls: Sequence[tuple[Any, ...]], jobs: int, desc: str = "seeds") -> list[T]:
    """``fn(*args)`` for each of ``calls`` in ``jobs`` worker processes (1: in this one), the results in order.

    SIGINT or SIGTERM raises :class:`~pipeline.errors.RunInterrupted` here at once, and the workers are killed with
    their seeds (nothing is scored): under ``ProcessPoolExecutor`` a SIGINT waited for every running seed to end
    (minutes) and a SIGTERM left the workers computing without a parent."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    if threading.current_thread() is threading.main_thread():
        Interrupt().install()
    try:
        if jobs == 1:
            return [fn(*args) for args in calls]
        with multiprocessing.Pool(jobs, initializer=_worker_signals) as pool:  # leaving it terminates the workers
            pending = [pool.apply_async(fn, args) for args in calls]
            return [r.get() for r in tqdm(pending, desc=desc, unit=" seed")]
    finally:
        if threading.current_thread() is threading.main_thread():
            for sig, handler in previous.items():
                if handler is not None:  # None: a handler not set from Python, which cannot be set back
                    signal.signal(sig, handler)
