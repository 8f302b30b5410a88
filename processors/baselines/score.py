"""The scoring stage (:class:`Scorer`): every row judged against the baseline that fits it best, and
``baseline-anomaly`` findings.

Per row: score, verdict (``normal`` / ``unusual`` / ``anomalous`` by the baseline's calibrated thresholds,
``unscored`` without one), baseline id, drivers and, for rows that are not normal, a one-line explanation
(processors.baselines.explain) that names what the row was judged against and how much history that had. The
baseline is the most specific one published for the row's (application, GPU model, phase)
(processors.baselines.store); rows are grouped by baseline, and each group is scored at once
(processors.baselines.model).

A verdict is only as strong as the evidence behind it (:class:`Judgement`, from the baselines settings):

- only a *strong* baseline may call a row anomalous: one of the row's GPU model, learned from at least
  ``min_gpus`` GPUs of the row's own cluster. A prior (pooled over GPU models, learned from fewer GPUs, or from
  another cluster: another fleet, the simulator) widens the band instead: a row is ``unusual`` only beyond
  ``prior_widening`` times its anomalous threshold, never ``anomalous``, so history from elsewhere never condemns;
  and a prior judges only the features beyond what healthy GPUs show in the world (public measurements and
  physical limits, processors.baselines.world): one inside its public band is no evidence, marginalized out of the
  score as a missing one is, so a new installation's simulator-learned priors are as wide as the world (issue 38: a
  real 8xH100 pre-training run at 51% of its memory and 99% of its power limit was `unusual` on every compute row);
- when most GPUs of a job (``job_share`` of its GPUs, within two minutes) are anomalous together, the job runs
  unlike its baseline, not a GPU: their rows are ``unusual`` and say so (peer comparison, as ByteDance's Minder
  does: the normal state of a metric depends on the task);
- a serving application (``pipeline.events.SERVING``) whose row differs from its baseline only as a deployment does
  (every driver a load feature above its band: utilization, SM/tensor/DRAM activity, power, temperature, link
  traffic; or memory used below its band) serves more requests, or a smaller model or cache, than the history it
  learned from: ``unusual`` and says which. A server's load follows its traffic, and its memory what it was started
  with (a model's size, vLLM's ``gpu-memory-utilization``); in the offline fleet evaluation these were most
  baseline-anomaly findings on healthy GPUs (LLM servers learned at a quiet hour; on seed 21211, the 14 of its 68
  looked at: servers started with 57-67 % of an H200's memory, judged against 5 GPUs' history at 73 % or more).
  Slower clocks, less load, more memory (a leak), or a busier training job stay anomalous; memory lost while a job
  runs is ``memory-collapse`` (processors.detectors.changes);
- a row of the ``idle`` phase below its baseline's band in every driver (lower clocks, power, temperature, memory,
  activity) rests deeper than the GPUs it learned from did: ``unusual`` and says so, never a finding. Idle GPUs go on
  settling (clocks and power step down, the die cools) for longer than a short history shows; on seed 38833 of the
  offline evaluation an idle H100 at 17 % SM clock against a band whose 5th percentile was 54 % warned. Anything
  above an idle band (a hot idle GPU, memory held, traffic) stays anomalous.

Findings ``baseline-anomaly`` (:class:`AnomalyTracker`): active once a GPU has been anomalous for
``anomaly_after_s`` (5 minutes), repeated every 60 s, cleared once it has not been anomalous for
``anomaly_clear_s``; only for workloads a context source named (against an inferred application's baseline, rows keep
their verdict but raise no finding: in the evaluation most such findings on healthy GPUs came from a wrong guess of
the application, not from the GPU), and not while a domain detector's finding already tells why the GPU is slow
(``processors.detectors.names.EXPLAINS_SLOWNESS``: a power brake's clocks are anomalous too, and one alert for one
fault is what an operator needs).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.config import BaselineSettings
from pipeline.events import METRIC_INDEX, PHASES, SERVING, Driver, Finding, InterpretedBatch, Severity, Verdict
from pipeline.kinds import BASELINE_ANOMALY
from processors.baselines.explain import explain
from processors.baselines.model import FLEET, Baseline
from processors.baselines.store import BaselineSet
from processors.baselines.world import beyond_world
from processors.episodes import Description, Episodes
from processors.features import FEATURE_NAMES, features_of, infer_phase
from processors.state import GpuSlots, column

log = logging.getLogger(__name__)

_VERDICTS: Final = (Verdict.UNSCORED, Verdict.NORMAL, Verdict.UNUSUAL, Verdict.ANOMALOUS)
_UNSCORED, _NORMAL, _UNUSUAL, _ANOMALOUS = range(4)
_NONE: Final = np.int64(-1)  # "no such time" in the tracker's timestamp arrays
_NEVER: Final = np.iinfo(np.int64).max
#: a bit per difference from a baseline, a feature above or below its band (_Streaks.job_drivers, _Streaks.led)
_DIFF_BIT: Final = {
    (name, above): 1 << (2 * i + above) for i, name in enumerate(FEATURE_NAMES) for above in (False, True)
}
_MEMORY_BITS: Final = _DIFF_BIT["memory_used_ratio", False] | _DIFF_BIT["memory_used_ratio", True]


def _diff_bit(d: Driver) -> int:
    """The bit of one driver's difference: its feature, above or below what was expected."""
    return _DIFF_BIT.get((d.feature, d.observed > d.expected), 0)


