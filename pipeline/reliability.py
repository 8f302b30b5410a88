"""Reliability figures from the finding history: how often GPUs fail, how long they stay failed, which nodes are
lemons, per cluster, GPU model or node, and per day.

The figures an operator of a fleet reports (the Llama 3 paper's table of interruptions; what NVSentinel's and
gpud's users ask their dashboards for):

- **incidents**: episodes that made a GPU ``unhealthy`` (pipeline.health's rules: an uncorrectable ECC error, a
  GPU off the bus, a critical XID, ...); ``degradations`` the episodes that made one ``degraded``;
- **MTBI**, mean time between incidents: the GPU-hours observed (each GPU from its first to its last sample in
  the range, gaps included) per incident;
- **time to repair**: from an incident's start to its end (the finding cleared: the GPU reset, replaced, or back),
  median and p90 over the incidents that ended; the ones still open are counted apart;
- **time to tell**: from an incident's start to the first notification of it a receiver accepted (the notification
  history: the alert's ``for`` wait, grouping, delivery), median over the incidents someone was told of, and how
  many those were (an incident nobody subscribed to, or muted, is told to no one);
- **lemon nodes**: pipeline.escalation's rule over the range;
- **per day**: incidents and degradations by the day they started;
- **effective time per job** (Llama 3 reports "more than 90% effective training time"): the share of a job's time
  (its first to its last 10 minutes in the job summaries) when its GPUs were all healthy and busy, i.e. no GPU of it
  had a finding that made it degraded or unhealthy, nor an ``idle-capacity`` one (held, not used); the time lost,
  and the finding kinds that cost it, worst first.

Time to *detect* needs to know when a fault really began, which only ground truth says (a detector dates a
finding's start at its detection): the evaluation reports it (``hermeneut evaluate``, its delays and health-state
table); what the history does say is the time to tell. Everything here is a pure function of the episodes and
the GPUs' spans, so the CLI and the API say the same.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from pipeline.config import HealthSettings
from pipeline.escalation import Episode, History
from pipeline.health.states import Health
from pipeline.vocab import NS_PER_S

GROUPINGS: Final = ("cluster", "gpu_model", "node")
_DAY_NS: Final = 86_400 * NS_PER_S
#: (cluster, node, GPU, GPU model, first sample, last sample), as sinks.query.fleet.gpu_spans gives them
Span = tuple[str, str, str, str, int, int]
#: (cluster, job, application, start of its first 10 minutes, end of its last, GPU-hours), as
#: sinks.query.jobs.job_spans gives them
JobSpan = tuple[str, str, str, int, int, float]
#: a GPU of a job that holds it without using it: not busy, so not effective time
_IDLE: Final = "idle-capacity"


@dataclass(frozen=True, slots=True)
class JobTime:
    """One job's effective time over the range (module docstring)."""

    cluster: str
    job: str
    application: str
    hours: float
    gpu_hours: float
    #: hours when a GPU of the job was degraded, unhealthy or idle
    lost_hours: float
    #: (finding kind, hours it covered), most first
    causes: tuple[tuple[str, float], ...]

    @property
    def effective(self) -> float:
        return 1.0 - self.lost_hours / self.hours if self.hours > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Row:
    """The figures of one group (a cluster, a GPU model or a node)."""

    group: str
    gpus: int
    gpu_hours: float
    incidents: int
    degradations: int
    #: GPU-hours per incident; None without an incident
    mtbi_hours: float | None
    #: time to repair of the incidents that ended, in minutes
    repair_median_min: float | None
    repair_p90_min: float | None
    open_incidents: int
    #: time to tell (seconds, median) over the ``told`` incidents someone was told of
    tell_median_s: float | None = None
    told: int = 0


@dataclass(frozen=True, slots=True)
class Report:
    by: str
    start_ns: int
    stop_ns: int
    rows: tuple[Row, ...]
    #: (cluster, node, the lemon-node reason's summary)
    lemons: tuple[tuple[str, str, str], ...]
    #: (day start, incidents, degradations), oldest first
    days: tuple[tuple[int, int, int], ...]
    #: per job, least effective first
    jobs: tuple[JobTime, ...] = ()
    #: what the report could not say, and why
    notes: tuple[str, ...] = ()


