"""Faults over real traces as the measure (``hermeneut evaluate --overlay TRACE --mapping MAPPING``), **offline,
overlay**: each fault of :mod:`hermeneut.jobs.overlay` is laid over a real healthy trace, the result is sampled every
1, 10, 30 or 60 s and goes through the import path's own steps (the importer's rows, ``context_changes``,
``node_batches``, the codec) and the processor's interpretation code in this process (``process_raw``, then
:func:`processors.app.interpreter_from`'s stages, ``tick`` after each poll), as the offline fleet evaluation
(:mod:`hermeneut.jobs.fleeteval`) does: every finding is the one a live processor would reach on that data, with the
trace arriving as if live (its poll times are the processor's clock). One fault per run, on a fresh interpreter.

Judged two ways (``learning``): ``day-one`` (no baselines learned from this cluster: what a new installation
has), and ``learned`` (baselines fitted on the first half of the untouched, resampled trace, as ``hermeneut
baselines train`` would fit them, then the whole faulted trace judged against them).

Scoring is by finding kind, place and time only (:data:`FOUND_BY`, the one place a class meets the detectors' names):
a fault is found by the first active finding of one of its class's kinds about its GPU (a whole-job fault: any GPU
of the job, or the job itself, ``gpu_uuid`` None) whose episode starts no earlier than 30 s before the fault and is
sent before its end + GRACE_S. Delay = when that finding was sent (:meth:`Judged.sent`: a straggler window is
dated at its end but judged with the poll after it, a minute later at 60 s sampling) - the fault's start (for a
GPU that stops reporting: the first poll it missed; for a GPU slow from its first sample: the first poll once the
job computes, :func:`evidence_ns`). Its summary is checked for true numbers (:func:`wording_problems`). A quiet
version's run that has such a finding is a false alarm. The untouched trace's findings (control) are listed whole.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from hermeneut.jobs.overlay import (
    CLASSES,
    Trace,
    Truth,
    busy_span,
    computing_from,
    invisible,
    overlay,
    plan,
    resample,
)
from pipeline import kinds
from pipeline.baselines import BaselineManifest
from pipeline.codec import encode_samples
from pipeline.config import Settings
from pipeline.events import Finding, GpuContext, Severity
from processors.app import interpreter_from
from processors.baselines.fit import LabelledRows, fit_version
from processors.baselines.store import BaselineSet
from processors.enrich import ContextTimeline
from processors.features import PHASE_INDEX, features_of
from processors.normalize import RawMessage, process_raw
from producers.importers.rows import Intervals, Rows, context_changes, node_batches

_S: Final = 1_000_000_000
#: the finding kinds that report each class (pipeline/kinds.py); a class with no kind yet is missed
FOUND_BY: Final[dict[str, tuple[str, ...]]] = {
    "straggler": (kinds.STRAGGLER,),
    "slow-from-start": (kinds.STRAGGLER,),
    "job-power-brake": (kinds.BRAKE, kinds.POWER, kinds.JOB_SLOWDOWN),
    "starvation": (kinds.JOB_SLOWDOWN,),
    "memory-leak": (kinds.LEAK,),
    "stops-reporting": (kinds.LOST_BUS,),
    "phase-mix": (kinds.PHASE_SHIFT,),
}
#: a finding whose episode began this long before the fault started is not about it (hermeneut.jobs.evaluation's)
BEFORE_S: Final = 30.0
#: a finding sent up to this long after the fault's end still detects it (detectors confirm over time)
GRACE_S: Final = 300.0
#: a number a finding states is true when within this share of the truth (issue 38's bar)
TOLERANCE: Final = 0.10
#: the bars (issue 38): recall per visible class, median delay of stragglers and of hard events
RECALL_BAR: Final = 0.9
STRAGGLER_DELAY_S: Final = 60.0
HARD_DELAY_S: Final = 5.0
STRAGGLING: Final = ("straggler", "slow-from-start")
HARD: Final = ("stops-reporting",)
LEARNING: Final = ("day-one", "learned")


@dataclass
class Judged:
    """What one run of the interpretation code over a trace gave: its findings, each GPU's poll times, and when each
    finding was sent (``sent_ns``, by index: the data time of the poll whose batch gave it; none: its own time)."""

    findings: list[Finding]
    seen: dict[str, np.ndarray]
    batches: list[Any] = field(default_factory=list)
    sent_ns: list[int] = field(default_factory=list)

    def sent(self, finding: Finding) -> int:
        """When ``finding`` was sent: never before its own time, and not before the poll that gave it (a window is
        judged once a later poll shows it complete: a finding dated at a window's end is sent with that poll)."""
        at = next((s for f, s in zip(self.findings, self.sent_ns, strict=False) if f is finding), finding.ts_ns)
        return max(finding.ts_ns, at)


def judge(rows: Rows, settings: Settings, baselines: BaselineSet | None, keep_until_ns: int | None = None) -> Judged:
    """The sampled rows through the import path's steps and the processor's interpretation code (see the module
    docstring); with ``keep_until_ns`` the interpreted batches before it are kept (to learn from)."""
    cluster = settings.cluster
    contexts: dict[bytes, GpuContext] = {}
    timeline = ContextTimeline()
    interpreter = interpreter_from(settings, contexts.get, lambda _c, _n: None, lambda: baselines, timeline)
    pending = context_changes(rows, cluster, {})
    interval = Intervals().per_row(rows)
    found: list[Finding] = []
    sent: list[int] = []
    kept: list[Any] = []
    for i, batch in enumerate(node_batches(rows, cluster, interval)):
        now = batch.samples[0].ts_ns if batch.samples else 0
        while pending and pending[0].ts_ns <= now:
            c = pending.pop(0)
            contexts[c.kafka_key] = c
            timeline.see(c.kafka_key, c)
        outcome = process_raw(
            [RawMessage(batch.kafka_key, encode_samples(batch), f"overlay/0/{i}")], now, settings.validation
        )
        for _part, normalized in outcome.forward:
            interpreted, f = interpreter.apply(normalized, now)
            found += f
            sent += [now] * len(f)
            if keep_until_ns is not None and now < keep_until_ns:
                kept.append(interpreted)
        ticked = interpreter.tick(now)
        found += ticked
        sent += [now] * len(ticked)
    seen = {g: np.sort(rows.ts_ns[np.array(rows.gpu_uuid, dtype=object) == g]) for g in dict.fromkeys(rows.gpu_uuid)}
    return Judged(found, seen, kept, sent)


def learn(batches: list[Any], settings: Settings, trained_ns: int) -> BaselineSet:
    """Baselines fitted on interpreted rows whose workload the import named, as ``hermeneut baselines train`` fits."""
    parts = []
    by_key: dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
    for b in batches:
        f = features_of(b)
        apps = np.array([w.application if w is not None else "" for w in b.workload], dtype=object)
        phase = np.array([PHASE_INDEX.get(p or "", 0) for p in b.phase], dtype=np.int64)
        for app, model in {(a, m) for a, m in zip(apps.tolist(), b.gpu_model, strict=True) if a}:
            sel = (apps == app) & (np.asarray(b.gpu_model, dtype=object) == model)
            by_key.setdefault((app, model), []).append(
                (f[sel], phase[sel], np.asarray(b.gpu_uuid, dtype=object)[sel], b.ts_ns[sel])
            )
    for (app, model), chunks in sorted(by_key.items()):
        gpu = np.unique(np.concatenate([c[2] for c in chunks]), return_inverse=True)[1]
        f, phase = np.vstack([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])
        ts = np.concatenate([c[3] for c in chunks])
        parts.append(LabelledRows(app, model, f, phase, gpu, ts, frozenset({settings.cluster})))
    cfg = settings.baselines
    fitted = fit_version(parts, 1, trained_ns, cfg.min_samples, cfg.classifier_window, cfg.classifier_min_confidence)
    manifest = BaselineManifest(1, trained_ns, 0, trained_ns, tuple(r.baseline_id for r in fitted.records))
    return BaselineSet(manifest, fitted.records, fitted.classifier)


def matches(truth: Truth, findings: Iterable[Finding], gpus: Iterable[str]) -> list[Finding]:
    """The active findings of the class's kinds about the fault's GPU (a job's fault: its GPUs or the job) in its
    time (see the module docstring), in the order sent."""
    wanted = FOUND_BY[truth.cls]
    targets = {truth.gpu_uuid} if truth.gpu_uuid else {*gpus, None}
    lo, hi = truth.start_ns - int(BEFORE_S * _S), truth.end_ns + int(GRACE_S * _S)
    return sorted(
        (
            f
            for f in findings
            if f.active and f.detector in wanted and f.gpu_uuid in targets and f.since_ns >= lo and f.ts_ns <= hi
        ),
        key=lambda f: f.ts_ns,
    )


_NUMBER = r"(\d+(?:\.\d+)?)"


def wording_problems(finding: Finding, truth: Truth, last_seen_ns: int | None = None) -> list[str]:
    """What is untrue in a finding's summary: a "?" or "0% slower", and any slowness, memory growth rate, leak age
    or silence it states that is off the truth by more than TOLERANCE."""
    text = finding.summary
    out = []
    if "?" in text:
        out.append("states '?'")
    if re.search(r"(?<![\d.])0% slower", text):
        out.append("says 0% slower")
    for value in (float(v) for v in re.findall(_NUMBER + r"% slower", text)):
        if truth.slower_pct() and not any(_near(value, t) for t in truth.slower_pct()):
            out.append(f"{value:g}% slower, truly {' or '.join(f'{t:.1f}%' for t in truth.slower_pct())}")
    if truth.cls == "memory-leak" and not truth.quiet:
        rate = 100.0 * truth.factor
        for value in (float(v) for v in re.findall(_NUMBER + r"%[^,;.]*?(?:per minute|/min)", text)):
            if not _near(value, rate):
                out.append(f"grows {value:g}% per minute, truly {rate:g}%")
        age_s = (finding.ts_ns - truth.start_ns) / _S
        for value, unit in re.findall(r"for " + _NUMBER + r" (min|s)\b", text):
            stated = float(value) * (60.0 if unit == "min" else 1.0)
            if not _near(stated, age_s):
                out.append(f"for {value} {unit}, truly {age_s:.0f} s")
    if truth.cls == "stops-reporting" and last_seen_ns is not None:
        gap_s = (finding.ts_ns - last_seen_ns) / _S
        for value in (float(v) for v in re.findall(r"silent for " + _NUMBER + r" s", text)):
            if not _near(value, gap_s):
                out.append(f"silent for {value:g} s, truly {gap_s:.0f} s")
    return out


def _near(value: float, truth: float) -> bool:
    return abs(value - truth) <= TOLERANCE * abs(truth)


@dataclass
class Hit:
    """One fault's outcome."""

    truth: Truth
    found: bool
    delay_s: float | None = None
    summary: str = ""
    severity: str = ""
    problems: list[str] = field(default_factory=list)


def score_run(truth: Truth, judged: Judged, busy_from_ns: int | None = None) -> Hit:
    """Whether the run found its fault (or, quiet, raised it falsely), how soon (from :func:`evidence_ns`; the job
    computes from ``busy_from_ns``), and how truly it said so."""
    found = matches(truth, judged.findings, judged.seen)
    if not found:
        return Hit(truth, False)
    first = found[0]
    last_seen = None
    if truth.gpu_uuid is not None and truth.gpu_uuid in judged.seen:
        before = judged.seen[truth.gpu_uuid]
        before = before[before <= first.ts_ns]
        last_seen = int(before[-1]) if len(before) else None
    delay_s = (judged.sent(first) - evidence_ns(truth, judged.seen, busy_from_ns)) / _S
    return Hit(truth, True, delay_s, first.summary, str(first.severity), wording_problems(first, truth, last_seen))


def evidence_ns(truth: Truth, seen: dict[str, np.ndarray], busy_from_ns: int | None = None) -> int:
    """When the fault's delay is counted from (the first moment any collector could tell): its start; for a GPU
    that stops reporting the first poll it missed (its peers' polls at or after the stop); for a GPU slow from its
    first sample the first poll at or after ``busy_from_ns``, when the job computes (slowness needs work: an idle
    GPU's lower power is no pace, and the straggler rule judges only windows where the job computes)."""
    polls = np.unique(np.concatenate(list(seen.values()))) if seen else np.empty(0, np.int64)
    if truth.cls == "slow-from-start" and busy_from_ns is not None:
        computing = polls[polls >= max(truth.start_ns, busy_from_ns)]
        return int(computing[0]) if len(computing) else truth.start_ns
    if truth.cls != "stops-reporting" or truth.gpu_uuid is None:
        return truth.start_ns
    own = seen.get(truth.gpu_uuid, np.empty(0, np.int64))
    missed = polls[(polls >= truth.start_ns) & ~np.isin(polls, own)]
    return int(missed[0]) if len(missed) else truth.start_ns


@dataclass
class ClassScore:
    """One class at one interval and learning: the faults and quiet versions scored."""

    cls: str
    faults: list[Hit] = field(default_factory=list)
    quiet: list[Hit] = field(default_factory=list)
    invisible: str = ""

    @property
    def found(self) -> int:
        return sum(h.found for h in self.faults)

    @property
    def recall(self) -> float | None:
        return self.found / len(self.faults) if self.faults else None

    @property
    def median_delay_s(self) -> float | None:
        delays = [h.delay_s for h in self.faults if h.delay_s is not None]
        return statistics.median(delays) if delays else None

    @property
    def wording_ok(self) -> int:
        return sum(h.found and not h.problems for h in self.faults)

    @property
    def quiet_alarms(self) -> int:
        return sum(h.found for h in self.quiet)

    @property
    def quiet_paging(self) -> int:
        return sum(h.found and h.severity in (Severity.WARNING, Severity.CRITICAL) for h in self.quiet)


@dataclass
class Result:
    """One interval and one way of learning."""

    interval_s: float
    learning: str
    classes: dict[str, ClassScore]
    control: list[Finding]
    baselines: int = 0
    note: str = ""

    def failures(self) -> list[str]:
        """The issue's bars this result misses, each in words."""
        at = f"{self.interval_s:g} s, {self.learning}"
        out = []
        for c in self.classes.values():
            if c.invisible or not c.faults:
                continue
            if (c.recall or 0.0) < RECALL_BAR:
                out.append(f"{at}: {c.cls} recall {c.recall:.2f} < {RECALL_BAR}")
            delay = c.median_delay_s
            if c.cls in STRAGGLING and delay is not None and delay > STRAGGLER_DELAY_S:
                out.append(f"{at}: {c.cls} median delay {delay:.0f} s > {STRAGGLER_DELAY_S:.0f} s")
            if c.cls in HARD and delay is not None and delay >= HARD_DELAY_S:
                out.append(f"{at}: {c.cls} median delay {delay:.0f} s >= {HARD_DELAY_S:.0f} s")
            if c.wording_ok < c.found:
                out.append(f"{at}: {c.cls} wording untrue in {c.found - c.wording_ok} of {c.found} found")
            if c.quiet_paging:
                out.append(f"{at}: {c.cls} quiet version raised a warning/critical in {c.quiet_paging} run(s)")
        paging = [f for f in self.control if f.active and f.severity in (Severity.WARNING, Severity.CRITICAL)]
        if paging:
            out.append(f"{at}: {len(paging)} warning/critical finding(s) on the untouched trace")
        return out


def evaluate(
    trace: Trace,
    intervals: Iterable[float],
    learning: Iterable[str] = LEARNING,
    settings: Settings | None = None,
    seed: int = 0,
    progress: Callable[[int], object] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> list[Result]:
    """Every interval x way of learning: the control and every fault of :func:`~hermeneut.jobs.overlay.plan` judged,
    one run each (``progress`` is told each run, ``on_total`` how many runs there will be)."""
    settings = settings or Settings(cluster="overlay")
    busy = busy_span(trace.rows)
    computing = computing_from(trace.rows)
    ways = list(learning)
    plans = {i: plan(trace, i, seed) for i in intervals}
    if on_total is not None:
        on_total(sum((len(p) + 1) * len(ways) for p in plans.values()))
    out = []
    for interval_s, truths in plans.items():
        hidden = invisible(trace, interval_s)
        if len(hidden) == len(CLASSES):
            for way in ways:
                classes = {c: ClassScore(c, invisible=hidden[c]) for c in CLASSES}
                out.append(Result(interval_s, way, classes, [], note=hidden[CLASSES[0]]))
                if progress is not None:
                    progress(len(truths) + 1)
            continue
        untouched = resample(trace.rows, interval_s)
        for way in ways:
            baselines, note = None, "no baselines learned from this cluster"
            if way == "learned":
                split = int(np.median(untouched.ts_ns))
                kept = judge(untouched, settings, None, keep_until_ns=split).batches
                baselines = learn(kept, settings, split)
                rows = sum(len(b) for b in kept)
                note = f"{len(baselines.baselines)} baseline(s) learned from the untouched first half ({rows} rows)"
            control = judge(untouched, settings, baselines).findings
            if progress is not None:
                progress(1)
            classes = {c: ClassScore(c, invisible=hidden.get(c, "")) for c in CLASSES}
            for truth in truths:
                judged = judge(resample(overlay(trace.rows, truth, busy), interval_s), settings, baselines)
                hit = score_run(truth, judged, computing)
                (classes[truth.cls].quiet if truth.quiet else classes[truth.cls].faults).append(hit)
                if progress is not None:
                    progress(1)
            out.append(Result(interval_s, way, classes, control, len(baselines.baselines) if baselines else 0, note))
    return out


def format_result(r: Result, trace: Trace) -> str:
    """One interval and learning as a Markdown table (class x recall, delay, wording, quiet false alarms), the
    misses and untrue wordings one by one, and every finding on the untouched trace."""
    lines = [
        f"### offline, overlay: {trace.label}, every {r.interval_s:g} s, {r.learning} ({r.note})",
        "",
        "| class | faults | found | recall | median delay (s) | wording ok | quiet false alarms (warn+) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in r.classes.values():
        if c.invisible:
            lines.append(f"| {c.cls} | invisible: {c.invisible} | | | | | |")
            continue
        recall = "-" if c.recall is None else f"{c.recall:.2f}"
        delay = "-" if c.median_delay_s is None else f"{c.median_delay_s:.0f}"
        lines.append(
            f"| {c.cls} | {len(c.faults)} | {c.found} | {recall} | {delay} | {c.wording_ok}/{c.found} | "
            f"{c.quiet_alarms}/{len(c.quiet)} ({c.quiet_paging}) |"
        )
    notes = [f"- missed: {h.truth.detail}" for c in r.classes.values() for h in c.faults if not h.found]
    notes += [
        f'- untrue wording ({h.truth.detail}): {"; ".join(h.problems)}: "{h.summary}"'
        for c in r.classes.values()
        for h in c.faults
        if h.problems
    ]
    notes += [
        f'- quiet raised ({h.truth.detail}): {h.severity} "{h.summary}"'
        for c in r.classes.values()
        for h in c.quiet
        if h.found
    ]
    if notes:
        lines += ["", *_summarized(notes)]
    lines += ["", f"control (untouched trace): {len(r.control)} finding record(s)"]
    start = int(trace.rows.ts_ns.min())
    lines += [
        f"- {f.severity} {f.detector} {'GPU ' + str(f.gpu_index) if f.gpu_uuid else 'node/job'} "
        f"+{(f.ts_ns - start) / _S:.0f} s{'' if f.active else ' (cleared)'}: {f.summary}"
        for f in r.control
    ]
    return "\n".join(lines)


def _summarized(notes: list[str], most: int = 12) -> list[str]:
    return notes if len(notes) <= most else [*notes[:most], f"- ... and {len(notes) - most} more (--json has all)"]


def to_json(r: Result) -> dict[str, Any]:
    """One result as plain data (every fault's outcome and every control finding)."""

    def hit(h: Hit) -> dict[str, Any]:
        return {
            "detail": h.truth.detail,
            "gpu": h.truth.gpu_uuid,
            "start_ns": h.truth.start_ns,
            "end_ns": h.truth.end_ns,
            "factor": h.truth.factor,
            "found": h.found,
            "delay_s": h.delay_s,
            "severity": h.severity,
            "summary": h.summary,
            "wording_problems": h.problems,
        }

    return {
        "mode": "offline, overlay",
        "interval_s": r.interval_s,
        "learning": r.learning,
        "note": r.note,
        "baselines": r.baselines,
        "classes": {
            c.cls: {
                "invisible": c.invisible or None,
                "faults": len(c.faults),
                "found": c.found,
                "recall": c.recall,
                "median_delay_s": c.median_delay_s,
                "wording_ok": c.wording_ok,
                "quiet": len(c.quiet),
                "quiet_false_alarms": c.quiet_alarms,
                "quiet_paging": c.quiet_paging,
                "hits": [hit(h) for h in c.faults],
                "quiet_hits": [hit(h) for h in c.quiet],
            }
            for c in r.classes.values()
        },
        "control": [
            {
                "detector": f.detector,
                "severity": str(f.severity),
                "active": f.active,
                "gpu": f.gpu_uuid,
                "ts_ns": f.ts_ns,
                "summary": f.summary,
            }
            for f in r.control
        ],
        "failures": r.failures(),
    }