_ACTION: Final = "compare with the baseline band; mark the event with `hermeneut feedback` if this is expected"


@dataclass(frozen=True, slots=True)
class Judgement:
    """How strong a verdict may be for the evidence behind it (see the module docstring)."""

    min_gpus: int = 4
    prior_widening: float = 2.0
    job_share: float = 0.5

    @classmethod
    def of(cls, settings: BaselineSettings) -> Judgement:
        return cls(settings.min_gpus, settings.prior_widening, settings.job_share)

    def strong(self, b: Baseline, clusters: np.ndarray) -> np.ndarray:
        """Per row (by its cluster), whether ``b`` may condemn it: a model's own baseline, learned from enough GPUs
        (records that do not say how many are taken at their word), of the row's cluster (likewise)."""
        r = b.record
        enough = r.gpu_model is not None and (r.gpus == 0 or r.gpus >= self.min_gpus)
        if not enough:
            return np.zeros(len(clusters), dtype=bool)
        return np.isin(clusters, r.clusters) if r.clusters else np.ones(len(clusters), dtype=bool)


def _unusual(row: int, verdict: np.ndarray, explanation: list[str], why: str) -> None:
    """Downgrade an anomalous row (in place) to unusual, its explanation saying so and ``why``."""
    verdict[row] = _UNUSUAL
    explanation[row] = explanation[row].replace(": anomalous for", ": unusual for", 1) + why


class JobConsensus:
    """Per job, when each of its GPUs was last anomalous: when most of a job's GPUs are at once, the job is what
    differs from its baseline, not one GPU (see the module docstring)."""

    def __init__(self, share: float, window_s: float = 120.0) -> None:
        self.share = share
        self.window_ns = int(window_s * 1e9)
        self._anomalous: dict[tuple[str, str], dict[str, int]] = {}

    def apply(self, batch: InterpretedBatch, verdict: np.ndarray, explanation: list[str]) -> None:
        """Downgrade (in place) the anomalous rows of jobs whose GPUs are mostly anomalous, and say why."""
        rows = np.flatnonzero(verdict == _ANOMALOUS).tolist()
        jobs: dict[tuple[str, str], list[int]] = {}
        for r in rows:
            wl = batch.workload[r]
            if wl is not None and wl.job_id is not None:
                key = (batch.cluster[r], wl.job_id)
                self._anomalous.setdefault(key, {})[batch.gpu_uuid[r]] = int(batch.ts_ns[r])
                jobs.setdefault(key, []).append(r)
        for key, mine in jobs.items():
            latest = max(int(batch.ts_ns[r]) for r in mine)
            seen = {g: t for g, t in self._anomalous[key].items() if latest - t <= self.window_ns}
            self._anomalous[key] = seen
            wl = batch.workload[mine[0]]
            assert wl is not None
            size = wl.job_gpus or len(
                {batch.gpu_uuid[i] for i, w in enumerate(batch.workload) if w is not None and w.job_id == key[1]}
            )
            if size < 2 or len(seen) < self.share * size:
                continue
            note = f"; so are {len(seen)} of {size} GPUs of job {key[1]}: the job differs from its baseline, not a GPU"
            for r in mine:
                _unusual(r, verdict, explanation, note)


