"""Shadow mode: finding kinds that run store-only (``alerts.shadow``), and what they would have raised.

A new detector, or one whose thresholds just changed, should prove itself before it pages anyone (NVSentinel runs
new rules in dry-run for the same reason). Its findings still reach InfluxDB (the sink stores every finding: they
show in ``hermeneut anomalies`` and the dashboard), but the alert manager neither fires, notifies nor changes a
GPU's health for them. It runs them through the same alert lifecycle (``for``, staleness, ``keep_firing``) in a
ledger of their own and counts the alerts they would have raised, per kind: the stats file, ``/metrics``
(``hermeneut_alerts_shadow_alerts_total``) show them. The ledger is the manager's memory only: a restart starts
its counts again. ``hermeneut alerts shadow`` reports from the stored findings instead, over any range: per kind,
the episodes (one alert each, before ``for``) on how many GPUs and nodes, at which severity (:func:`report`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from alerting.lifecycle import LifecycleConfig, apply_finding, forgettable, tick
from alerting.model import AlertState, AlertStatus
from pipeline.escalation import Episode, worse
from pipeline.events import Finding


@dataclass
class ShadowCounts:
    """Per finding kind: findings seen, alerts it would have raised (each time one would have started firing)."""

    findings: dict[str, int] = field(default_factory=dict)
    alerts: dict[str, int] = field(default_factory=dict)


class Shadow:
    """The ledger of the store-only kinds (module docstring)."""

    def __init__(self, kinds: frozenset[str], life: LifecycleConfig) -> None:
        self.kinds = kinds
        self.life = life
        self.counts = ShadowCounts()
        self._alerts: dict[str, AlertState] = {}

    def holds(self, finding: Finding) -> bool:
        return finding.detector in self.kinds

    def apply(self, finding: Finding, now_ns: int) -> None:
        kind = finding.detector
        self.counts.findings[kind] = self.counts.findings.get(kind, 0) + 1
        old = self._alerts.get(finding.dedup_key)
        new = apply_finding(old, finding, self.life, now_ns)
        if new is not None:
            self._record(old, new)

    def step(self, now_ns: int) -> None:
        for key, old in list(self._alerts.items()):
            new = tick(old, now_ns, self.life)
            if new is not None:
                self._record(old, new)
            if forgettable(self._alerts[key], now_ns, self.life):
                del self._alerts[key]

    def firing(self) -> int:
        return sum(1 for a in self._alerts.values() if a.status is AlertStatus.FIRING)

    def _record(self, old: AlertState | None, new: AlertState) -> None:
        self._alerts[new.dedup_key] = new
        started = new.status is AlertStatus.FIRING and (old is None or old.status is not AlertStatus.FIRING)
        if started:
            kind = new.labels.get("detector", "")
            self.counts.alerts[kind] = self.counts.alerts.get(kind, 0) + 1


@dataclass(frozen=True, slots=True)
class ShadowRow:
    """What one store-only kind would have raised over a range, from its stored findings."""

    kind: str
    episodes: int
    critical: int
    warning: int
    info: int
    gpus: int
    nodes: int


def report(points: Iterable[Episode], kinds: frozenset[str]) -> list[ShadowRow]:
    """Per kind in ``kinds`` (each, even with nothing stored): its episodes (the points of one share its start) at
    their worst severity, and the GPUs and nodes they were on."""
    worst: dict[tuple[str, str, str | None, str, int], str] = {}
    for e in points:
        if e.detector in kinds:
            key = (e.cluster, e.node, e.gpu, e.detector, e.since_ns)
            worst[key] = worse(worst.get(key, "info"), e.severity)
    rows = []
    for kind in sorted(kinds):
        mine = {k: sev for k, sev in worst.items() if k[3] == kind}
        by = list(mine.values())
        rows.append(
            ShadowRow(
                kind,
                len(mine),
                by.count("critical"),
                by.count("warning"),
                by.count("info"),
                len({(c, n, g) for c, n, g, _, _ in mine if g}),
                len({(c, n) for c, n, _, _, _ in mine}),
            )
        )
    return rows
