"""Per subscription: which alerts to tell whom, when, grouped like Alertmanager. Pure (time is passed in).

Alerts matching a subscription are grouped by its ``group_by`` labels. A group tells its receivers

* ``group_wait`` after it first has something to say (so a burst of alerts arrives as one notification),
* then at most every ``group_interval`` when something changed (a new alert fired, a told one resolved,
  a flapping period ended),
* and every ``repeat_interval`` while alerts keep firing and nothing changed (acknowledged alerts don't count).

What was told is the group's :class:`GroupState` (``sent``: dedup key -> signature). A resolved alert is told
only if its firing was (so every page gets its all-clear, even if a silence started meanwhile). A firing alert
that is silenced or inhibited is not told; that is recorded once per episode (``suppressed``) for the history.
A flapping alert is held: it neither adds nor removes anything until its flapping period ends.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from alerting.lifecycle import flap_note, stale_note
from alerting.model import (
    AlertState,
    AlertStatus,
    AlertView,
    GroupState,
    Subscription,
)
from pipeline.config import AlertSettings

_NS = 1_000_000_000
DAMPED = "damped"


def _period(signature: str | None) -> str:
    return (signature or "").partition(".")[2]


@dataclass(frozen=True, slots=True)
class Timers:
    group_by: tuple[str, ...]
    wait_ns: int
    interval_ns: int
    repeat_ns: int


def timers(sub: Subscription, defaults: AlertSettings) -> Timers:
    group_by = sub.group_by or tuple(x.strip() for x in defaults.group_by.split(",") if x.strip())

    def pick(value: float | None, default: float) -> int:
        return int((default if value is None else value) * _NS)

    return Timers(
        group_by,
        pick(sub.group_wait_s, defaults.group_wait_s),
        pick(sub.group_interval_s, defaults.group_interval_s),
        pick(sub.repeat_interval_s, defaults.repeat_interval_s),
    )


def group_of(labels: dict[str, str], group_by: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """(group key, group labels): the key is stable text, e.g. ``{cluster="dc1",node="n7"}``."""
    if "..." in group_by:
        chosen = dict(sorted(labels.items()))
    else:
        chosen = {name: labels.get(name, "") for name in sorted(group_by)}
    return "{" + ",".join(f'{k}="{v}"' for k, v in chosen.items()) + "}", chosen


@dataclass(frozen=True, slots=True)
class Notification:
    subscription_id: str
    group_key: str
    group_labels: dict[str, str]
    status: AlertStatus
    reason: str
    alerts: tuple[AlertView, ...]


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    """A group after evaluation: its state, the notification due now (if any), newly suppressed alerts, and
    when it next needs evaluating if nothing changes meanwhile (0: not until something changes)."""

    state: GroupState
    notification: Notification | None
    suppressed: list[Suppressed]
    next_due_ns: int


@dataclass(frozen=True, slots=True)
class Suppressed:
    """A change a subscription was not told: silenced or inhibited (``why``), or held while flapping (damped)."""

    subscription_id: str
    group_key: str
    alert: AlertState
    why: str


def view(a: AlertState) -> AlertView:
    annotations = {"summary": a.summary}
    if a.action:
        annotations["action"] = a.action
    if a.evidence:
        annotations["evidence"] = ", ".join(f"{k}={v:g}" for k, v in sorted(a.evidence.items()))
    note = flap_note(a)
    if note:
        annotations["flapping"] = note
    if a.stale_since_ns and a.status is not AlertStatus.RESOLVED:
        annotations["stale"] = stale_note(a.stale_since_ns)
    if a.status is AlertStatus.RESOLVED and a.resolved_reason == "stale":  # an alert resolved by an older version
        annotations["resolved_reason"] = "no finding for this alert arrived for a while (stale)"
    return AlertView(a.dedup_key, a.status, dict(a.labels), annotations, a.starts_ns, a.ends_ns)


def evaluate_group(
    sub: Subscription,
    t: Timers,
    state: GroupState,
    alerts: list[AlertState],
    suppressed_why: Callable[[AlertState], str | None],
    acked: Callable[[AlertState], bool],
    now_ns: int,
) -> GroupOutcome:
    """One group at ``now_ns``."""
    firing: list[AlertState] = []
    changed: list[AlertState] = []
    newly_suppressed: list[Suppressed] = []
    suppressed = dict(state.suppressed)
    sent = state.sent
    present = {a.dedup_key for a in alerts}
    for a in alerts:
        if a.status is AlertStatus.PENDING:
            continue
        sig, told = a.signature, sent.get(a.dedup_key)
        if a.flapping:
            if told is not None and told != sig and suppressed.get(a.dedup_key) != sig:
                suppressed[a.dedup_key] = sig
                newly_suppressed.append(Suppressed(sub.id, state.group_key, a, DAMPED))
            continue
        if a.status is AlertStatus.FIRING:
            why = suppressed_why(a)
            if why is not None:
                if suppressed.get(a.dedup_key) != sig:
                    suppressed[a.dedup_key] = sig
                    newly_suppressed.append(Suppressed(sub.id, state.group_key, a, why))
                continue
            firing.append(a)
            if told != sig:
                changed.append(a)
        elif told is not None and told != sig:
            changed.append(a)  # resolved, and its firing (or the last flapping summary) was told
    # forget what the group told about alerts that no longer exist
    sent = {k: v for k, v in sent.items() if k in present}
    suppressed = {k: v for k, v in suppressed.items() if k in present}
    out = replace(state, sent=sent, suppressed=suppressed)
    resolved_changes = [a for a in changed if a.status is AlertStatus.RESOLVED]
    if not sub.send_resolved and resolved_changes:
        sent = dict(sent) | {a.dedup_key: a.signature for a in resolved_changes}
        out = replace(out, sent=sent)
        changed = [a for a in changed if a.status is AlertStatus.FIRING]
    due = False
    reason = ""
    if changed:
        if out.last_sent_ns == 0:
            if out.first_ns == 0:
                out = replace(out, first_ns=now_ns)
            due = now_ns - out.first_ns >= t.wait_ns
        else:
            due = now_ns - out.last_sent_ns >= t.interval_ns
        if any(_period(sent.get(a.dedup_key)) != _period(a.signature) for a in changed if a.dedup_key in sent):
            reason = "flap-summary"
        elif any(a.status is AlertStatus.FIRING for a in changed):
            reason = "firing"
        else:
            reason = "resolved"
    elif out.last_sent_ns == 0 and out.first_ns:
        out = replace(out, first_ns=0)  # what was waiting resolved before anyone was told
    elif firing and out.last_sent_ns and now_ns - out.last_sent_ns >= t.repeat_ns:
        due = any(not acked(a) for a in firing)
        reason = "repeat"
        if not due:
            # everything firing is acknowledged: restart the repeat clock instead of checking every tick
            out = replace(out, last_sent_ns=now_ns)
    if not due:
        if changed:
            next_due = out.first_ns + t.wait_ns if out.last_sent_ns == 0 else out.last_sent_ns + t.interval_ns
        else:
            next_due = out.last_sent_ns + t.repeat_ns if firing and out.last_sent_ns else 0
        return GroupOutcome(out, None, newly_suppressed, next_due)
    included = sorted(firing, key=lambda a: a.dedup_key) + sorted(
        (a for a in changed if a.status is AlertStatus.RESOLVED), key=lambda a: a.dedup_key
    )
    new_sent = dict(out.sent) | {a.dedup_key: a.signature for a in included}
    status = AlertStatus.FIRING if firing else AlertStatus.RESOLVED
    # after an all-clear the group starts over: a new alert waits group_wait again
    out = replace(out, sent=new_sent, last_sent_ns=now_ns if firing else 0, first_ns=0)
    note = Notification(
        sub.id, state.group_key, dict(state.group_labels), status, reason, tuple(view(a) for a in included)
    )
    return GroupOutcome(out, note, newly_suppressed, now_ns + t.repeat_ns if firing else 0)