#: features that rise with a server's request load (processors.features.FEATURES)
LOAD_FEATURES: Final = frozenset(
    {
        "utilization_gpu_percent",
        "utilization_memory_percent",
        "sm_active_percent",
        "tensor_active_percent",
        "dram_active_percent",
        "power_ratio_of_limit",
        "temperature_ratio_of_slowdown",
        "pcie_rx_ratio_of_capacity",
        "pcie_tx_ratio_of_capacity",
        "nvlink_rx_ratio_of_capacity",
        "nvlink_tx_ratio_of_capacity",
    }
)


def serving_demand(batch: InterpretedBatch, verdict: np.ndarray, explanation: list[str]) -> None:
    """Downgrade (in place) the anomalous rows of serving applications that differ from their baseline only as a
    deployment does (busier, or holding less memory), and say which (see the module docstring)."""
    for r in np.flatnonzero(verdict == _ANOMALOUS).tolist():
        wl, drivers = batch.workload[r], batch.drivers[r]
        if wl is None or wl.application not in SERVING or not drivers:
            continue
        busier = [d.feature in LOAD_FEATURES and d.observed > d.high for d in drivers]
        smaller = [d.feature == "memory_used_ratio" and d.observed < d.low for d in drivers]
        if not all(b or s for b, s in zip(busier, smaller, strict=True)):
            continue
        why = [w for w, seen in (("busier", any(busier)), ("holding less memory", any(smaller))) if seen]
        what = [w for w, seen in (("more requests", any(busier)), ("a smaller model or cache", any(smaller))) if seen]
        _unusual(
            r, verdict, explanation, f"; only {' and '.join(why)} than its history: {' and '.join(what)}, not a fault"
        )


def deeper_rest(batch: InterpretedBatch, verdict: np.ndarray, explanation: list[str]) -> None:
    """Downgrade (in place) the anomalous rows of the idle phase that are below their band in every driver: the GPU
    rests deeper than its history did (see the module docstring)."""
    for r in np.flatnonzero(verdict == _ANOMALOUS).tolist():
        drivers = batch.drivers[r]
        if batch.phase[r] != "idle" or not drivers or not all(d.observed < d.low for d in drivers):
            continue
        _unusual(
            r,
            verdict,
            explanation,
            "; only resting deeper than its history (every difference below the idle band), not a fault",
        )


@dataclass(eq=False)
class _Streaks:
    """Per GPU: the start of its current anomalous streak, and of its current streak of rows that are not; the job it
    runs (a code of its cluster and job id) and since when it was scored with it; whether the current anomalous
    streak began as the job did, and every difference such streaks of this job showed (a bit per feature and
    direction: :data:`_DIFF_BIT`)."""

    anomalous_since: np.ndarray = column(_NONE)
    calm_since: np.ndarray = column(_NONE)
    job: np.ndarray = column(_NONE)
    job_since: np.ndarray = column(_NONE)
    from_start: np.ndarray = column(False)
    job_drivers: np.ndarray = column(np.int64(0))
    #: the differences that led the anomalous rows of the GPU's open baseline-anomaly finding (:data:`_DIFF_BIT`)
    led: np.ndarray = column(np.int64(0))


