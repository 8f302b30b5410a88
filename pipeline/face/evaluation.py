"""Scoring of the detectors against ground truth: pure functions, no I/O but reading the PAI step-time files.

``hermeneut evaluate`` (pipeline/face/cli/evaluate.py) replays a simulated fleet with injected faults through the real
pipeline and hands what came out (findings, ground-truth :class:`FaultRecord` s, inferred vs true applications)
to :func:`score`, which returns per fault class precision / recall / F1 and detection delay, false alarms per
healthy GPU-day and workload classification accuracy; :func:`failures` lists the acceptance thresholds missed.

Matching: a finding *episode* (one start of one detector on one GPU) detects a fault when the detector's name is
the fault class, it is on the fault's GPU (any GPU of the node for a node-level fault, ``gpu_uuid`` None), and it
starts between the fault's start minus ``tolerance_s`` and its end plus ``grace_s`` (detectors confirm over time:
a leak needs minutes of growth). Precision counts episodes that match some fault of their class; recall counts
faults with at least one matching episode; the delay is from the fault's start to its first matching episode.
A false alarm is an episode of a fault-class detector on a GPU with no fault of any class at that time; healthy
GPU-days are the observed time of every GPU minus its faults' windows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from pipeline.events import FAULTS, FaultRecord, Finding

_S: Final = 1_000_000_000
DAY_S: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class Thresholds:
    """The acceptance thresholds of the evaluation."""

    f1_min: float = 0.9
    false_alarms_per_gpu_day_max: float = 1.0
    classification_min: float = 0.9


@dataclass(frozen=True, slots=True)
class Episode:
    """One start of one detector on one GPU (repeats and the clear of the same finding are not new episodes)."""

    detector: str
    cluster: str
    node: str
    gpu_uuid: str | None
    start_ns: int


@dataclass(frozen=True, slots=True)
class ClassScore:
    fault: str
    faults: int
    detected: int
    episodes: int
    true_episodes: int
    delays_s: tuple[float, ...] = ()

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
    false_alarms: int
    healthy_gpu_days: float
    #: episodes of detectors that are not fault classes (xid, row-remap, idle-capacity, baseline-anomaly) on
    #: healthy GPUs: reported, not counted as false alarms
    other_episodes: dict[str, int]
    classification: Classification | None = None
    false_alarm_examples: tuple[Episode, ...] = ()

    @property
    def false_alarms_per_gpu_day(self) -> float | None:
        return self.false_alarms / self.healthy_gpu_days if self.healthy_gpu_days > 0 else None


def episodes(findings: Iterable[Finding]) -> list[Episode]:
    """The distinct episodes among findings (a finding's repeats and clear share its ``since_ns``)."""
    seen: dict[tuple[str, str, str, str | None, int], Episode] = {}
    for f in findings:
        key = (f.detector, f.cluster, f.node, f.gpu_uuid, f.since_ns)
        if key not in seen:
            seen[key] = Episode(f.detector, f.cluster, f.node, f.gpu_uuid, f.since_ns)
    return sorted(seen.values(), key=lambda e: (e.start_ns, e.detector, e.gpu_uuid or ""))


def merge_faults(records: Iterable[FaultRecord], run_end_ns: int) -> list[FaultRecord]:
    """One record per fault: a simulator may send a fault when it starts and again when it ends (the latest end
    wins); a fault still open (end not after start) lasts until the end of the run."""
    merged: dict[tuple[str, str, str | None, str, int], FaultRecord] = {}
    for r in records:
        key = (r.cluster, r.node, r.gpu_uuid, r.fault, r.start_ns)
        old = merged.get(key)
        if old is None or r.end_ns > old.end_ns:
            merged[key] = r
    out = []
    for r in merged.values():
        end = r.end_ns if r.end_ns > r.start_ns else run_end_ns
        out.append(FaultRecord(r.cluster, r.node, r.gpu_uuid, r.fault, r.start_ns, end, r.detail))
    return sorted(out, key=lambda r: (r.start_ns, r.fault))


def _covers(fault: FaultRecord, e: Episode, tolerance_ns: int, grace_ns: int) -> bool:
    same_place = (
        fault.cluster == e.cluster and fault.node == e.node and (fault.gpu_uuid is None or fault.gpu_uuid == e.gpu_uuid)
    )
    return same_place and fault.start_ns - tolerance_ns <= e.start_ns <= fault.end_ns + grace_ns


def score(
    findings: Iterable[Finding],
    faults: Sequence[FaultRecord],
    observed: dict[tuple[str, str, str], tuple[int, int]],
    tolerance_s: float = 30.0,
    grace_s: float = 300.0,
    classification: Classification | None = None,
) -> Evaluation:
    """Score findings against merged faults; ``observed`` maps each GPU (cluster, node, uuid) to the first and last
    timestamp it was seen (its share of healthy GPU-days)."""
    tol, grace = int(tolerance_s * _S), int(grace_s * _S)
    eps = episodes(findings)
    classes = []
    for fault_class in FAULTS:
        truth = [f for f in faults if f.fault == fault_class]
        found = [e for e in eps if e.detector == fault_class]
        delays: list[float] = []
        for f in truth:
            hits = [e.start_ns for e in found if _covers(f, e, tol, grace)]
            if hits:
                delays.append(max(0.0, (min(hits) - f.start_ns) / _S))
        true_eps = sum(1 for e in found if any(_covers(f, e, tol, grace) for f in truth))
        classes.append(ClassScore(fault_class, len(truth), len(delays), len(found), true_eps, tuple(delays)))
    false_alarms: list[Episode] = []
    other: dict[str, int] = {}
    for e in eps:
        if any(_covers(f, e, tol, grace) for f in faults):
            continue
        if e.detector in FAULTS:
            false_alarms.append(e)
        else:
            other[e.detector] = other.get(e.detector, 0) + 1
    return Evaluation(
        tuple(classes),
        len(false_alarms),
        healthy_gpu_days(observed, faults, grace_s),
        other,
        classification,
        tuple(false_alarms[:20]),
    )


def healthy_gpu_days(
    observed: dict[tuple[str, str, str], tuple[int, int]], faults: Sequence[FaultRecord], grace_s: float = 0.0
) -> float:
    """GPU-days observed without a fault on the GPU (or its node), fault windows extended by ``grace_s``."""
    total = 0.0
    for (cluster, node, uuid), (first, last) in observed.items():
        spans = sorted(
            (max(first, f.start_ns), min(last, f.end_ns + int(grace_s * _S)))
            for f in faults
            if f.cluster == cluster and f.node == node and f.gpu_uuid in (None, uuid)
        )
        faulty, cursor = 0, first
        for a, b in spans:
            lo = max(a, cursor)
            if b > lo:
                faulty += b - lo
                cursor = b
        total += max(0, last - first - faulty) / _S / DAY_S
    return total


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


def failures(ev: Evaluation, thresholds: Thresholds) -> list[str]:
    """Every acceptance threshold the evaluation missed, one line each (empty: accepted)."""
    out = []
    for c in ev.classes:
        if c.faults == 0:
            out.append(f"{c.fault}: no fault of this class was injected, so it was not evaluated")
        elif (c.f1 or 0.0) < thresholds.f1_min:
            out.append(f"{c.fault}: F1 {c.f1:.2f} < {thresholds.f1_min}")
    fa = ev.false_alarms_per_gpu_day
    if fa is None:
        out.append("no healthy GPU time observed")
    elif fa >= thresholds.false_alarms_per_gpu_day_max:
        out.append(f"false alarms {fa:.2f} per healthy GPU-day >= {thresholds.false_alarms_per_gpu_day_max}")
    acc = ev.classification.accuracy if ev.classification else None
    if acc is None:
        out.append("workload classification was not measured (no withheld context)")
    elif acc < thresholds.classification_min:
        out.append(f"workload classification {acc:.3f} < {thresholds.classification_min}")
    return out


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def format_table(ev: Evaluation) -> str:
    """The evaluation as a Markdown table (it goes into the README as it is)."""
    lines = [
        "| fault class | faults | detected | episodes | precision | recall | F1 | delay median (s) | delay p95 (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in ev.classes:
        lines.append(
            f"| {c.fault} | {c.faults} | {c.detected} | {c.episodes} | {_num(c.precision)} | {_num(c.recall)} | "
            f"{_num(c.f1)} | {_num(c.delay_median_s, '.0f')} | {_num(c.delay_p95_s, '.0f')} |"
        )
    lines.append("")
    lines.append(
        f"False alarms on healthy GPUs: {ev.false_alarms} in {ev.healthy_gpu_days:.2f} GPU-days = "
        f"{_num(ev.false_alarms_per_gpu_day)} per GPU-day"
    )
    if ev.other_episodes:
        others = ", ".join(f"{k} {v}" for k, v in sorted(ev.other_episodes.items()))
        lines.append(f"Other findings on healthy GPUs (not fault classes): {others}")
    if ev.classification is not None:
        cl = ev.classification
        lines.append(f"Workload classification (context withheld): {_num(cl.accuracy, '.3f')} over {cl.rows} rows")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------- PAI stragglers
#: the stragglers the Alibaba PAI 2020 mini-batch README names, per job (every other worker must stay unflagged)
PAI_LABELS: Final[dict[int, frozenset[int]]] = {
    1: frozenset({6}),
    2: frozenset(),
    3: frozenset({0, 1}),
    4: frozenset({0, 5, 6, 7, 8}),
}
#: time-index units per window: 10 steps (the index advances by 10 per step)
PAI_WINDOW: Final = 100


def pai_step_windows(csv: Path) -> np.ndarray:
    """Per worker, the median mini-batch time of each window of 10 steps: (10 workers, windows), NaN if missing."""
    data = np.genfromtxt(csv, delimiter=",", skip_header=1)
    worker, time, step = data[:, 0].astype(int), data[:, 2], data[:, 3]
    k = ((time - 1) // PAI_WINDOW).astype(int)
    out = np.full((int(worker.max()) + 1, int(k.max()) + 1), np.nan)
    for w in np.unique(worker).tolist():
        for window in np.unique(k[worker == w]).tolist():
            out[w, window] = np.median(step[(worker == w) & (k == window)])
    return out


@dataclass(frozen=True, slots=True)
class PaiResult:
    job: int
    flagged: frozenset[int]
    expected: frozenset[int]

    @property
    def ok(self) -> bool:
        return self.flagged == self.expected


def pai_result(job: int, flags: np.ndarray) -> PaiResult:
    """Compare a (workers, windows) flag matrix for a PAI job with its labels."""
    return PaiResult(job, frozenset(int(w) for w in np.flatnonzero(flags.any(axis=1))), PAI_LABELS[job])