def _merged(points: Iterable[Episode], rules: HealthSettings) -> list[Episode]:
    history = History(rules, keep=frozenset({_IDLE}))
    for p in points:
        history.add(p)
    return history.episodes()


def reliability(
    spans: Sequence[Span],
    points: Iterable[Episode],
    start_ns: int,
    stop_ns: int,
    by: str,
    rules: HealthSettings,
    jobs: Sequence[JobSpan] = (),
    told: Mapping[str, Sequence[int]] = {},
) -> Report:
    """The figures per ``by`` (one of :data:`GROUPINGS`) over ``[start, stop)`` (module docstring): ``points`` are
    the stored finding points (sinks.query.fleet.finding_episodes), merged here into episodes; ``jobs`` the jobs to
    give an effective time; ``told`` when someone was told of each alert (dedup key -> times, oldest first:
    sinks.query.fleet.first_told)."""
    if by not in GROUPINGS:
        raise ValueError(f"group by one of {', '.join(GROUPINGS)}, not {by!r}")
    model = {(c, n, g): m for c, n, g, m, _, _ in spans}

    def group_of(cluster: str, node: str, gpu: str | None) -> str:
        if by == "cluster":
            return cluster
        if by == "node":
            return f"{cluster}/{node}"
        return model.get((cluster, node, gpu or ""), "") or "unknown model"

    hours: dict[str, float] = defaultdict(float)
    gpus: dict[str, int] = defaultdict(int)
    for c, n, g, _m, first, last in spans:
        key = group_of(c, n, g)
        gpus[key] += 1
        hours[key] += max(0, min(last, stop_ns) - max(first, start_ns)) / 3600 / NS_PER_S
    merged = _merged(points, rules)
    episodes = [e for e in merged if e.gpu and start_ns <= e.since_ns < stop_ns]
    incidents: dict[str, list[Episode]] = defaultdict(list)
    degraded: dict[str, int] = defaultdict(int)
    days: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for e in episodes:
        r = e.reason
        if r is None or r.state not in (Health.UNHEALTHY, Health.DEGRADED):
            continue
        key, day = group_of(e.cluster, e.node, e.gpu), e.since_ns - e.since_ns % _DAY_NS
        if r.state is Health.UNHEALTHY:
            incidents[key].append(e)
            days[day][0] += 1
        else:
            degraded[key] += 1
            days[day][1] += 1
    tell = time_to_tell(merged, told)
    rows = []
    for key in sorted(set(gpus) | set(incidents) | set(degraded)):
        mine = incidents.get(key, [])
        repairs = np.array([(e.seen_ns - e.since_ns) / 60 / NS_PER_S for e in mine if not e.open])
        tells = [t for e in mine if (t := tell.get(_identity(e))) is not None]
        rows.append(
            Row(
                key,
                gpus.get(key, 0),
                round(hours.get(key, 0.0), 3),
                len(mine),
                degraded.get(key, 0),
                round(hours[key] / len(mine), 3) if mine and hours.get(key) else None,
                round(float(np.median(repairs)), 3) if len(repairs) else None,
                round(float(np.quantile(repairs, 0.9)), 3) if len(repairs) else None,
                sum(1 for e in mine if e.open),
                round(float(np.median(tells)), 3) if tells else None,
                len(tells),
            )
        )
    lemons = tuple(
        (c, n, r.summary)
        for (c, n), reasons in sorted(History(rules, episodes).escalate(stop_ns).nodes.items())
        for r in reasons
        if r.detector == "lemon-node"
    )
    return Report(
        by,
        start_ns,
        stop_ns,
        tuple(rows),
        lemons,
        tuple((d, v[0], v[1]) for d, v in sorted(days.items())),
        job_times(jobs, merged, start_ns, stop_ns),
    )


def _identity(e: Episode) -> tuple[str, str, str | None, str, int]:
    return e.cluster, e.node, e.gpu, e.detector, e.since_ns


