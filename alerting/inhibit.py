"""Inhibition and silences: which firing alerts must not notify right now, and why. Pure functions.

An inhibition rule reads ``SOURCE -> TARGET on LABEL,LABEL`` (matchers in braces or comma-separated): a firing
alert matching SOURCE mutes every other firing alert matching TARGET that has the same values of the listed
labels. The defaults (settings ``alerts.inhibit_rules``): a silent node mutes its other alerts; a GPU that
fell off the bus mutes that GPU's other alerts (its thermal, NVLink, straggler... alerts are consequences).
A silenced source still inhibits, as in Alertmanager. An alert whose node its scheduler holds out of service (the
``maintenance`` label: a drain, a maintenance reservation, a cordon) is muted as in a silence the scheduler set: a
maintenance window is not a fault, and nobody has to remember to silence it by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from alerting.model import (
    LABELS,
    AlertState,
    AlertStatus,
    Matcher,
    Silence,
    matches_all,
    parse_matchers,
)
from pipeline.errors import AlertConfigError, ConfigError

SILENCED = "silence"
INHIBITED = "inhibited"
MAINTENANCE = "maintenance"


@dataclass(frozen=True, slots=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]


def _matcher_list(text: str) -> tuple[Matcher, ...]:
    text = text.strip()
    return parse_matchers([text] if text.startswith("{") else ["{" + text + "}"])


def parse_inhibit_rule(text: str) -> InhibitRule:
    """``detector="fallen-off-bus" -> detector!="fallen-off-bus" on cluster,node,gpu`` -> InhibitRule."""
    source, arrow, rest = text.partition("->")
    target, on, equal = rest.rpartition(" on ")
    if not arrow or not on:
        raise AlertConfigError(f"inhibit rule {text.strip()!r} is not 'SOURCE -> TARGET on LABEL,LABEL'")
    labels = tuple(x.strip() for x in equal.split(",") if x.strip())
    unknown = [x for x in labels if x not in LABELS]
    if unknown or not labels:
        raise AlertConfigError(f"inhibit rule {text.strip()!r}: 'on' needs labels from {', '.join(LABELS)}")
    rule = InhibitRule(_matcher_list(source), _matcher_list(target), labels)
    if not rule.source or not rule.target:
        raise AlertConfigError(f"inhibit rule {text.strip()!r} needs source and target matchers")
    return rule


def parse_inhibit_rules(text: str) -> tuple[InhibitRule, ...]:
    """The ``;``-separated rules of the settings; a bad rule is a ConfigError (stops start-up with one line)."""
    try:
        return tuple(parse_inhibit_rule(part) for part in text.split(";") if part.strip())
    except AlertConfigError as exc:
        raise ConfigError(f"invalid configuration: alerts.inhibit_rules: {exc}") from exc


class Inhibitor:
    """Built once per evaluation from every firing alert; answers "is this alert inhibited" in O(rules)."""

    def __init__(self, rules: tuple[InhibitRule, ...], alerts: Iterable[AlertState]) -> None:
        self._rules = rules
        firing = [a for a in alerts if a.status is AlertStatus.FIRING]
        # per rule: the equal-label values of every source alert, with its key (an alert never inhibits itself)
        self._sources: list[dict[tuple[str, ...], set[str]]] = []
        for rule in rules:
            index: dict[tuple[str, ...], set[str]] = {}
            for a in firing:
                if matches_all(rule.source, a.labels):
                    index.setdefault(tuple(a.labels.get(x, "") for x in rule.equal), set()).add(a.dedup_key)
            self._sources.append(index)

    def inhibited(self, alert: AlertState) -> bool:
        for rule, index in zip(self._rules, self._sources, strict=True):
            if not index or not matches_all(rule.target, alert.labels):
                continue
            sources = index.get(tuple(alert.labels.get(x, "") for x in rule.equal))
            if sources and (len(sources) > 1 or alert.dedup_key not in sources):
                return True
        return False


def silenced_by(alert: AlertState, silences: Iterable[Silence], now_ns: int) -> str | None:
    """The id of an active silence matching the alert, or None."""
    for s in silences:
        if s.active(now_ns) and matches_all(s.matchers, alert.labels):
            return s.id
    return None
