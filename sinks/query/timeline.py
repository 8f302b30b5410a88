"""One GPU's timeline: everything the pipeline concluded about it over a range, newest first, for the dashboard's
GPU view (the marks on its charts' time axis) and anyone asking "what happened to this GPU".

Three sources, all raw data: detector findings (``finding``: a start and a clear per episode; the repeats sent
every minute while a finding is active are left out, but for the first one in range of an episode that started
before it), discrete GPU events (``gpu_event``: XIDs, ECC, GPU lost) and the interpreted samples judged
``anomalous`` (with their explanation).
The GPU id is validated like every scope value before it reaches a query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pipeline.errors import InvalidQuery
from sinks.influxdb.schema import FINDING, GPU, GPU_EVENT
from sinks.query.model import FieldEquals, Points, TagIn, TimeRange, check_value, resolve_range
from sinks.query.store import Store, now_ns

KINDS: Final = ("finding", "gpu_event", "anomalous")
_FINDING_FIELDS: Final = ("active", "summary", "action", "since_ns")
#: a finding record within this of its episode's start is the start (not a repeat)
_START_SLACK_NS: Final = 2 * 10**9


@dataclass(frozen=True, slots=True)
class TimelineQuery:
    gpu: str
    range: str | None = "30m"
    limit: int = 200
    start: str | None = None
    stop: str | None = None

    def validate(self) -> TimelineQuery:
        check_value(self.gpu, "gpu")
        if not 1 <= self.limit <= 10_000:
            raise InvalidQuery(f"limit {self.limit} is not between 1 and 10000")
        return self

    def time_range(self, now: int) -> TimeRange:
        return resolve_range(self.range, self.start, self.stop, now, "30m")


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    time_ns: int
    kind: str  # one of KINDS
    severity: str  # critical | warning | info
    title: str
    text: str


@dataclass(frozen=True, slots=True)
class Timeline:
    range: TimeRange
    events: tuple[TimelineEvent, ...]


def _xid_severity(kind: str, code: str) -> str:
    if kind in ("gpu_lost", "ecc_double_bit", "row_remap"):
        return "critical"
    return "warning" if kind == "xid" else "info"


def gpu_timeline(store: Store, q: TimelineQuery, now: int | None = None) -> Timeline:
    """The GPU's findings, events and anomalous samples in the range, newest first (at most ``limit`` of each)."""
    q.validate()
    tr = q.time_range(now_ns() if now is None else now)
    gpu = (TagIn("gpu", (q.gpu,)),)
    raw = store.buckets.raw
    events: list[TimelineEvent] = []
    findings, _ = store.points(Points(raw, FINDING, _FINDING_FIELDS, tr, gpu, q.limit))
    seen: set[tuple[str, float]] = set()
    for p in sorted(findings, key=lambda p: p.time_ns):
        active, since = bool(p.get("active")), p.get("since_ns")
        episode = (p.tag("detector"), since if isinstance(since, float) else float(p.time_ns))
        if active and episode in seen:
            continue  # a repeat of an episode already on the timeline
        seen.add(episode)
        started = not active or episode[1] >= p.time_ns - _START_SLACK_NS
        title = f"{p.tag('detector')} {'cleared' if not active else 'started' if started else 'active'}"
        text = str(p.get("summary") or "") + (f" — {p.get('action')}" if active and p.get("action") else "")
        events.append(TimelineEvent(p.time_ns, "finding", p.tag("severity") if active else "info", title, text))
    gpu_events, _ = store.points(Points(raw, GPU_EVENT, ("detail",), tr, gpu, q.limit))
    for p in gpu_events:
        kind, code = p.tag("kind"), p.tag("code")
        title = f"XID {code}" if kind == "xid" else kind.replace("_", " ")
        events.append(TimelineEvent(p.time_ns, "gpu_event", _xid_severity(kind, code), title, str(p.get("detail"))))
    anomalous, _ = store.points(
        Points(raw, GPU, ("verdict", "explanation"), tr, (*gpu, FieldEquals("verdict", "anomalous")), q.limit)
    )
    for p in anomalous:
        events.append(TimelineEvent(p.time_ns, "anomalous", "warning", "anomalous", str(p.get("explanation") or "")))
    events.sort(key=lambda e: e.time_ns, reverse=True)
    return Timeline(tr, tuple(events))