def time_to_tell(
    episodes: Sequence[Episode], told: Mapping[str, Sequence[int]]
) -> dict[tuple[str, str, str | None, str, int], float]:
    """Per episode (cluster, node, GPU, kind, start): seconds from its start to the first time someone was told of
    its alert (its dedup key, ``pipeline.events.Finding.dedup_key``) before the next episode of that alert began;
    episodes nobody was told of are left out."""
    by_key: dict[str, list[Episode]] = defaultdict(list)
    for e in episodes:
        by_key[f"{e.detector}/{e.cluster}/{e.node}/{e.gpu or '-'}"].append(e)
    out: dict[tuple[str, str, str | None, str, int], float] = {}
    for key, mine in by_key.items():
        times = told.get(key)
        if not times:
            continue
        mine.sort(key=lambda e: e.since_ns)
        ends = [e.since_ns for e in mine[1:]] + [None]
        for e, end in zip(mine, ends, strict=True):
            i = bisect.bisect_left(times, e.since_ns)
            if i < len(times) and (end is None or times[i] < end):
                out[_identity(e)] = (times[i] - e.since_ns) / NS_PER_S
    return out


def job_times(jobs: Sequence[JobSpan], episodes: Iterable[Episode], start_ns: int, stop_ns: int) -> tuple[JobTime, ...]:
    """Each job's effective time within ``[start, stop)`` (module docstring), least effective first; ``episodes``
    merged (an open one lasts to ``stop``)."""
    costly: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for e in episodes:
        r = e.reason
        if e.job and (e.detector == _IDLE or (r is not None and r.state in (Health.UNHEALTHY, Health.DEGRADED))):
            costly[(e.cluster, e.job)].append((e.since_ns, stop_ns if e.open else e.seen_ns, e.detector))
    out = []
    for cluster, job, app, first, last, gpu_hours in jobs:
        lo, hi = max(first, start_ns), min(last, stop_ns)
        if hi <= lo:
            continue
        spans = [(max(a, lo), min(b, hi), kind) for a, b, kind in costly.get((cluster, job), []) if b > lo and a < hi]
        by_kind = {k: _hours([(a, b) for a, b, x in spans if x == k]) for k in {kind for _, _, kind in spans}}
        causes = sorted(by_kind.items(), key=lambda c: (-c[1], c[0]))
        out.append(
            JobTime(
                cluster,
                job,
                app,
                round((hi - lo) / 3600 / NS_PER_S, 3),
                round(gpu_hours, 3),
                _hours([(a, b) for a, b, _ in spans]),
                tuple(causes),
            )
        )
    return tuple(sorted(out, key=lambda j: (j.effective, -j.gpu_hours, j.job)))


def _hours(intervals: list[tuple[int, int]]) -> float:
    """Hours the union of ``[a, b)`` intervals covers."""
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total, end = total + b - a, b
        elif b > end:
            total, end = total + b - end, b
    return round(total / 3600 / NS_PER_S, 3)


def report_json(r: Report) -> dict[str, Any]:
    return {
        "by": r.by,
        "start_ns": r.start_ns,
        "stop_ns": r.stop_ns,
        "rows": [
            {
                "group": x.group,
                "gpus": x.gpus,
                "gpu_hours": x.gpu_hours,
                "incidents": x.incidents,
                "degradations": x.degradations,
                "mtbi_hours": x.mtbi_hours,
                "repair_median_min": x.repair_median_min,
                "repair_p90_min": x.repair_p90_min,
                "open_incidents": x.open_incidents,
                "tell_median_s": x.tell_median_s,
                "told": x.told,
            }
            for x in r.rows
        ],
        "lemon_nodes": [{"cluster": c, "node": n, "why": why} for c, n, why in r.lemons],
        "days": [{"day_ns": d, "incidents": i, "degradations": g} for d, i, g in r.days],
        "notes": list(r.notes),
        "jobs": [
            {
                "cluster": j.cluster,
                "job": j.job,
                "application": j.application,
                "hours": j.hours,
                "gpu_hours": j.gpu_hours,
                "lost_hours": j.lost_hours,
                "effective": round(j.effective, 4),
                "causes": [{"detector": k, "hours": h} for k, h in j.causes],
            }
            for j in r.jobs
        ],
    }
