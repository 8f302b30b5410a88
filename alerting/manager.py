"""The alert manager service (``hermeneut alerts run``): findings in, notifications out, state in Kafka.

Start-up rebuilds everything from Kafka: alert states, the groups' notification logs and the outbox from the
compacted ``topics.alert_state``; subscriptions, silences and acks from ``topics.alert_config`` (mirrored for
the whole run, so changes apply within a tick). Deliveries left in the outbox by the previous run are sent.

Then one loop, in this order (the order is the crash-safety argument):

1. consume findings (consumer group ``<group_prefix>-alerting``); undecodable ones go to the dead-letter topic;
2. apply them to the lifecycle and run the timers; evaluate every subscription's groups; each notification
   becomes one outbox :class:`Delivery` per receiver; suppressed/damped ones become history records
   (:class:`pipeline.notifications.NotificationRecord`, as every delivery attempt does);
3. publish every changed state record (alerts, groups, new outbox entries, tombstones of finished ones), the
   health changes and the history records, and wait for Kafka's acknowledgement (the InfluxDB sink stores the
   history from its topic, committing after its flush);
4. only then commit the findings' offsets and hand the new deliveries to the workers.

A crash before 3 loses nothing (the findings are consumed again; applying an old finding is a no-op); a crash
after 3 finds the deliveries in the outbox at restart. The one duplicate possible: a receiver accepted a
delivery and the process died before the delivery's tombstone reached Kafka; it is sent again with the same
``X-Hermeneut-Delivery`` id.

Records are sized to the cluster's limits (read at start-up): dead letters are bounded
(pipeline.deadletter.bounded); a state record too large for its topic is refused before it is queued, counted
(``too_large``) and logged, so it can neither crash the loop nor hold it; state Kafka does not acknowledge makes
the manager *stalled* in its stats (pipeline.stats.Stall) while it retries, committing nothing.

Run one manager per deployment (like a single Alertmanager): groups span every partition of the findings.

Counters go to the ``--stats-file`` and to ``/metrics`` (:data:`MANAGER_FIELDS`), with the alerts by status,
detector and severity, delivery times per receiver kind and the findings consumer's lag.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition
from prometheus_client import CollectorRegistry, Histogram

from alerting.delivery import Attempt, DeliveryPool
from alerting.engine import AlertEngine
from alerting.grouping import DAMPED, Notification, Suppressed
from alerting.health import HealthBook, health_key
from alerting.inhibit import INHIBITED, MAINTENANCE, SILENCED, parse_inhibit_rules
from alerting.lifecycle import LifecycleConfig
from alerting.model import (
    Ack,
    AlertState,
    ConfigRecord,
    Delivery,
    GroupState,
    Receiver,
    Silence,
    StateRecord,
    Subscription,
    decode_config,
    decode_state,
    new_id,
)
from alerting.receivers import Sender
from alerting.shadow import Shadow
from pipeline.codec import decode_record, encode_record
from pipeline.config import Settings
from pipeline.deadletter import DeadLetter, bounded, dead_letter
from pipeline.errors import DecodeError, RecordTooLarge, ServiceError
from pipeline.escalation import Episode
from pipeline.events import Finding
from pipeline.metrics import (
    DURATION_BUCKETS,
    ConsumerLag,
    Field,
    StatsView,
    counter,
    dead_letters,
    gauge,
    librdkafka_lag,
)
from pipeline.mirror import TopicMirror
from pipeline.notifications import NotificationRecord, UniqueTimes
from pipeline.publisher import Publisher, Record
from pipeline.sizing import read_limits
from pipeline.stats import Stall, write_stats

log = logging.getLogger(__name__)

STAGE = "alerting"
_OUTCOME = {
    SILENCED: "suppressed-silence",
    INHIBITED: "suppressed-inhibited",
    MAINTENANCE: "suppressed-maintenance",
    DAMPED: "damped",
}


@dataclass
class ManagerStats:
    assigned: bool = False
    ready: bool = False
    findings: int = 0
    dead_lettered: int = 0
    alerts_firing: int = 0
    alerts_known: int = 0
    notifications: int = 0
    deliveries_queued: int = 0
    delivered: int = 0
    failed: int = 0
    retries: int = 0
    suppressed: int = 0
    state_records: int = 0
    commits: int = 0
    outbox: int = 0
    recovered_deliveries: int = 0
    #: notification records (delivery attempts, held notifications) published for the sink to store
    history_records: int = 0
    #: state records over their topic's limit: refused before they were queued, logged
    too_large: int = 0
    #: health changes published on the health topic (pipeline.health)
    health_records: int = 0
    #: store-only kinds (alerts.shadow): their findings, the alerts they would have raised, and those firing now
    shadow_findings: int = 0
    shadow_alerts: int = 0
    shadow_firing: int = 0
    #: reasons escalation rules in shadow mode (health.shadow) would give now, published nowhere
    shadow_escalations: int = 0


#: the manager's stats as ``/metrics`` shows them (the stats file has the same numbers under the keys)
MANAGER_FIELDS: tuple[Field, ...] = (
    gauge("ready", "hermeneut_alerts_ready", "1 once state and config are rebuilt from Kafka."),
    gauge("assigned", "hermeneut_alerts_assigned", "1 once the findings consumer has joined its group."),
    counter("findings", "hermeneut_alerts_findings_total", "Findings consumed."),
    gauge("alerts_firing", "hermeneut_alerts_firing", "Alerts firing now."),
    gauge("alerts_known", "hermeneut_alerts_known", "Alerts known (pending, firing, resolved and not forgotten)."),
    gauge("alerts", "hermeneut_alerts", "Alerts by status, detector and severity.", "status", "detector", "severity"),
    counter("notifications", "hermeneut_alerts_notifications_total", "Notifications (one per group and change)."),
    counter("deliveries_queued", "hermeneut_alerts_deliveries_total", "Deliveries queued (one per receiver)."),
    counter("delivered", "hermeneut_alerts_delivered_total", "Deliveries a receiver accepted."),
    counter("failed", "hermeneut_alerts_delivery_failures_total", "Deliveries given up after retrying."),
    counter("retries", "hermeneut_alerts_delivery_retries_total", "Delivery attempts that will be retried."),
    counter("suppressed", "hermeneut_alerts_suppressed_total", "Notifications held: silenced, inhibited, damped."),
    counter("state_records", "hermeneut_alerts_state_records_total", "State records written to Kafka."),
    counter("health_records", "hermeneut_alerts_health_records_total", "Health changes published on the health topic."),
    counter("commits", "hermeneut_alerts_commits_total", "Offset commits of consumed findings."),
    counter(
        "shadow_by_kind", "hermeneut_alerts_shadow_alerts_total", "Alerts shadow kinds would have raised.", "detector"
    ),
    gauge("shadow_firing", "hermeneut_alerts_shadow_firing", "Alerts of the shadow kinds that would be firing now."),
    gauge("shadow_escalations", "hermeneut_alerts_shadow_escalations", "Reasons shadow escalation rules would give."),
    gauge("outbox", "hermeneut_alerts_outbox", "Deliveries not finished yet."),
    counter("recovered_deliveries", "hermeneut_alerts_recovered_deliveries_total", "Deliveries resumed at start."),
    counter(
        "history_records",
        "hermeneut_alerts_history_records_total",
        "Notification records (attempts, held notifications) published for the sink to store.",
    ),
)


class AlertManager:
    """One alerting process. ``senders`` maps receiver kinds to senders (the CLI builds the real ones)."""

    def __init__(
        self,
        settings: Settings,
        senders: dict[str, Sender],
        stats_file: Path | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        registry: CollectorRegistry | None = None,
        past: Iterable[Episode] = (),
    ) -> None:
        """``past``: the finding episodes of the lookback as stored (escalation reads them; the manager keeps
        them up to date from the findings it consumes)."""
        self.settings = settings
        self.cfg = settings.alerts
        self.engine = AlertEngine(self.cfg, parse_inhibit_rules(self.cfg.inhibit_rules))
        self.clock_ns = clock_ns
        #: history records to publish, encoded (each at a millisecond of its own in its series: _queue_history)
        self._history: list[bytes] = []
        self._unique_times = UniqueTimes()
        self.stats = ManagerStats()
        self.stats_file = stats_file
        self._kafka = settings.kafka.client_config()
        self._pub = Publisher(self._kafka, linger_ms=2)
        self.pool = DeliveryPool(self.cfg, senders, clock_ns)
        self.outbox: dict[str, Delivery] = {}
        self._dirty: dict[bytes, bytes | None] = {}
        self._letters: list[DeadLetter] = []
        self.stall = Stall("alert manager")
        self._to_submit: list[Delivery] = []
        self._uncommitted: list[Message] = []
        self._config: TopicMirror[ConfigRecord] | None = None
        self._config_version = -1
        self._consumer: Consumer | None = None
        self._by_state: dict[tuple[str, str, str], int] = {}
        #: the health published per GPU and node (alerting.health)
        self.health = HealthBook(settings.health, past)
        self.shadow = Shadow(self.cfg.shadow_kinds, LifecycleConfig.of(self.cfg))
        self._dead_letters = dead_letters(registry)
        self._delivery_seconds = Histogram(
            "hermeneut_alerts_delivery_seconds",
            "Seconds per delivery attempt.",
            ["receiver"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.lag = ConsumerLag("alert manager")
        if registry is not None:
            registry.register(StatsView(self.values, MANAGER_FIELDS))
            registry.register(self.lag)

    # --- start-up ------------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 120.0) -> None:
        """Rebuild state and config from Kafka, then join the findings consumer group."""
        t = self.settings.topics
        limits = read_limits(self._kafka, (t.alert_state, t.notification_history, t.dead_letter), timeout_s)
        self._pub = Publisher(self._kafka, linger_ms=2, limits=limits)
        state: TopicMirror[StateRecord] = TopicMirror(self._kafka, self.settings.topics.alert_state, decode_state)
        state.start()
        try:
            if not state.wait_ready(timeout_s):
                raise ServiceError(f"could not read {self.settings.topics.alert_state} within {timeout_s:.0f}s")
            self._rebuild(list(state.snapshot().values()))
        finally:
            state.stop()
        self._config = TopicMirror(self._kafka, self.settings.topics.alert_config, decode_config).start()
        if not self._config.wait_ready(timeout_s):
            raise ServiceError(f"could not read {self.settings.topics.alert_config} within {timeout_s:.0f}s")
        self._refresh_config()
        self._consumer = Consumer(
            {
                **self._kafka,
                "group.id": f"{self.settings.group_prefix}-alerting",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": int(self.settings.kafka.session_timeout_s * 1000),
                "fetch.wait.max.ms": 50,
            }
        )
        self._consumer.subscribe([self.settings.topics.alerts], on_assign=self._on_assign)
        for d in sorted(self.outbox.values(), key=lambda d: d.created_ns):
            self.stats.recovered_deliveries += 1
            self._submit(d)
        self.stats.ready = True
        e = self.engine
        log.info(
            "alert manager ready: %d alerts, %d groups, %d deliveries to resume, %d subscriptions, %d silences",
            len(e.alerts),
            sum(len(g) for g in e.groups.values()),
            len(self.outbox),
            len(e.subscriptions),
            len(e.silences),
        )

    def _rebuild(self, records: list[StateRecord]) -> None:
        alerts = [r for r in records if isinstance(r, AlertState)]
        self.engine.restore(alerts, [r for r in records if isinstance(r, GroupState)])
        self.health.touch(health_key(a.labels) for a in alerts)  # published again: a restart loses nothing
        self.outbox = {r.id: r for r in records if isinstance(r, Delivery)}

    def _on_assign(self, _consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        self.stats.assigned = True
        self._write_stats()

    def _refresh_config(self) -> None:
        assert self._config is not None
        if self._config.version == self._config_version:
            return
        self._config_version = self._config.version
        records = list(self._config.snapshot().values())
        self.engine.configure(
            [r for r in records if isinstance(r, Subscription)],
            [r for r in records if isinstance(r, Silence)],
            [r for r in records if isinstance(r, Ack)],
        )

    # --- the loop ------------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set; then let deliveries under way finish and persist what they did."""
        assert self._consumer is not None, "start() first"
        last_eval, last_stats = 0.0, 0.0
        try:
            while not stop.is_set():
                for msg in self._consumer.consume(500, timeout=min(self.cfg.tick_s, 0.2)):
                    self._take(msg)
                now = time.monotonic()
                if self._uncommitted or now - last_eval >= self.cfg.tick_s:
                    self.step(self.clock_ns())
                    last_eval = now
                else:
                    self._collect()
                self._persist_and_commit()
                if now - last_stats >= 1.0:
                    self._write_stats()
                    self.lag.update(librdkafka_lag(self._consumer))
                    last_stats = now
            self.pool.close(grace_s=min(5.0, self.cfg.http_timeout_s))
            self._collect()
            self._persist_and_commit()
        finally:
            self._consumer.close()
            if self._config is not None:
                self._config.stop()
            if self._pub.close(30):
                log.error("some alert state records were not acknowledged at shutdown")
            self._write_stats()

    def _take(self, msg: Message) -> None:
        err = msg.error()
        if err is not None:
            if err.code() != KafkaError._PARTITION_EOF:
                log.warning("consume error: %s", err)
            return
        self._uncommitted.append(msg)
        try:
            finding = decode_record(Finding, msg.value() or b"")
        except DecodeError as exc:
            source = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
            self._letters.append(dead_letter(msg.key(), msg.value() or b"", exc.reason, exc.detail, STAGE, source))
            self.stats.dead_lettered += 1
            self._dead_letters.labels(exc.reason).inc()
            return
        self.stats.findings += 1
        self.apply(finding)

    def apply(self, finding: Finding) -> None:
        if self.shadow.holds(finding):  # store-only: counted, never alerted, notified or in a GPU's health
            self.shadow.apply(finding, self.clock_ns())
            return
        new = self.engine.apply(finding, self.clock_ns())
        if new is not None:
            self._dirty[new.key] = encode_record(new)
            self.health.touch([health_key(new.labels)])
        self.health.seen(finding)

    def step(self, now_ns: int) -> None:
        """Timers and every subscription's groups; queues state records, notifications and history records."""
        if self._config is not None:
            self._refresh_config()
        result = self.engine.step(now_ns)
        self.shadow.step(now_ns)
        for a in result.alerts:
            self._dirty[a.key] = encode_record(a)
        for a in result.forgotten:
            self._dirty[a.key] = None
        self.health.touch(health_key(a.labels) for a in (*result.alerts, *result.forgotten))
        self.health.assess(self.engine.alerts.values(), now_ns)
        self.stats.shadow_escalations = self.health.shadow_escalations
        for g in result.groups:
            self._dirty[g.key] = encode_record(g)
        for g in result.dropped_groups:
            self._dirty[g.key] = None
        for sub, note in result.notifications:
            self._notify(sub, note, now_ns)
        for sub, held in result.suppressed:
            self._record_suppressed(sub, [held], now_ns)
        self._collect()
        self.stats.alerts_known = len(self.engine.alerts)
        self.stats.alerts_firing = self.engine.firing()
        counts = self.shadow.counts
        self.stats.shadow_findings = sum(counts.findings.values())
        self.stats.shadow_alerts = sum(counts.alerts.values())
        self.stats.shadow_firing = self.shadow.firing()
        self._by_state = dict(
            Counter(
                (a.status.value, a.labels.get("detector", ""), a.labels.get("severity", ""))
                for a in self.engine.alerts.values()
            )
        )

    def _notify(self, sub: Subscription, note: Notification, now_ns: int) -> None:
        self.stats.notifications += 1
        nid = new_id()
        for i, _ in enumerate(sub.receivers):
            d = Delivery(
                f"{nid}.{i}",
                nid,
                sub.id,
                i,
                note.group_key,
                note.group_labels,
                note.status,
                note.reason,
                note.alerts,
                now_ns,
            )
            self.outbox[d.id] = d
            self._dirty[d.key] = encode_record(d)
            self._to_submit.append(d)

    def _record_suppressed(self, sub: Subscription, held: list[Suppressed], now_ns: int) -> None:
        if not held:
            return
        self.stats.suppressed += len(held)
        self._queue_history(
            [
                NotificationRecord(
                    now_ns,
                    h.alert.labels.get("cluster", ""),
                    "-",
                    sub.id,
                    h.alert.labels.get("detector", ""),
                    h.alert.status.value,
                    _OUTCOME[h.why],
                    h.alert.dedup_key,
                    h.alert.fingerprint,
                    h.group_key,
                    h.alert.summary,
                    "",
                    sub.owner,
                    h.why,
                )
                for h in held
            ]
        )

    def _submit(self, d: Delivery) -> None:
        sub = self.engine.subscriptions.get(d.subscription_id)
        receiver: Receiver | None = None
        if sub is not None and d.receiver_index < len(sub.receivers):
            receiver = sub.receivers[d.receiver_index]
        if receiver is None:
            log.warning("delivery %s dropped: subscription %s no longer exists", d.id, d.subscription_id)
            self._finish(d)
            return
        self.stats.deliveries_queued += 1
        self.pool.submit(d, receiver)

    def _finish(self, d: Delivery) -> None:
        if self.outbox.pop(d.id, None) is not None:
            self._dirty[d.key] = None

    def _collect(self) -> None:
        """Attempts reported by the workers: history records, and finished deliveries leave the outbox."""
        records: list[NotificationRecord] = []
        while True:
            try:
                a: Attempt = self.pool.results.get_nowait()
            except queue.Empty:
                break
            self._delivery_seconds.labels(a.receiver.kind).observe(a.latency_ms / 1000)
            if a.result.ok:
                self.stats.delivered += 1
            elif a.final:
                self.stats.failed += 1
                log.warning("delivery %s to %s failed: %s", a.delivery.id, a.receiver.target(), a.result.error)
            else:
                self.stats.retries += 1
                if a.attempt == 1:
                    log.warning(
                        "delivery %s to %s will be retried: %s", a.delivery.id, a.receiver.target(), a.result.error
                    )
            if a.final:
                self._finish(a.delivery)
            records.extend(self._attempt_records(a))
        self._queue_history(records)

    def _queue_history(self, records: list[NotificationRecord]) -> None:
        """History records for the next publish, each moved to a millisecond of its own in its series and encoded
        once; one over its topic's limit is refused here, counted once."""
        topic = self.settings.topics.notification_history
        for r in self._unique_times(records):
            value = encode_record(r)
            if self._fits(topic, None, value, "notification record"):
                self._history.append(value)

    def _fits(self, topic: str, key: bytes | None, value: bytes, what: str) -> bool:
        """Whether a record is within its topic's limit (read at start-up); one that is not is counted
        (``too_large``) and logged, so it can neither crash the loop nor hold it."""
        if self._pub.limits is None or self._pub.limits.fits(topic, key, value):
            return True
        self.stats.too_large += 1
        log.error("%s of %d bytes is over the %s limit; not kept", what, len(value), topic)
        return False

    def _attempt_records(self, a: Attempt) -> list[NotificationRecord]:
        sub = self.engine.subscriptions.get(a.delivery.subscription_id)
        return [
            NotificationRecord(
                a.at_ns,
                v.labels.get("cluster", ""),
                a.receiver.kind,
                a.delivery.subscription_id,
                v.labels.get("detector", ""),
                v.status.value,
                a.outcome,
                v.dedup_key,
                v.fingerprint,
                a.delivery.group_key,
                v.annotations.get("summary", ""),
                a.receiver.target(),
                sub.owner if sub else "",
                a.delivery.reason,
                a.attempt,
                a.result.http_status,
                a.result.error,
                round(a.latency_ms, 3),
                a.delivery.id,
            )
            for v in a.delivery.alerts
        ]

    def _persist_and_commit(self) -> None:
        """Publish changed state (and dead letters), wait for Kafka, then commit findings and start deliveries."""
        if not (
            self._dirty or self.health.dirty or self._history or self._letters or self._uncommitted or self._to_submit
        ):
            return
        topics = self.settings.topics
        records: list[Record] = []
        for key, value in list(self._dirty.items()):
            if value is not None and not self._fits(topics.alert_state, key, value, f"alert state record {key!r}"):
                del self._dirty[key]
                continue
            records.append((topics.alert_state, key, value, None))
        records += [(topics.health, key, value, None) for key, value in self.health.dirty.items()]
        records += [(topics.notification_history, None, value, None) for value in self._history]
        limit = self._pub.limits.limit(topics.dead_letter) if self._pub.limits else 1_048_588
        records += [(topics.dead_letter, x.key, x.value, x.headers) for x in bounded(self._letters, limit)]
        try:
            failed = self._pub.deliver(records, timeout_s=30.0)
        except RecordTooLarge as exc:  # the limits changed under us: visible, retried, never a crash
            failed, error = [0], str(exc)
        else:
            error = f"{len(failed)} records not acknowledged"
        if failed:
            self.stall.failed(topics.alert_state, sum(len(records[i][2] or b"") for i in failed[:1]), "findings", error)
            log.error("alert state not acknowledged by Kafka; retrying before anything is committed or sent")
            return  # everything stays dirty and is published again next round (idempotent: latest value wins)
        self.stall.ok()
        self.stats.state_records += len(self._dirty)
        self.stats.health_records += len(self.health.dirty)
        self.stats.history_records += len(self._history)
        self._history.clear()
        self._dirty.clear()
        self.health.dirty.clear()
        self._letters.clear()
        if self._uncommitted:
            self._commit(self._uncommitted)
            self._uncommitted = []
        for d in self._to_submit:
            self._submit(d)
        self._to_submit.clear()
        self.stats.outbox = len(self.outbox)

    def _commit(self, messages: list[Message]) -> None:
        assert self._consumer is not None
        offsets: dict[tuple[str, int], int] = {}
        for m in messages:
            key = (str(m.topic()), int(m.partition() or 0))
            offsets[key] = max(offsets.get(key, -1), int(m.offset() or 0))
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o + 1) for (t, p), o in offsets.items()], asynchronous=False
            )
            self.stats.commits += 1
        except Exception as exc:  # revoked meanwhile: the findings are re-read and re-applying them is a no-op
            log.warning("offset commit failed (%s); those findings will be re-read", exc)

    def values(self) -> dict[str, Any]:
        """The stats as ``/metrics`` reads them: the stats file's, and the alerts by status, detector, severity."""
        return asdict(self.stats) | {"alerts": self._by_state, "shadow_by_kind": self.shadow.counts.alerts}

    def _write_stats(self) -> None:
        shadow = {"shadow_by_kind": self.shadow.counts.alerts, "shadow_findings_by_kind": self.shadow.counts.findings}
        write_stats(self.stats_file, asdict(self.stats) | self.stall.values() | shadow)
