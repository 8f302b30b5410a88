"""The Kafka topics of one deployment, with explicit partitions and configs, and their (idempotent) creation.

| topic        | key               | cleanup          | why                                                       |
|--------------|-------------------|------------------|-----------------------------------------------------------|
| raw          | cluster/node      | delete, 24 h     | one node's samples (so each GPU's) stay in one partition   |
| context      | cluster/node/gpu  | compact          | latest workload per GPU; a restarted worker re-reads it   |
| topology     | cluster/node      | compact          | latest interconnect of each node                          |
| interpreted  | (partition = raw) | delete, 24 h     | input of the sinks                                        |
| alerts       | finding dedup key | delete, 7 days   | detector findings: input of alert delivery and history    |
| dead_letter  | original key      | delete, 14 days  | original bytes + reason headers, for inspection/replay    |
| ground_truth | cluster/node      | delete, 30 days  | the simulator's injected faults, for evaluation           |
| baselines    | baseline id       | compact          | learned baselines, hot-reloaded by running processors     |
| feedback     | event id          | compact          | operators' verdicts on events, read by the next training  |
| alert_state  | alert dedup key   | compact          | alert lifecycle state: survives a restart of alerting     |
| alert_config | subscription/silence id | compact    | subscriptions and silences (tombstone = deleted)          |
| notifications| alert group key   | delete, 7 days   | what the Kafka receiver of a subscription delivers        |
| health       | cluster/node/gpu  | compact          | each GPU's (and node's) health state, for remediation     |
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.config import Settings
from pipeline.errors import ServiceError

log = logging.getLogger(__name__)

_HOUR_MS = 3600 * 1000


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = field(default_factory=dict)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    t = settings.topics
    rf = t.replication_factor
    min_isr = str(min(2, rf))
    common = {"min.insync.replicas": min_isr, "compression.type": "producer"}
    compact = common | {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000", "segment.ms": str(_HOUR_MS)}
    small = max(1, t.partitions // 2)
    raw_retention = common | {"retention.ms": str(int(t.raw_retention_hours * _HOUR_MS))}
    return [
        TopicSpec(t.raw, t.partitions, rf, raw_retention),
        TopicSpec(t.context, t.partitions, rf, compact),
        TopicSpec(t.topology, small, rf, compact),
        TopicSpec(t.interpreted, t.partitions, rf, raw_retention),
        TopicSpec(t.alerts, small, rf, common | {"retention.ms": str(7 * 24 * _HOUR_MS)}),
        TopicSpec(t.dead_letter, small, rf, common | {"retention.ms": str(14 * 24 * _HOUR_MS)}),
        TopicSpec(t.ground_truth, 1, rf, common | {"retention.ms": str(30 * 24 * _HOUR_MS)}),
        # baselines can be a few hundred kB each: allow messages up to 8 MiB
        TopicSpec(t.baselines, 1, rf, compact | {"max.message.bytes": str(8 * 2**20)}),
        TopicSpec(t.feedback, 1, rf, compact),
        TopicSpec(t.alert_state, 1, rf, compact),
        TopicSpec(t.alert_config, 1, rf, compact),
        TopicSpec(t.notifications, 1, rf, common | {"retention.ms": str(7 * 24 * _HOUR_MS)}),
        TopicSpec(t.health, 1, rf, compact),
    ]


def ensure_topics(kafka_conf: dict[str, Any], specs: list[TopicSpec], timeout_s: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; returns the names created. Existing topics are left alone."""
    admin = AdminClient(kafka_conf)
    try:
        existing = admin.list_topics(timeout=timeout_s).topics
    except Exception as exc:
        raise ServiceError(f"cannot reach Kafka at {kafka_conf.get('bootstrap.servers')}: {exc}") from exc
    for spec in specs:
        if spec.name in existing and len(existing[spec.name].partitions) != spec.partitions:
            log.warning(
                "topic %s has %d partitions, config says %d: left as is",
                spec.name,
                len(existing[spec.name].partitions),
                spec.partitions,
            )
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in missing],
        operation_timeout=timeout_s,
    )
    created = []
    for name, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
            created.append(name)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ServiceError(f"cannot create topic {name}: {exc}") from exc
    log.info("created topics %s", ", ".join(created))
    return created
