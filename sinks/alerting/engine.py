"""The alerting engine: lifecycle + silences + inhibition + grouping over every alert and subscription.

Pure and in memory (no Kafka, no clock): the manager feeds it findings and ``now_ns`` and persists what
:meth:`AlertEngine.step` says changed; the unit tests drive the very same object with a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.config import AlertSettings
from pipeline.events import Finding
from sinks.alerting.grouping import Notification, Suppressed, evaluate
from sinks.alerting.inhibit import INHIBITED, SILENCED, Inhibitor, InhibitRule, silenced_by
from sinks.alerting.lifecycle import LifecycleConfig, apply_finding, forgettable, tick
from sinks.alerting.model import Ack, AlertState, AlertStatus, GroupState, Silence, Subscription


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


class AlertEngine:
    def __init__(self, cfg: AlertSettings, rules: tuple[InhibitRule, ...]) -> None:
        self.cfg = cfg
        self.life = LifecycleConfig.of(cfg)
        self.rules = rules
        self.alerts: dict[str, AlertState] = {}
        self.groups: dict[str, dict[str, GroupState]] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self.silences: list[Silence] = []
        self.acks: dict[str, Ack] = {}

    def restore(self, alerts: list[AlertState], groups: list[GroupState]) -> None:
        for a in alerts:
            self.alerts[a.dedup_key] = a
        for g in groups:
            self.groups.setdefault(g.subscription_id, {})[g.group_key] = g

    def configure(self, subscriptions: list[Subscription], silences: list[Silence], acks: list[Ack]) -> None:
        self.subscriptions = {s.id: s for s in subscriptions}
        self.silences = list(silences)
        self.acks = {a.dedup_key: a for a in acks}

    def apply(self, finding: Finding, now_ns: int | None = None) -> AlertState | None:
        """Apply one finding received at ``now_ns``; returns the alert's new state (None: nothing changed)."""
        new = apply_finding(self.alerts.get(finding.dedup_key), finding, self.life, now_ns)
        if new is not None:
            self.alerts[new.dedup_key] = new
        return new

    def acked(self, a: AlertState) -> bool:
        ack = self.acks.get(a.dedup_key)
        return ack is not None and a.status is AlertStatus.FIRING and ack.at_ns >= a.starts_ns

    def step(self, now_ns: int) -> StepResult:
        out = StepResult()
        for key, old in list(self.alerts.items()):
            a = tick(old, now_ns, self.life) or old
            if a is not old:
                self.alerts[key] = a
                out.alerts.append(a)
            if forgettable(a, now_ns, self.life):
                del self.alerts[key]
                out.forgotten.append(a)
        inhibitor = Inhibitor(self.rules, self.alerts.values())
        silences = self.silences

        def why(a: AlertState) -> str | None:
            if silenced_by(a, silences, now_ns) is not None:
                return SILENCED
            return INHIBITED if inhibitor.inhibited(a) else None

        alerts = list(self.alerts.values())
        for sub in self.subscriptions.values():
            groups = self.groups.setdefault(sub.id, {})
            changed, notes, held = evaluate(sub, self.cfg, groups, alerts, why, self.acked, now_ns)
            for gk, g in changed.items():
                if _empty(g):
                    if groups.pop(gk, None) is not None:
                        out.dropped_groups.append(g)
                else:
                    groups[gk] = g
                    out.groups.append(g)
            out.notifications.extend((sub, n) for n in notes)
            out.suppressed.extend((sub, h) for h in held)
        for sub_id in [s for s in self.groups if s not in self.subscriptions]:
            out.dropped_groups.extend(self.groups.pop(sub_id).values())
        return out

    def firing(self) -> int:
        return sum(a.status is AlertStatus.FIRING for a in self.alerts.values())
