"""The health the alert manager publishes: per GPU (or node: gpu ``-``) whose alerts or escalation changed, the
state, remedy and reasons (:mod:`pipeline.health`), folded from the alerts firing now and the findings'
escalation history (:mod:`pipeline.escalation`). A change is a record for the compacted health topic, keyed
``cluster/node/gpu``, for remediation systems to act on. The manager sees no samples, so nothing here is
"unknown"; a restart publishes every known key again (:meth:`HealthBook.touch`), so none is lost.

Pure but for the clock it is handed: the manager says what changed and publishes :attr:`HealthBook.dirty`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from alerting.model import AlertState, AlertStatus
from pipeline.config import HealthSettings
from pipeline.escalation import Episode, History, episode_of
from pipeline.events import Finding
from pipeline.health.fold import Escalations, FiringFinding, assess, assessment_json
from pipeline.vocab import NS_PER_S

#: whose health: (cluster, node, GPU uuid or "-" for the node)
Key = tuple[str, str, str]
#: how often the escalation history forgets what left its lookback (and escalated keys are looked at again)
_RECHECK_NS = 60 * NS_PER_S


def health_key(labels: dict[str, str]) -> Key:
    """Whose health an alert speaks of."""
    return labels.get("cluster", ""), labels.get("node", ""), labels.get("gpu") or "-"


class HealthBook:
    """What was last published per key, what to look at again, and the changes still to publish (:attr:`dirty`)."""

    def __init__(self, settings: HealthSettings, past: Iterable[Episode] = ()) -> None:
        """``past``: the finding episodes of the lookback as stored (escalation reads them)."""
        self.episodes = History(settings, past)
        #: changes to publish: key bytes -> the assessment as JSON
        self.dirty: dict[bytes, bytes] = {}
        #: reasons escalation rules in shadow mode would give now (published nowhere)
        self.shadow_escalations = 0
        self._said: dict[Key, tuple[str, str, tuple[str, ...]]] = {}
        self._touched: set[Key] = set()
        #: keys whose published health names a reason from the history: looked at again every minute (it expires)
        self._escalated: set[Key] = set()
        self._checked_ns = 0

    def touch(self, keys: Iterable[Key]) -> None:
        """These keys' alerts changed: assess them at the next :meth:`assess`."""
        self._touched.update(keys)

    def seen(self, finding: Finding) -> None:
        """A finding for the escalation history; its GPU (or node) is assessed again if it changed the history."""
        if self.episodes.add(episode_of(finding)):
            self._touched.add((finding.cluster, finding.node, finding.gpu_uuid or "-"))

    def assess(self, alerts: Iterable[AlertState], now_ns: int) -> None:
        """The health of every touched key from its alerts firing now and its escalations; changes go to
        :attr:`dirty`."""
        if now_ns - self._checked_ns >= _RECHECK_NS:
            self._checked_ns = now_ns
            self.episodes.forget(now_ns)
            self._touched |= self._escalated
        if not self._touched:
            return
        escalated = self.episodes.escalate(now_ns)
        self.shadow_escalations = sum(len(r) for r in escalated.shadow.values())
        self._touched.update((cluster, node, "-") for cluster, node in escalated.nodes)
        firing: dict[Key, list[FiringFinding]] = {}
        for a in alerts:
            key = health_key(a.labels)
            if a.status is AlertStatus.FIRING and key in self._touched:
                firing.setdefault(key, []).append(
                    FiringFinding(a.labels, a.summary, a.starts_ns, a.evidence, a.stale_since_ns)
                )
        for key in sorted(self._touched):
            self._assess_one(key, firing.get(key, []), escalated, now_ns)
        self._touched.clear()

    def _assess_one(self, key: Key, firing: list[FiringFinding], escalated: Escalations, now_ns: int) -> None:
        cluster, node, gpu = key
        if gpu == "-":
            past = Escalations(nodes={(cluster, node): escalated.nodes.get((cluster, node), [])})
        else:
            past = Escalations(gpus={key: escalated.gpus.get(key, [])})
        h = assess(firing, [(cluster, node, gpu, now_ns)] if gpu != "-" else [], now_ns, history=past)
        one = h.gpus[0] if gpu != "-" else next(n for n in h.nodes if n.node == node)
        if any(past.gpus.values()) or any(past.nodes.values()):
            self._escalated.add(key)
        else:
            self._escalated.discard(key)
        said = (one.state.value, one.remedy.value, tuple(sorted({r.detector for r in one.reasons})))
        if self._said.get(key) != said:
            self._said[key] = said
            record = assessment_json(one) | {"gpu": None if gpu == "-" else gpu, "last_seen_ns": None, "ts_ns": now_ns}
            self.dirty[f"{cluster}/{node}/{gpu}".encode()] = json.dumps(record).encode()