#: an anomalous streak that begins this soon after the GPU's job began is how the job runs (its model size, batch,
#: data), a property of the job, not a change of the GPU: it raises no finding; nor does a later streak of the same
#: job led by a difference its start showed, the same feature on the same side of its band (a job configured unlike
#: the learned history hovers at the band's edge: in the offline evaluation its streak broke on a calm row and came
#: back as a "new" anomaly that warned after 30 minutes; on seed 45557 a fine-tuning job began with more memory and a
#: cooler die than its band, and a later streak led by the cooler die, after a checkpoint, warned). A later streak led
#: by another difference (the clocks of a job that began with less memory, a die hotter than a job that began cooler)
#: is a change.
STARTUP_S: Final = 600.0
#: an open baseline-anomaly finding is information; it warns once it has held this long
ESCALATE_S: Final = 1800.0
#: what a finding led by memory alone says: memory used is how the job was configured, never a page by itself
MEMORY_ALONE: Final = (
    "; memory alone: how much the job holds is its configuration (model, batch, cache), information, not a page "
    "(growth is judged by the memory-leak rule, a loss by memory-collapse)"
)


class AnomalyTracker:
    """Per GPU: how long it has been anomalous (or not), as arrays of the processor's slot table (its own when built
    alone), updated per batch with vector operations; emits ``baseline-anomaly`` findings (see module docstring): none
    for a streak that began with the GPU's job (a property of the job), nor for a later one of the same job led by a
    difference its start showed (:data:`STARTUP_S`), nor while a detector's finding tells why the GPU is slow
    (``explained``), info while young, a warning once it has held for ``ESCALATE_S``, unless memory used led every
    anomalous row of it: how much memory a job holds is its configuration (another model, batch or cache than the
    history held), growth is the memory-leak rule's and a loss the memory-collapse event's, so memory alone stays
    information. In the offline evaluation these were most paging false alarms left (single-GPU fine-tuning jobs at
    46-91 % of memory against bands learned from 6-7 GPUs in 3 hours, seeds 30011, 32233 and 37717)."""

    def __init__(
        self,
        after_s: float = 30.0,
        repeat_s: float = 60.0,
        clear_s: float = 60.0,
        slots: GpuSlots | None = None,
        explained: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.after_ns, self.repeat_ns, self.clear_ns = (int(s * 1e9) for s in (after_s, repeat_s, clear_s))
        #: per GPU slot and time: whether a detector's open finding already tells why the GPU is slow (a brake,
        #: thermal throttling, a link down...); such a streak starts no finding of its own
        self.explained = explained
        self.slots = slots if slots is not None else GpuSlots()
        self.streaks = self.slots.attach(_Streaks())
        self.episodes = Episodes(self.slots, (BASELINE_ANOMALY,))

    def update(
        self, batch: InterpretedBatch, verdict: np.ndarray, explanation: list[str], scores: np.ndarray
    ) -> list[Finding]:
        scored = verdict != _UNSCORED
        if not scored.any():
            return []
        rows = np.flatnonzero(scored)
        slot = self.slots.rows(batch)[rows]
        ts = batch.ts_ns[rows].astype(np.int64)
        # an anomaly against an inferred application's baseline is as likely a wrong guess as a sick GPU: the row
        # keeps its verdict, but only a workload a context source named raises a finding (counted as calm)
        named = np.fromiter(
            (w is not None and w.source != "inferred" for w in (batch.workload[r] for r in rows.tolist())),
            dtype=bool,
            count=len(rows),
        )
        bad = (verdict[rows] == _ANOMALOUS) & named
        streaks = self.streaks
        self._track_jobs(batch, rows, slot, ts)
        size = len(streaks.anomalous_since)
        last_calm, last_bad = np.full(size, _NONE), np.full(size, _NONE)
        np.maximum.at(last_calm, slot[~bad], ts[~bad])
        np.maximum.at(last_bad, slot[bad], ts[bad])
        first_bad_after, first_calm_after = np.full(size, _NEVER), np.full(size, _NEVER)
        m = bad & (ts > last_calm[slot])
        np.minimum.at(first_bad_after, slot[m], ts[m])
        m = ~bad & (ts > last_bad[slot])
        np.minimum.at(first_calm_after, slot[m], ts[m])
        seen = np.unique(slot)
        latest = np.maximum(last_calm[seen], last_bad[seen])
        ends_bad = last_bad[seen] > last_calm[seen]
        had_calm, had_bad = last_calm[seen] != _NONE, last_bad[seen] != _NONE
        # a streak survives a batch only if the batch ends in it; it restarts after the last row that broke it
        since = streaks.anomalous_since[seen]
        since = np.where(ends_bad, np.where(had_calm | (since == _NONE), first_bad_after[seen], since), _NONE)
        calm = streaks.calm_since[seen]
        calm = np.where(~ends_bad, np.where(had_bad | (calm == _NONE), first_calm_after[seen], calm), _NONE)
        began = (since != _NONE) & (streaks.anomalous_since[seen] != since)
        job_since = streaks.job_since[seen]
        with_job = began & (job_since != _NONE) & (since - job_since < int(STARTUP_S * 1e9))
        streaks.from_start[seen] = np.where(began, with_job, streaks.from_start[seen] & (since != _NONE))
        streaks.anomalous_since[seen], streaks.calm_since[seen] = since, calm
        # the difference leading each anomalous row and all it shows (bits; 0: none named); a job-start streak's
        # differences are the job's
        lead, diffs = np.zeros(len(rows), dtype=np.int64), np.zeros(len(rows), dtype=np.int64)
        for i in np.flatnonzero(bad).tolist():
            drivers = batch.drivers[int(rows[i])]
            lead[i] = _diff_bit(drivers[0]) if drivers else 0
            for d in drivers:
                diffs[i] |= _diff_bit(d)
        size_mask, size_diffs = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
        np.bitwise_or.at(size_mask, slot, lead)
        np.bitwise_or.at(size_diffs, slot, diffs)
        streaks.job_drivers[seen] |= np.where(streaks.from_start[seen], size_diffs[seen], 0)
        last_lead = np.zeros(size, dtype=np.int64)
        last_lead[slot[bad]] = lead[bad]  # rows are in time order per GPU: the latest anomalous row's lead
        same_lead = (last_lead[seen] & streaks.job_drivers[seen]) != 0
        active = self.episodes.active(seen, BASELINE_ANOMALY)
        start = ~active & (since != _NONE) & (latest - since >= self.after_ns) & ~streaks.from_start[seen] & ~same_lead
        if self.explained is not None and start.any():
            start &= ~self.explained(seen, latest)
        # the leads of an open finding's rows: from the streak that starts it (this batch's rows) on
        streaks.led[seen] = np.where(start, size_mask[seen], np.where(active, streaks.led[seen] | size_mask[seen], 0))
        last_sent = self.episodes.last_sent(seen, BASELINE_ANOMALY)
        repeat = active & (since != _NONE) & (latest - last_sent >= self.repeat_ns)
        clear = active & (calm != _NONE) & (latest - calm >= self.clear_ns)
        findings: list[Finding] = []
        if not (start.any() or repeat.any() or clear.any()):
            return findings
        # the row that speaks for each GPU: its latest scored row
        last_row = np.full(size, -1, dtype=np.int64)
        np.maximum.at(last_row, slot, np.arange(len(rows)))
        for j in np.flatnonzero(start | repeat | clear).tolist():
            s, now = int(seen[j]), int(latest[j])
            row = int(rows[last_row[s]])
            if start[j]:
                self.episodes.open(s, BASELINE_ANOMALY, int(since[j]))
            is_active = bool(start[j] or repeat[j])
            where = (batch.cluster[row], batch.node[row], batch.gpu_uuid[row], batch.gpu_model[row])
            held = now - self.episodes.get(s, BASELINE_ANOMALY).since_ns
            led = int(streaks.led[s])
            memory_alone = led != 0 and led & ~_MEMORY_BITS == 0
            severity = Severity.WARNING if held >= int(ESCALATE_S * 1e9) and not memory_alone else Severity.INFO
            said = _said(batch, row, is_active, explanation, scores, severity, MEMORY_ALONE if memory_alone else "")
            findings.append(
                self.episodes.send(
                    s, BASELINE_ANOMALY, is_active, now, where, said, batch.workload[row], batch.gpu_index[row]
                )
            )
            if clear[j]:
                self.episodes.close(s, BASELINE_ANOMALY)
        return findings

    def _track_jobs(self, batch: InterpretedBatch, rows: np.ndarray, slot: np.ndarray, ts: np.ndarray) -> None:
        """Each GPU's job (by its cluster and job id, as the context names it) and since when it runs it."""
        # a job's code is the hash of its cluster and id (never -1, "no job"): equal within the process, and no
        # table that grows with every job the fleet ever ran
        codes = np.fromiter(
            (
                hash((batch.cluster[r], w.job_id if w is not None else None))
                for r, w in ((r, batch.workload[r]) for r in rows.tolist())
            ),
            dtype=np.int64,
            count=len(rows),
        )
        new = codes != self.streaks.job[slot]
        if not new.any():
            return
        first = np.full(len(self.streaks.job), np.iinfo(np.int64).max)
        np.minimum.at(first, slot[new], ts[new])
        changed = np.flatnonzero(first != np.iinfo(np.int64).max)
        last_code = np.full(len(self.streaks.job), _NONE)
        last_code[slot] = codes  # rows are in time order per GPU: the last one wins
        self.streaks.job[changed] = last_code[changed]
        self.streaks.job_since[changed] = first[changed]
        self.streaks.job_drivers[changed] = 0


def _said(
    batch: InterpretedBatch,
    row: int,
    active: bool,
    explanation: list[str],
    scores: np.ndarray,
    severity: Severity,
    note: str,
) -> Description:
    """A baseline-anomaly finding: the row's explanation (and ``note``) and drivers while active, else that it is back
    to normal."""
    what = explanation[row] + note if active and explanation[row] else "behaviour back within its baseline"
    evidence = {"score": float(scores[row])} if scores[row] == scores[row] else {}
    for d in batch.drivers[row] if active else ():
        evidence[d.feature] = d.observed
    return Description(severity, what, _ACTION, evidence)


def _codes(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    names, inverse = np.unique(np.asarray(values, dtype=object), return_inverse=True)
    return names, inverse.astype(np.int64)


class Scorer:
    """The scoring stage: judges every row against the baseline that fits it best (see module docstring).

    ``current`` returns the baselines to use (a :class:`BaselineStore`'s ``current``); it is read once per
    batch and on every tick, so a new version applies from the next batch on, never inside one. Without
    baselines rows stay ``unscored``.
    """

    def __init__(
        self,
        current: Callable[[], BaselineSet | None],
        tracker: AnomalyTracker | None = None,
        judgement: Judgement | None = None,
    ) -> None:
        self._current = current
        self._set: BaselineSet | None = None
        self.tracker = tracker or AnomalyTracker()
        self.judgement = judgement or Judgement()
        self.consensus = JobConsensus(self.judgement.job_share)

    @property
    def version(self) -> int:
        return self._set.version if self._set is not None else 0

    def _refresh(self) -> None:
        latest = self._current()
        if latest is not self._set:
            log.info("scorer: switched to baselines version %d", latest.version if latest else 0)
            self._set = latest

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        self._refresh()
        if self._set is None or not len(batch):
            return batch, []
        scored, verdict = score_batch(batch, self._set, self.judgement)
        explanation = list(scored.explanation)
        self.consensus.apply(scored, verdict, explanation)
        serving_demand(scored, verdict, explanation)
        deeper_rest(scored, verdict, explanation)
        if explanation != list(scored.explanation):
            scored = dataclasses.replace(
                scored, verdict=tuple(_VERDICTS[v] for v in verdict.tolist()), explanation=tuple(explanation)
            )
        findings = self.tracker.update(scored, verdict, explanation, scored.score)
        return scored, findings

    def tick(self, now_ns: int) -> list[Finding]:
        # also between batches: a new version is taken up (and logged) without waiting for data
        self._refresh()
        return []


def score_batch(
    batch: InterpretedBatch, baselines: BaselineSet, judgement: Judgement | None = None
) -> tuple[InterpretedBatch, np.ndarray]:
    """Score, verdict, baseline, drivers and explanation for every row of a batch (pure); also the verdicts as
    codes (0 unscored, 1 normal, 2 unusual, 3 anomalous). Rows a baseline may not condemn (:class:`Judgement`) are
    judged by its widened band."""
    judgement = judgement or Judgement()
    clusters = np.asarray(batch.cluster, dtype=object)
    n = len(batch)
    f = features_of(batch)
    phases = [p if p is not None else "" for p in batch.phase]
    if "" in phases:
        inferred = infer_phase(f)
        phases = [p or PHASES[inferred[i]] for i, p in enumerate(phases)]
    apps = [w.application if w is not None else FLEET for w in batch.workload]
    app_names, app_code = _codes(apps)
    model_names, model_code = _codes(list(batch.gpu_model))
    phase_names, phase_code = _codes(phases)
    # per cluster too: a cluster may have baselines of its own (``baselines train --cluster``)
    cluster_names, cluster_code = _codes(list(batch.cluster))
    key = ((cluster_code * len(app_names) + app_code) * len(model_names) + model_code) * len(phase_names) + phase_code
    groups, group_of = np.unique(key, return_inverse=True)
    score = np.full(n, np.nan)
    verdict = np.zeros(n, dtype=np.int64)
    strong = np.zeros(n, dtype=bool)
    chosen: list[Baseline | None] = []
    #: the features each row is judged by: all it has under a strong baseline, only those beyond the world under a
    #: prior
    judged = f.copy()
    for g, k in enumerate(groups.tolist()):
        c, rest = divmod(k, len(app_names) * len(model_names) * len(phase_names))
        a, rest = divmod(rest, len(model_names) * len(phase_names))
        mdl, ph = divmod(rest, len(phase_names))
        b = baselines.resolve(str(app_names[a]), str(model_names[mdl]), str(phase_names[ph]), str(cluster_names[c]))
        chosen.append(b)
        if b is None:
            continue
        rows = np.flatnonzero(group_of == g)
        r = b.record
        may_condemn = judgement.strong(b, clusters[rows])
        strong[rows] = may_condemn
        weak = rows[~may_condemn]
        if len(weak):
            # a prior speaks only beyond what healthy GPUs show in the world (processors.baselines.world)
            judged[weak] = beyond_world(f[weak], str(phase_names[ph]))
        s = b.score(judged[rows])
        # a row whose every feature is inside its public band is as normal as the world: nothing to score
        s[~may_condemn & np.isnan(s) & np.isfinite(f[rows][:, b.idx]).any(axis=1)] = 0.0
        score[rows] = s
        as_learned = np.where(s >= r.anomalous, _ANOMALOUS, np.where(s >= r.unusual, _UNUSUAL, _NORMAL))
        as_prior = np.where(s >= judgement.prior_widening * r.anomalous, _UNUSUAL, _NORMAL)
        verdict[rows] = np.where(np.isnan(s), _UNSCORED, np.where(may_condemn, as_learned, as_prior))
    ids = np.array([None if b is None else b.id for b in chosen], dtype=object)[group_of]
    ids[verdict == _UNSCORED] = None
    baseline_col = ids.tolist()
    drivers: list[tuple[Driver, ...]] = list(batch.drivers) if batch.drivers else [()] * n
    explanation = list(batch.explanation)
    off = np.flatnonzero(verdict >= _UNUSUAL)
    if len(off):
        memory_total = batch.metrics[:, METRIC_INDEX["memory_total_bytes"]]
        throttle = batch.metrics[:, METRIC_INDEX["throttle_reasons_mask"]]
        for g in np.unique(group_of[off]).tolist():
            b = chosen[g]
            assert b is not None
            rows = off[group_of[off] == g]
            for row, ds in zip(rows.tolist(), b.drivers(judged[rows]), strict=True):
                drivers[row] = ds
                explanation[row] = explain(
                    _VERDICTS[verdict[row]],
                    ds,
                    f[row],
                    b,
                    batch.workload[row],
                    batch.gpu_model[row],
                    float(memory_total[row]),
                    float(throttle[row]),
                    bool(strong[row]),
                )
    scored = dataclasses.replace(
        batch,
        score=score,
        verdict=tuple(_VERDICTS[v] for v in verdict.tolist()),
        baseline=tuple(baseline_col),
        explanation=tuple(explanation),
        phase=tuple(phases),
        drivers=tuple(drivers),
    )
    return scored, verdict
