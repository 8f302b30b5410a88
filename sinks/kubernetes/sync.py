"""The controller behind ``hermeneut kubernetes sync``: the health topic mirrored (compacted: every GPU's latest
state), and the cluster reconciled with it on every change and every ``interval_s`` (:mod:`sinks.kubernetes.plan`
says what to write).

Level-based, as Kubernetes controllers are: each round reads the nodes, the DRA driver's ResourceSlices and the
DeviceTaintRules it owns, and writes only the difference, so a restart, a lost write or a rule someone deleted by
hand is mended by the next round. Nothing is written before the whole topic has been read (a partial view would
lift taints that are still due). One refused write is logged and counted and the others still go; writes are
paced to ``writes_per_s``. A dry run reads everything and writes nothing: it prints what it would do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from pipeline.config import Settings
from pipeline.errors import ServiceError
from pipeline.metrics import Field, StatsView, counter, gauge
from pipeline.mirror import TopicMirror
from pipeline.vocab import NS_PER_S, utc_text
from sinks.kubernetes.api import NODES, RULES, SLICES, ApiError, Client
from sinks.kubernetes.plan import (
    MANAGED_BY,
    Condition,
    HealthRecord,
    Plan,
    Policy,
    devices_of,
    parse_record,
    plan,
    rule_of,
)

log = logging.getLogger(__name__)
#: the least time between two rounds a change on the topic starts
_SETTLE_S = 1.0


@dataclass
class SyncStats:
    rounds: int = 0
    conditions_written: int = 0
    rules_created: int = 0
    rules_updated: int = 0
    rules_deleted: int = 0
    #: writes the API server refused or did not answer (retried by the next round)
    write_errors: int = 0
    #: the last round's: GPUs the breaker held at effect None, GPUs without a DRA device, nodes not in the cluster
    held: int = 0
    unplaced: int = 0
    absent_nodes: int = 0
    #: health records that could not be read (skipped, logged)
    bad_records: int = 0
    #: rounds that could not read the cluster (nothing written; the next round tries again)
    read_errors: int = 0
    #: when the last round that read the cluster ended (Unix time; 0: none yet)
    last_round_s: float = 0.0
    errors: list[str] = field(default_factory=list)


#: the controller's counters on /metrics (docs/metrics.md): one counter, two views (pipeline.metrics.StatsView)
SYNC_FIELDS: tuple[Field, ...] = (
    counter("rounds", "hermeneut_kubernetes_rounds_total", "Rounds that read the cluster and planned."),
    counter("conditions_written", "hermeneut_kubernetes_conditions_written_total", "Node conditions written."),
    counter("rules_created", "hermeneut_kubernetes_taint_rules_created_total", "DeviceTaintRules created."),
    counter("rules_updated", "hermeneut_kubernetes_taint_rules_updated_total", "DeviceTaintRules changed."),
    counter("rules_deleted", "hermeneut_kubernetes_taint_rules_deleted_total", "DeviceTaintRules deleted."),
    counter(
        "write_errors",
        "hermeneut_kubernetes_write_errors_total",
        "Writes the API server refused or did not answer (the next round retries them).",
    ),
    counter("read_errors", "hermeneut_kubernetes_read_errors_total", "Rounds that could not read the cluster."),
    counter("bad_records", "hermeneut_kubernetes_bad_health_records_total", "Health records that could not be read."),
    gauge("held", "hermeneut_kubernetes_held_gpus", "GPUs the breaker holds at effect None (last round)."),
    gauge("unplaced", "hermeneut_kubernetes_unplaced_gpus", "GPUs to taint without a DRA device (last round)."),
    gauge(
        "absent_nodes", "hermeneut_kubernetes_absent_nodes", "Nodes with health but not in the cluster (last round)."
    ),
    gauge(
        "last_round_s",
        "hermeneut_kubernetes_last_round_timestamp_seconds",
        "When the last round that read the cluster ended (Unix time).",
    ),
)


def conditions_of(nodes: Iterable[Mapping[str, Any]], kind: str) -> dict[str, tuple[Condition | None, str | None]]:
    """Node name -> its condition of type ``kind`` as it is now and when it last changed (None: it has none)."""
    found: dict[str, tuple[Condition | None, str | None]] = {}
    for n in nodes:
        name = str((n.get("metadata") or {}).get("name", ""))
        found[name] = (None, None)
        for c in (n.get("status") or {}).get("conditions") or []:
            if c.get("type") == kind:
                cond = Condition(str(c.get("status", "")), str(c.get("reason", "")), str(c.get("message", "")))
                found[name] = (cond, c.get("lastTransitionTime"))
    return found


def describe(p: Plan, condition_type: str, taint_key: str) -> list[str]:
    """The plan as lines a person reads (what a dry run prints)."""
    lines = [f"node {n}: condition {condition_type}={c.status} ({c.reason}): {c.message}" for n, c in p.conditions]
    lines += [f"taint {r.gpu} on {r.node}: create {taint_key}={r.value}:{r.effect} ({r.reason})" for r in p.create]
    lines += [f"taint {r.gpu} on {r.node}: change to {taint_key}={r.value}:{r.effect} ({r.reason})" for r in p.update]
    lines += [f"taint rule {name}: delete (its GPU is healthy, or no longer in the health topic)" for name in p.delete]
    lines += [f"held {h.gpu} on {h.node} at None instead of {h.wanted}: {h.why}" for h in p.held]
    lines += [f"cannot taint {g} on {n}: no ResourceSlice device has uuid {g}" for n, g in p.unplaced]
    lines += [f"node {n}: not in the cluster, nothing written" for n in p.absent_nodes]
    return lines


class Controller:
    """One cluster's reconciler; :meth:`reconcile` is one round over the records given."""

    def __init__(
        self,
        settings: Settings,
        client: Client,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cfg = settings.kubernetes
        self.cluster = settings.cluster
        self.client = client
        self.dry_run = dry_run
        self.policy = Policy(self.cfg.taint_key, self.cfg.no_execute, self.cfg.max_tainted_share)
        self.stats = SyncStats()
        self._clock, self._sleep = clock, sleep
        self._next_write = 0.0
        if registry is not None:
            registry.register(StatsView(lambda: vars(self.stats), SYNC_FIELDS))

    def reconcile(self, records: Iterable[HealthRecord]) -> Plan:
        """Read the cluster, plan, and (unless a dry run) write the difference."""
        mine = [r for r in records if r.cluster == self.cluster]
        nodes = conditions_of(self.client.list(NODES), self.cfg.condition_type)
        devices = devices_of(self.client.list(SLICES), self.cfg.dra_driver)
        selector = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"
        rules = [r for r in (rule_of(o) for o in self.client.list(RULES, label_selector=selector)) if r is not None]
        p = plan(mine, {n: c for n, (c, _) in nodes.items()}, devices, rules, self.policy)
        self.stats.rounds += 1
        self.stats.held, self.stats.unplaced, self.stats.absent_nodes = (
            len(p.held),
            len(p.unplaced),
            len(p.absent_nodes),
        )
        if not self.dry_run:
            self._apply(p, nodes)
        self.stats.last_round_s = self._clock()
        return p

    def _apply(self, p: Plan, nodes: Mapping[str, tuple[Condition | None, str | None]]) -> None:
        now = utc_text(int(self._clock() * NS_PER_S))
        for node, cond in p.conditions:
            old, since = nodes.get(node, (None, None))
            changed = old is None or old.status != cond.status
            body = {
                "type": self.cfg.condition_type,
                "status": cond.status,
                "reason": cond.reason,
                "message": cond.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now if changed or since is None else since,
            }
            if self._write(
                f"condition on {node}",
                self.client.strategic,
                f"{NODES}/{node}/status",
                {"status": {"conditions": [body]}},
            ):
                self.stats.conditions_written += 1
        key = self.cfg.taint_key
        for rule in p.create:
            if self._write(f"taint rule {rule.name}", self.client.create, RULES, rule.manifest(key)):
                self.stats.rules_created += 1
        for rule in p.update:
            m = rule.manifest(key)
            patch = {
                "metadata": {"labels": m["metadata"]["labels"], "annotations": m["metadata"]["annotations"]},
                "spec": m["spec"],
            }
            if self._write(f"taint rule {rule.name}", self.client.merge, f"{RULES}/{rule.name}", patch):
                self.stats.rules_updated += 1
        for name in p.delete:
            if self._write(f"taint rule {name}", self.client.delete, f"{RULES}/{name}"):
                self.stats.rules_deleted += 1

    def _write(self, what: str, call: Callable[..., Any], *args: Any) -> bool:
        """One paced write; a refusal is logged and counted, never raised (the next round tries again)."""
        wait = self._next_write - self._clock()
        if wait > 0:
            self._sleep(wait)
        self._next_write = max(self._clock(), self._next_write) + 1.0 / self.cfg.writes_per_s
        try:
            call(*args)
        except ApiError as exc:
            self.stats.write_errors += 1
            self.stats.errors = [*self.stats.errors[-9:], f"{what}: {exc}"]
            log.error("kubernetes sync: %s not written: %s", what, exc)
            return False
        return True


def run(
    settings: Settings,
    controller: Controller,
    stop: threading.Event,
    once: bool = False,
    on_round: Callable[[Plan], None] | None = None,
    ready_timeout_s: float = 60.0,
) -> SyncStats:
    """Mirror the health topic and reconcile on every change and every ``interval_s`` until ``stop`` (or after
    one round with ``once``)."""
    mirror: TopicMirror[HealthRecord] = TopicMirror(
        settings.kafka.client_config(), settings.topics.health, parse_record
    ).start()
    try:
        if not mirror.wait_ready(ready_timeout_s):
            raise ServiceError(f"could not read {settings.topics.health} within {ready_timeout_s:.0f}s")
        seen, last = -1, 0.0
        while not stop.is_set():
            since = time.monotonic() - last
            # a change is acted on within a second (a burst of records is one round), anything else every interval
            if (mirror.version != seen and since >= _SETTLE_S) or since >= controller.cfg.interval_s:
                seen, last = mirror.version, time.monotonic()
                controller.stats.bad_records = mirror.invalid
                try:
                    p = controller.reconcile(mirror.snapshot().values())
                except ApiError as exc:  # the cluster could not be read: nothing written, try again next round
                    log.error("kubernetes sync: cannot read the cluster: %s", exc)
                    controller.stats.read_errors += 1
                    controller.stats.errors = [*controller.stats.errors[-9:], str(exc)]
                    if once:
                        raise
                else:
                    if p.writes or p.held or p.unplaced:
                        log.info(
                            "kubernetes sync: %d writes, %d held by the breaker, %d without a DRA device",
                            p.writes,
                            len(p.held),
                            len(p.unplaced),
                        )
                    if on_round is not None:
                        on_round(p)
                if once:
                    break
            stop.wait(0.2)
    finally:
        mirror.stop()
    return controller.stats
