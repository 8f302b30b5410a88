"""The fleet's health as the CLI (``hermeneut health``) and the HTTP API (``GET /api/v1/health``) show it: the
alerts firing now (the alert manager's state, through its compacted topic) folded over the GPUs that reported
in the lookback (InfluxDB), by :func:`pipeline.health.fold.assess`, with what the stored finding history escalates
(:func:`pipeline.escalation.escalate`) and what the nodes' topologies say (maintenance windows, racks and switches)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from alerting.admin import AlertAdmin
from alerting.model import AlertStatus
from pipeline.codec import decode_record
from pipeline.config import HealthSettings, Settings
from pipeline.errors import InvalidQuery, ServiceError
from pipeline.escalation import History
from pipeline.health.fold import FiringFinding, FleetHealth, assess, assessment_json
from pipeline.mirror import TopicMirror
from pipeline.topology import NodeTopology
from pipeline.vocab import NS_PER_S, parse_duration, utc_text
from sinks.query.fleet import finding_episodes, last_reports, open_findings
from sinks.query.model import parse_time
from sinks.query.store import Store


@dataclass(frozen=True, slots=True)
class HealthQuery:
    """Whose health: the fleet (optionally one cluster), one node, or one GPU; GPUs silent for ``silent_after_s``
    are unknown; membership is every GPU that reported within ``lookback_s``."""

    cluster: str | None = None
    node: str | None = None
    gpu: str | None = None
    lookback_s: float = 86_400.0
    silent_after_s: float = 120.0
    #: the past (imported history, last night): judged at ``stop_ns`` (membership: the lookback before it), or
    #: over ``start_ns`` .. ``stop_ns`` (membership: the GPUs that reported in it; a finding open at any moment of
    #: it counts); both None: now, from the alert manager's alerts
    start_ns: int | None = None
    stop_ns: int | None = None

    def validate(self) -> None:
        if self.node and self.gpu:
            raise InvalidQuery("ask for one node or one GPU, not both")
        if not 0 < self.silent_after_s < self.lookback_s:
            raise InvalidQuery("silent-after must be > 0 and shorter than the lookback")
        if self.start_ns is not None and (self.stop_ns is None or self.start_ns >= self.stop_ns):
            raise InvalidQuery("the range is empty: its start must be before its end")

    @property
    def past(self) -> bool:
        return self.stop_ns is not None

    def members_from(self, at_ns: int) -> int:
        """Where the fleet's membership starts: the range's start, else the lookback before ``at_ns``."""
        return self.start_ns if self.start_ns is not None else at_ns - int(self.lookback_s * NS_PER_S)

    def describe(self, at_ns: int | None) -> str:
        """The selection in words, for an empty answer (``at_ns`` None: now)."""
        who = f"cluster {self.cluster}" if self.cluster else "the fleet"
        if at_ns is None:
            when = f"in the last {self.lookback_s:g} s"
        elif self.start_ns is not None:
            when = f"between {utc_text(self.start_ns)} and {utc_text(at_ns)}"
        else:
            when = f"in the {self.lookback_s:g} s before {utc_text(at_ns)}"
        return f"no GPU of {who} reported {when}, and no finding names one"


#: a time as ``--at``/``--range`` (CLI) and ``at``/``range`` (HTTP) take it: RFC 3339 (no zone: UTC), matched whole
_TIME: Final = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:\d{2})?)?")
#: the times epoch nanoseconds in 64 bits can hold (InfluxDB's range)
_EPOCH_NS: Final = range(2**63)


def _when(text: str, now_ns: int, what: str) -> int:
    """A time (RFC 3339) or a duration ago (``3d``: the vocabulary's), the whole text and nothing around it."""
    if text[:5].count("-") == 1 and text[:4].isdigit():  # a date begins it: a time or nothing
        if not _TIME.fullmatch(text):
            raise InvalidQuery(f"{what} {text!r} is not a time like 2025-01-31T12:00:00Z")
        ns = parse_time(text, what)
        if ns not in _EPOCH_NS:
            raise InvalidQuery(f"{what} {text!r} is not between 1970 and 2262")
        return ns
    return now_ns - _duration(text, what)


def _duration(text: str, what: str) -> int:
    if text != text.strip():
        raise InvalidQuery(f"{what} {text!r} has white space around it")
    return parse_duration(text, what, error=InvalidQuery)


def past_of(
    at: str | None, range_: str | None, now_ns: int, names: tuple[str, str] = ("--at", "--range")
) -> tuple[int | None, int | None]:
    """(start, stop) of ``at`` (an instant: start None) or ``range_`` (A..B, or the last D); (None, None): now.
    ``names``: what the asker calls the two (the CLI's options, the HTTP API's parameters)."""
    at_name, range_name = names
    if at is not None and range_ is not None:
        raise InvalidQuery(f"give {at_name} (an instant) or {range_name} (a span), not both")
    if at is not None:
        return None, _when(at, now_ns, at_name)
    if range_ is None:
        return None, None
    if ".." not in range_:
        return now_ns - _duration(range_, range_name), now_ns
    first, _, last = range_.partition("..")
    start, stop = _when(first, now_ns, f"{range_name} start"), _when(last, now_ns, f"{range_name} end")
    if start >= stop:
        raise InvalidQuery(f"{range_name} {range_}: its start must be before its end")
    return start, stop


def node_topologies(settings: Settings) -> list[NodeTopology]:
    """Every node's topology now, from the compacted topology topic (what the CLI and the main job fold with)."""
    mirror = TopicMirror(
        settings.kafka.client_config(), settings.topics.topology, lambda v: decode_record(NodeTopology, v)
    ).start()
    try:
        if not mirror.wait_ready(settings.kafka.request_timeout_s):
            raise ServiceError(
                f"could not read {settings.topics.topology} within {settings.kafka.request_timeout_s:.0f}s"
            )
        return list(mirror.snapshot().values())
    finally:
        mirror.stop()


def fleet_health(
    admin: AlertAdmin | None,
    store: Store,
    q: HealthQuery,
    now_ns: int,
    rules: HealthSettings,
    topologies: Iterable[NodeTopology] = (),
    stale_after_s: float = 180.0,
) -> FleetHealth:
    """The fleet's health now (the alert manager's firing alerts; ``admin`` needed), or at or over a time in the past
    (``q.past``: the findings open then, from the stored finding history, stale where they had gone quiet for
    ``stale_after_s``, as the alert manager marks them). ``topologies`` (the topology topic) say which nodes are in
    a maintenance window now and where each sits: for the past only the findings' own maintenance marks count."""
    at = q.stop_ns if q.stop_ns is not None else now_ns
    back = int(rules.lookback_s * NS_PER_S)
    if q.past:
        start = q.start_ns if q.start_ns is not None else at
        firing = open_findings(store, start, at, back, int(stale_after_s * NS_PER_S), q.cluster)
        topologies = ()
    else:
        assert admin is not None, "the health of now reads the alert manager's alerts"
        firing = [
            FiringFinding(r.alert.labels, r.alert.summary, r.alert.starts_ns, r.alert.evidence, r.alert.stale_since_ns)
            for r in admin.alerts(AlertStatus.FIRING)
            if q.cluster is None or r.alert.labels.get("cluster") == q.cluster
        ]
    fleet = last_reports(store, q.members_from(at), at + NS_PER_S, q.cluster)
    past = finding_episodes(store, at - back, at + NS_PER_S, q.cluster)
    return assess(firing, fleet, at, int(q.silent_after_s * NS_PER_S), History(rules, past).escalate(at), topologies)


def health_json(h: FleetHealth, q: HealthQuery) -> dict[str, Any]:
    """The fleet summary (counts by state, fleet incidents) and the GPUs and nodes asked for: one node (with all its
    GPUs), one GPU, or every GPU and node that is not healthy."""
    gpus, nodes = h.gpus, h.nodes
    if q.gpu:
        gpus = tuple(a for a in gpus if a.gpu == q.gpu)
        nodes = tuple(n for n in nodes if any(a.node == n.node and a.cluster == n.cluster for a in gpus))
    elif q.node:
        gpus = tuple(a for a in gpus if a.node == q.node)
        nodes = tuple(n for n in nodes if n.node == q.node)
    else:
        gpus = tuple(a for a in gpus if a.state.value != "healthy")
        nodes = tuple(n for n in nodes if n.state.value != "healthy")
    if (q.gpu or q.node) and not gpus and not nodes:
        raise InvalidQuery(f"no GPU or node {q.gpu or q.node!r} reported in the lookback, and none has a finding")
    empty = not (h.gpus or h.nodes)
    return {
        # nothing reported and nothing fired: nothing was judged (never "every GPU is healthy"), and why
        "empty": empty,
        "empty_selection": q.describe(q.stop_ns) if empty else None,
        "start_ns": q.start_ns,
        "at_ns": q.stop_ns,
        "gpus_by_state": h.counts("gpus"),
        "nodes_by_state": h.counts("nodes"),
        "incidents": [
            {
                "cluster": i.cluster,
                "detector": i.detector,
                "gpus": i.gpus,
                "of_gpus": i.of_gpus,
                "shared": dict(i.shared),
                "since_ns": i.since_ns,
            }
            for i in h.incidents
        ],
        "nodes": [assessment_json(n) for n in nodes],
        "gpus": [assessment_json(a) for a in gpus],
        # what rules in shadow mode (health.shadow) would have added; they changed nothing above
        "shadow": [
            {
                "cluster": c,
                "node": n,
                "gpu": g,
                "rule": r.detector,
                "state": r.state.value,
                "remedy": r.remedy.value,
                "summary": r.summary,
            }
            for (c, n, g), r in h.shadow
            if (not q.gpu or g == q.gpu) and (not q.node or n == q.node)
        ],
    }


def counted(by_state: dict[str, int], what: str) -> str:
    """``128 GPUs (123 healthy, 3 degraded, 2 unhealthy, 0 unknown)``: a count by state, as the CLI and the main
    job's report print it."""
    return f"{sum(by_state.values())} {what} ({', '.join(f'{n} {state}' for state, n in by_state.items())})"
