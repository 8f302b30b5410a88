"""The alerting engine: lifecycle + silences + inhibition + grouping over every alert and subscription.

Pure and in memory (no Kafka, no clock): the manager feeds it findings and ``now_ns`` and persists what
:meth:`AlertEngine.step` says changed; the unit tests drive the very same object with a fake clock.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from alerting.grouping import Notification, Suppressed, evaluate_group, group_of, timers
from alerting.inhibit import INHIBITED, MAINTENANCE, SILENCED, Inhibitor, InhibitRule, silenced_by
from alerting.lifecycle import LifecycleConfig, apply_finding, forgettable, tick
from alerting.model import Ack, AlertState, AlertStatus, GroupState, Silence, Subscription, matches_all
from pipeline.config import AlertSettings
from pipeline.events import Finding


@dataclass
class StepResult:
    """What one step changed: records to write (``alerts``, ``groups``), keys to tombstone, what to send."""

    alerts: list[AlertState] = field(default_factory=list)
    forgotten: list[AlertState] = field(default_factory=list)
    groups: list[GroupState] = field(default_factory=list)
    dropped_groups: list[GroupState] = field(default_factory=list)
    notifications: list[tuple[Subscription, Notification]] = field(default_factory=list)
    suppressed: list[tuple[Subscription, Suppressed]] = field(default_factory=list)


def _empty(g: GroupState) -> bool:
    return not g.sent and not g.suppressed and not g.first_ns and not g.last_sent_ns


def _visible_change(old: AlertState | None, new: AlertState | None) -> bool:
    """A change a group can see (a repeat that only moves ``last_seen`` is not one)."""
    if old is None or new is None:
        return old is not new
    return (
        old.signature != new.signature
        or old.status is not new.status
        or old.flapping != new.flapping
        or old.labels != new.labels
    )


class AlertEngine:
    """Evaluation is incremental: a step evaluates only the groups an alert changed visibly in, and those whose
    timer (group wait, group interval, repeat) is due. Everything is re-evaluated after a configuration change,
    when a silence starts or ends, and when an alert that can inhibit others changed."""

    def __init__(self, cfg: AlertSettings, rules: tuple[InhibitRule, ...]) -> None:
        self.cfg = cfg
        self.life = LifecycleConfig.of(cfg)
        self.rules = rules
        self.alerts: dict[str, AlertState] = {}
        self.groups: dict[str, dict[str, GroupState]] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.silences: list[Silence] = []
        self.acks: dict[str, Ack] = {}
        # per subscription: dedup key -> group key of the alerts it matches, and the reverse
        self._member: dict[str, dict[str, str]] = {}
        self._members: dict[str, dict[str, set[str]]] = {}
        self._group_labels: dict[tuple[str, str], dict[str, str]] = {}
        # when each group's timer is next due, and a heap of the same (stale entries skipped when popped)
        self._due: dict[tuple[str, str], int] = {}
        self._heap: list[tuple[int, str, str]] = []
        self._dirty: set[str] = set()
        self._full = True
        self._last_step_ns = 0

    def restore(self, alerts: list[AlertState], groups: list[GroupState]) -> None:
        for a in alerts:
            self.alerts[a.dedup_key] = a
        for g in groups:
            self.groups.setdefault(g.subscription_id, {})[g.group_key] = g
        self._full = True

    def configure(self, subscriptions: list[Subscription], silences: list[Silence], acks: list[Ack]) -> None:
        self.subscriptions = {s.id: s for s in subscriptions}
        self.silences = list(silences)
        self.acks = {a.dedup_key: a for a in acks}
        self._full = True

    def apply(self, finding: Finding, now_ns: int | None = None) -> AlertState | None:
        """Apply one finding received at ``now_ns``; returns the alert's new state (None: nothing changed)."""
        old = self.alerts.get(finding.dedup_key)
        new = apply_finding(old, finding, self.life, now_ns)
        if new is not None:
            self.alerts[new.dedup_key] = new
            if _visible_change(old, new):
                self._dirty.add(new.dedup_key)
        return new

    def acked(self, a: AlertState) -> bool:
        ack = self.acks.get(a.dedup_key)
        return ack is not None and a.status is AlertStatus.FIRING and ack.at_ns >= a.starts_ns

    def _silence_edge(self, now_ns: int) -> bool:
        """Did a silence start or end since the last step?"""
        last = self._last_step_ns
        return any(last < s.starts_ns <= now_ns or last < s.ends_ns <= now_ns for s in self.silences)

    def _can_inhibit(self, labels: dict[str, str]) -> bool:
        return any(matches_all(rule.source, labels) for rule in self.rules)

    def _place(
        self, sub: Subscription, group_by: tuple[str, ...], key: str, a: AlertState | None, todo: set[str]
    ) -> None:
        """Put alert ``key`` in the right group of ``sub`` (or none); both groups touched need evaluating."""
        member, members = self._member.setdefault(sub.id, {}), self._members.setdefault(sub.id, {})
        old = member.get(key)
        new = None
        if a is not None and matches_all(sub.matchers, a.labels):
            new, labels = group_of(a.labels, group_by)
            self._group_labels.setdefault((sub.id, new), labels)
        if old != new:
            if old is not None:
                members[old].discard(key)
                del member[key]
            if new is not None:
                members.setdefault(new, set()).add(key)
                member[key] = new
        todo.update(g for g in (old, new) if g is not None)

    def step(self, now_ns: int) -> StepResult:
        out = StepResult()
        dirty = self._dirty
        for key, old in list(self.alerts.items()):
            a = tick(old, now_ns, self.life) or old
            if a is not old:
                self.alerts[key] = a
                out.alerts.append(a)
                if _visible_change(old, a):
                    dirty.add(key)
            if forgettable(a, now_ns, self.life):
                del self.alerts[key]
                out.forgotten.append(a)
                dirty.add(key)
        full = self._full or self._silence_edge(now_ns)
        if not full and self.rules:
            full = any(self._can_inhibit(a.labels) for a in out.forgotten) or any(
                self._can_inhibit(self.alerts[k].labels) for k in dirty if k in self.alerts
            )
        todo: dict[str, set[str]] = {sub_id: set() for sub_id in self.subscriptions}
        if full:
            self._member, self._members, self._due, self._heap = {}, {}, {}, []
            for sub in self.subscriptions.values():
                group_by = timers(sub, self.cfg).group_by
                for key, a in self.alerts.items():
                    self._place(sub, group_by, key, a, todo[sub.id])
                todo[sub.id].update(self.groups.get(sub.id, {}))
        else:
            by = {sub.id: timers(sub, self.cfg).group_by for sub in self.subscriptions.values()}
            for key in dirty:
                current = self.alerts.get(key)
                for sub in self.subscriptions.values():
                    self._place(sub, by[sub.id], key, current, todo[sub.id])
            while self._heap and self._heap[0][0] <= now_ns:
                due, sub_id, gk = heapq.heappop(self._heap)
                if self._due.get((sub_id, gk)) == due and sub_id in todo:
                    todo[sub_id].add(gk)
        silences = self.silences
        inhibitors: list[Inhibitor] = []  # built on first use: most steps evaluate no firing alert at all

        def why(a: AlertState) -> str | None:
            if a.labels.get("maintenance"):
                return MAINTENANCE
            if silenced_by(a, silences, now_ns) is not None:
                return SILENCED
            if not inhibitors:
                inhibitors.append(Inhibitor(self.rules, self.alerts.values()))
            return INHIBITED if inhibitors[0].inhibited(a) else None

        for sub_id, group_keys in todo.items():
            sub = self.subscriptions[sub_id]
            t = timers(sub, self.cfg)
            groups = self.groups.setdefault(sub_id, {})
            members = self._members.get(sub_id, {})
            for gk in group_keys:
                keys = members.get(gk, set())
                state = groups.get(gk) or GroupState(sub_id, gk, self._group_labels.get((sub_id, gk), {}))
                alerts = [self.alerts[k] for k in sorted(keys)]
                result = evaluate_group(sub, t, state, alerts, why, self.acked, now_ns)
                g = result.state
                if _empty(g):
                    if groups.pop(gk, None) is not None:
                        out.dropped_groups.append(g)
                elif g != state or gk not in groups:
                    groups[gk] = g
                    out.groups.append(g)
                if result.next_due_ns:
                    if self._due.get((sub_id, gk)) != result.next_due_ns:
                        self._due[(sub_id, gk)] = result.next_due_ns
                        heapq.heappush(self._heap, (result.next_due_ns, sub_id, gk))
                else:
                    self._due.pop((sub_id, gk), None)
                if not keys:
                    members.pop(gk, None)
                    self._group_labels.pop((sub_id, gk), None)
                if result.notification is not None:
                    out.notifications.append((sub, result.notification))
                out.suppressed.extend((sub, h) for h in result.suppressed)
        for sub_id in [s for s in self.groups if s not in self.subscriptions]:
            out.dropped_groups.extend(self.groups.pop(sub_id).values())
        self._dirty = set()
        self._full = False
        self._last_step_ns = now_ns
        return out

    def firing(self) -> int:
        return sum(a.status is AlertStatus.FIRING for a in self.alerts.values())
