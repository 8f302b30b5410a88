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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

from confluent_kafka import KafkaError, KafkaException
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
        TopicSpec(t.notification_history, 1, rf, common | {"retention.ms": str(7 * 24 * _HOUR_MS)}),
        TopicSpec(t.health, 1, rf, compact),
    ]


class MetadataSource(Protocol):
    """What answers a metadata request: a Consumer, a Producer or an AdminClient."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any: ...


def settled(info: Any) -> bool:
    """Whether a topic's metadata (a ``TopicMetadata`` or None) shows it with every partition led: what a reader
    needs before it can read its offsets."""
    return (
        info is not None
        and info.error is None
        and bool(info.partitions)
        and all(p.error is None and p.leader >= 0 for p in info.partitions.values())
    )


def wait_for_topics(client: MetadataSource, names: Sequence[str], timeout_s: float) -> tuple[dict[str, Any], list[str]]:
    """The metadata of each of ``names`` once it is :func:`settled`, asking again with backoff for up to
    ``timeout_s``; returns (metadata by name, the names still not settled).

    A topic that CreateTopics has just acknowledged is in the controller's log, not yet in every broker's metadata
    cache: for a moment a metadata request answers UNKNOWN_TOPIC_OR_PART, then partitions without a leader. A
    process started in that moment (a stage right after ``hermeneut topics``) must wait, not fail."""
    deadline, delay = time.monotonic() + timeout_s, 0.05
    while True:
        remaining = max(1.0, deadline - time.monotonic())
        try:
            found = client.list_topics(names[0] if len(names) == 1 else None, timeout=remaining).topics
        except Exception as exc:  # KafkaException: the broker did not answer within the time left
            if time.monotonic() >= deadline:
                raise ServiceError(f"cannot read the metadata of {', '.join(names)}: {exc}") from exc
            found = {}
        pending = [n for n in names if not settled(found.get(n))]
        if not pending or time.monotonic() >= deadline:
            return {n: found[n] for n in names if n in found}, pending
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)


#: what a partition's leader answers for a moment after the metadata shows it led (it is still loading the log)
_NOT_YET: Final = frozenset(
    {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART}
)
T = TypeVar("T")


def retried(call: Callable[[], T], timeout_s: float) -> T:
    """``call()`` (an offsets or watermark request) asked again with backoff for up to ``timeout_s`` while Kafka
    answers that the partition's leader is not ready: a topic just created is led in the metadata
    (:func:`wait_for_topics`) a moment before its leader serves offsets (NOT_LEADER_FOR_PARTITION)."""
    deadline, delay = time.monotonic() + timeout_s, 0.05
    while True:
        try:
            return call()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not isinstance(err, KafkaError) or err.code() not in _NOT_YET or time.monotonic() >= deadline:
                raise
        time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 1.0)


def ensure_topics(kafka_conf: dict[str, Any], specs: list[TopicSpec], timeout_s: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; returns the names created. Existing topics are left alone.

    Returns only once every topic created is in the broker's metadata with a leader for each partition (within
    ``timeout_s``, else ServiceError): a reader started next finds it."""
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
    _found, pending = wait_for_topics(admin, [s.name for s in missing], timeout_s)
    if pending:
        raise ServiceError(
            f"created topics {', '.join(pending)} but Kafka's metadata shows no leader for them after {timeout_s:.0f}s"
        )
    log.info("created topics %s", ", ".join(created))
    return created
