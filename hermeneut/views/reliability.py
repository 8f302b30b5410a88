"""Reliability figures as the CLI (``hermeneut reliability``) and the HTTP API (``GET /api/v1/reliability``) show
them: the stored finding history, the notification history, the GPUs' spans and the jobs' (InfluxDB) folded by
:func:`pipeline.reliability.reliability`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pipeline.config import HealthSettings
from pipeline.errors import InvalidQuery
from pipeline.reliability import GROUPINGS, Report, reliability
from pipeline.vocab import NS_PER_S
from sinks.query.fleet import finding_episodes, first_told, gpu_spans
from sinks.query.jobs import job_spans
from sinks.query.store import Store


@dataclass(frozen=True, slots=True)
class ReliabilityQuery:
    """Over the last ``range_s`` (at most the raw bucket's retention: the history lives there), grouped by
    cluster, GPU model or node, optionally one cluster."""

    range_s: float = 7 * 86_400.0
    by: str = "gpu_model"
    cluster: str | None = None

    def validate(self, retention_days: float) -> None:
        if self.by not in GROUPINGS:
            raise InvalidQuery(f"group by one of {', '.join(GROUPINGS)}, not {self.by!r}")
        if not 0 < self.range_s <= retention_days * 86_400:
            raise InvalidQuery(f"the range must be > 0 and within the raw bucket's retention ({retention_days:g} d)")


def fleet_reliability(store: Store, q: ReliabilityQuery, now_ns: int, rules: HealthSettings) -> Report:
    start, stop = now_ns - int(q.range_s * NS_PER_S), now_ns + NS_PER_S
    # the episodes that began up to the lemon window before the range count for the lemon rule at its end
    points = finding_episodes(store, start - int(rules.lemon_window_s * NS_PER_S), stop, q.cluster)
    notes: tuple[str, ...] = ()
    try:
        jobs = job_spans(store, start, stop, q.cluster)
    except InvalidQuery as exc:  # no job summaries bucket: the rest of the report stands
        jobs, notes = [], (f"no effective time per job: {exc} (hermeneut storage setup creates the jobs bucket)",)
    told = first_told(store, start, stop, q.cluster)
    report = reliability(gpu_spans(store, start, stop, q.cluster), points, start, stop, q.by, rules, jobs, told)
    return dataclasses.replace(report, notes=notes)
