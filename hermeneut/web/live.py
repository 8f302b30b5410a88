"""The fleet as it is now, for the dashboard: the latest interpreted reading of every GPU and its open findings.

A background thread reads the interpreted and alerts topics (every partition, no consumer group) and keeps one
compact :class:`GpuState` per GPU plus each node's NIC traffic. It starts 90 s back (findings repeat every 60 s
while active) or at the last messages of each partition, whichever is earlier, so a freshly started server shows
the fleet at once, and the last state it had when the data stopped (the page says how old it is). Readers take
consistent snapshots; ``changes_since(version)`` gives what changed for the server-sent-event stream, so a
browser never re-downloads the whole fleet.

Nothing here decodes anything but the project's own schema; a record that does not decode is counted and skipped
(the sink dead-letters the same record, so nothing is lost).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from confluent_kafka import Consumer, KafkaError, TopicPartition

from pipeline.codec import decode_interpreted, decode_record
from pipeline.config import Settings
from pipeline.errors import DecodeError, ServiceError
from pipeline.events import METRIC_INDEX, RELATIVE_FIELDS, Finding, InterpretedBatch
from pipeline.topics import retried, wait_for_topics

log = logging.getLogger(__name__)

#: The readings a dashboard tile and the topology view need (a small subset keeps the stream light)
LIVE_FIELDS: tuple[str, ...] = (
    "utilization_gpu_percent",
    "memory_used_bytes",
    "memory_total_bytes",
    "power_watts",
    "power_limit_watts",
    "temperature_gpu_celsius",
    "sm_clock_mhz",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "nvlink_links_active",
    "nvlink_links_max",
    "pcie_link_gen",
    "pcie_link_width",
    "throttle_reasons_mask",
)
_LIVE_COLS = np.array([METRIC_INDEX[f] for f in LIVE_FIELDS])
_LOOKBACK_MS = 90_000
#: at least this many of the last messages per partition (each holds one processing batch of many GPUs)
_LAST_MESSAGES = 200
_LAST_FINDINGS = 2000
#: GPUs whose findings were read before their first reading (the two topics are read in no set order), kept at most
_EARLY_GPUS = 100_000


@dataclass
class GpuState:
    """One GPU as the dashboard shows it."""

    cluster: str
    node: str
    uuid: str
    index: int
    model: str
    ts_ms: int
    verdict: str
    score: float | None
    explanation: str
    application: str | None
    job_id: str | None
    user: str | None
    job_gpus: int | None
    inferred: bool
    phase: str | None
    values: dict[str, float]
    relative: dict[str, float]
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "node": self.node,
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "ts_ms": self.ts_ms,
            "verdict": self.verdict,
            "score": self.score,
            "explanation": self.explanation,
            "application": self.application,
            "job_id": self.job_id,
            "user": self.user,
            "job_gpus": self.job_gpus,
            "inferred": self.inferred,
            "phase": self.phase,
            "values": self.values,
            "relative": self.relative,
            "findings": self.findings,
        }


def states_from_batch(batch: InterpretedBatch) -> list[GpuState]:
    """The latest state of each GPU in a batch (the last row per GPU wins: rows are in time order)."""
    live = batch.metrics[:, _LIVE_COLS].tolist() if len(batch) else []
    rel = batch.relative.tolist() if len(batch) else []
    scores = batch.score.tolist() if len(batch) else []
    ts_ms = (batch.ts_ns // 1_000_000).tolist() if len(batch) else []
    out: dict[str, GpuState] = {}
    for i, gpu in enumerate(batch.gpu_uuid):
        wl = batch.workload[i]
        out[gpu] = GpuState(
            batch.cluster[i],
            batch.node[i],
            gpu,
            batch.gpu_index[i],
            batch.gpu_model[i],
            int(ts_ms[i]),
            batch.verdict[i].value,
            None if scores[i] != scores[i] else scores[i],
            batch.explanation[i],
            wl.application if wl else None,
            wl.job_id if wl else None,
            wl.user if wl else None,
            wl.job_gpus if wl else None,
            bool(wl and wl.source == "inferred"),
            batch.phase[i],
            {k: v for k, v in zip(LIVE_FIELDS, live[i], strict=True) if v == v},  # noqa: PLR0124
            {k: v for k, v in zip(RELATIVE_FIELDS, rel[i], strict=True) if v == v},  # noqa: PLR0124
        )
    return list(out.values())


def _shown(f: Finding) -> dict[str, Any]:
    """What the dashboard shows of an open finding."""
    return {
        "severity": f.severity.value,
        "summary": f.summary,
        "action": f.action,
        "since_ms": f.since_ns // 1_000_000,
        "evidence": f.evidence,
    }


class LiveFleet:
    """Latest state per GPU, fed by a consumer thread (see module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._gpus: dict[str, GpuState] = {}
        self._nics: dict[tuple[str, str, str], dict[str, float]] = {}
        # open findings of GPUs not read yet: the alerts topic may be read ahead of the interpreted one
        self._early: dict[str, dict[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.version = 0
        self.invalid = 0
        self.ready = threading.Event()

    def start(self) -> LiveFleet:
        conf = self.settings.kafka.client_config() | {
            "group.id": f"hermeneut-web-{uuid.uuid4().hex[:12]}",  # required; never committed
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
        consumer = Consumer(conf)
        since_ms = int(time.time() * 1000) - _LOOKBACK_MS
        topics = [self.settings.topics.interpreted, self.settings.topics.alerts]
        # a topic created a moment ago may not be in this broker's metadata yet: wait (bounded) for it
        found, pending = wait_for_topics(consumer, topics, 30.0)
        if pending:
            consumer.close()
            raise ServiceError(f"topic {', '.join(pending)} not readable within 30s: run `hermeneut topics` first")
        wanted = [TopicPartition(t, p, since_ms) for t in topics for p in found[t].partitions]
        starts = []
        for tp in retried(lambda: consumer.offsets_for_times(wanted, timeout=30), 30.0):
            part = TopicPartition(tp.topic, tp.partition)
            low, high = retried(partial(consumer.get_watermark_offsets, part, timeout=30), 30.0)
            by_time = tp.offset if tp.offset >= 0 else high
            keep = _LAST_MESSAGES if tp.topic == self.settings.topics.interpreted else _LAST_FINDINGS
            starts.append(TopicPartition(tp.topic, tp.partition, max(low, min(by_time, high - keep))))
        consumer.assign(starts)
        self._thread = threading.Thread(target=self._run, args=(consumer,), name="live-fleet", daemon=True)
        self._thread.start()
        return self

    def _run(self, consumer: Consumer) -> None:
        try:
            while not self._stop.is_set():
                messages = consumer.consume(1000, timeout=0.2)
                if not messages:
                    self.ready.set()
                for msg in messages:
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            log.warning("live fleet: %s", err)
                        continue
                    try:
                        if msg.topic() == self.settings.topics.alerts:
                            self.apply_finding(decode_record(Finding, msg.value() or b""))
                        else:
                            self.apply_batch(decode_interpreted(msg.value() or b""))
                    except DecodeError:
                        self.invalid += 1
        finally:
            consumer.close()

    def apply_batch(self, batch: InterpretedBatch) -> None:
        states = states_from_batch(batch)
        with self._lock:
            for state in states:
                old = self._gpus.get(state.uuid)
                if old is not None and old.ts_ms > state.ts_ms:
                    continue
                self.version += 1
                state.findings = old.findings if old else self._early.pop(state.uuid, {})
                state.version = self.version
                self._gpus[state.uuid] = state
            for n in batch.nics:
                self._nics[(n.cluster, n.node, n.device)] = dict(n.metrics)

    def apply_finding(self, f: Finding) -> None:
        if f.gpu_uuid is None:
            return
        with self._lock:
            state = self._gpus.get(f.gpu_uuid)
            if state is None:
                self._remember_early(f)
                return
            if f.active:
                state.findings[f.detector] = _shown(f)
            elif f.detector in state.findings:
                del state.findings[f.detector]
            else:
                return
            self.version += 1
            state.version = self.version

    def _remember_early(self, f: Finding) -> None:
        """Hold a finding of a GPU without a reading yet, given to its state when the first one comes."""
        assert f.gpu_uuid is not None
        held = self._early.get(f.gpu_uuid)
        if f.active:
            if held is None:
                if len(self._early) >= _EARLY_GPUS:
                    del self._early[next(iter(self._early))]  # the GPU held longest without a reading
                held = self._early[f.gpu_uuid] = {}
            held[f.detector] = _shown(f)
        elif held is not None:
            held.pop(f.detector, None)

    def snapshot(self) -> list[GpuState]:
        with self._lock:
            return list(self._gpus.values())

    def changes_since(self, version: int) -> tuple[int, list[GpuState]]:
        with self._lock:
            return self.version, [s for s in self._gpus.values() if s.version > version]

    def nic_traffic(self, cluster: str, node: str) -> dict[str, float]:
        """NIC name -> rx + tx bytes/s on one node."""
        with self._lock:
            return {
                dev: m.get("rx_bytes_per_second", 0.0) + m.get("tx_bytes_per_second", 0.0)
                for (c, n, dev), m in self._nics.items()
                if (c, n) == (cluster, node)
            }

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
