"""Chaos scenes with counts: a simulated fleet with injected faults published at a steady pace through the
producers' own :class:`~pipeline.publisher.Publisher`, the real stages as processes (processors, the sink, the
alert manager), a webhook receiver subscribed to every alert, and the accounting of what came out.

:class:`Counts` is what each scenario asserts and what docs/guarantees.md ("Delivery guarantees") reports: distinct
``gpu`` points against the samples produced (lost) and stored rows against distinct points (duplicated: the same
sample under two series); findings on the alerts topic against ``finding`` points stored; alerts fired against
firing notifications, with a redelivery (the same ``X-Hermeneut-Delivery`` id again, the documented crash window)
told from a duplicate (a second notification with a new id); and, where asked, each GPU's 1-minute rollups
against its samples of that minute.

``CHAOS_SCALE`` (an environment variable, default 1) stretches every scene's rounds and outages: ``make chaos``
runs them at 4; each scene's counts are appended as JSON lines to the file ``CHAOS_REPORT`` names.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from alerting.admin import AlertAdmin, make_receiver, make_subscription
from alerting.model import fingerprint
from hermeneut.stages import start_stage
from pipeline.codec import decode_record, encode_samples
from pipeline.config import Settings
from pipeline.events import Finding
from pipeline.publisher import Publisher
from pipeline.services.stages import Stage, wait_for
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan, Injection
from sinks.influxdb.rollup import LATENESS_MIN, MINUTE_NS
from sinks.query.store import flux_rows

from .alerting_parts import HttpReceiver, tail, with_alerts
from .harness import stored_points

SCALE = float(os.environ.get("CHAOS_SCALE", "1"))
#: faults that the detectors report within seconds, each held for the whole scene
FAULTS = (
    Injection("nvlink-down", at_s=5, duration_s=7200),
    Injection("ecc-uncorrectable", at_s=15, duration_s=7200),
    Injection("pcie-link-degraded", at_s=25, duration_s=7200),
)


@dataclass
class Counts:
    """What a scene produced and what came out of the pipeline."""

    scenario: str
    produced: int = 0
    #: distinct (GPU, time) points stored that were produced / all rows stored / all distinct points stored
    stored: int = 0
    stored_rows: int = 0
    stored_keys: int = 0
    findings: int = 0
    findings_stored: int = 0
    alerts: int = 0
    notified: int = 0
    notices: int = 0
    redelivered: int = 0
    rollup_minutes: int = 0
    rollup_mismatches: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def lost(self) -> int:
        return self.produced - self.stored

    @property
    def duplicated(self) -> int:
        """Rows beyond one per stored point: one sample stored under two series."""
        return self.stored_rows - self.stored_keys

    @property
    def phantom(self) -> int:
        return self.stored_keys - self.stored

    @property
    def duplicate_notices(self) -> int:
        """Firing notices beyond one per alert that are not a redelivery of the same delivery."""
        return self.notices - self.redelivered - self.notified

    def line(self) -> str:
        text = (
            f"{self.scenario}: {self.produced} samples produced, {self.stored} stored ({self.lost} lost, "
            f"{self.duplicated} duplicated); {self.findings} findings, {self.findings_stored} stored; "
            f"{self.alerts} alerts, {self.notified} notified once ({self.redelivered} redelivered, "
            f"{self.duplicate_notices} duplicated)"
        )
        if self.rollup_minutes:
            text += f"; {self.rollup_minutes} GPU-minutes rolled up, {self.rollup_mismatches} wrong"
        if self.extra:
            text += " [" + ", ".join(f"{k} {v}" for k, v in self.extra.items()) + "]"
        return text

    def report(self) -> None:
        print(self.line())
        target = os.environ.get("CHAOS_REPORT")
        if target:
            with Path(target).open("a") as out:
                out.write(json.dumps(asdict(self) | {"line": self.line(), "scale": SCALE}) + "\n")


def rounds(n: int) -> int:
    """``n`` rounds at scale 1, stretched by CHAOS_SCALE."""
    return int(n * SCALE)


class Scene:
    """One chaos run on the session's servers: see the module docstring. ``start`` stages by name, ``kill`` them
    with SIGKILL, ``produce`` in the background, ``settle`` until everything is accounted for, ``close`` after."""

    def __init__(self, settings: Settings, run_dir: Path, n_rounds: int, nodes: int = 4, gpus: int = 4) -> None:
        self.settings = with_alerts(settings)
        self.run_dir = run_dir
        self.n_rounds = n_rounds
        plan = FaultPlan(rate_scale=0.0, injections=FAULTS)
        self.fleet = Fleet(nodes, gpus, cluster=self.settings.cluster, seed=11, faults=plan)
        self.start_ms = time.time_ns() // 1_000_000 - n_rounds * 1000
        self.produced: Counter[tuple[str, int]] = Counter()
        self.per_minute: Counter[tuple[str, int]] = Counter()
        self.stages: dict[str, Stage] = {}
        self.restarts = 0
        #: what a scene measured besides the counts (an outage's length), reported with them
        self.notes: dict[str, Any] = {}
        self.http = HttpReceiver().start()
        self.admin = AlertAdmin(self.settings).start()
        hook = make_receiver("webhook", self.http.url("/hook"))
        self.admin.add(make_subscription("chaos", "tester", [], [hook], group_by=["..."]))
        self._producer: threading.Thread | None = None
        self._published = 0
        self._error: BaseException | None = None

    # --- stages -------------------------------------------------------------------------------------------

    def start(self, *names: str) -> None:
        """Start ``process``/``process-2``, ``sink`` or ``alerts`` (a fresh log file per restart), all at once, and
        wait until each has joined its group."""
        started = []
        for name in names:
            self.restarts += name in self.stages
            run = self.run_dir / f"{name}-{self.restarts}"
            command = ("alerts", "run") if name == "alerts" else ("process",) if name.startswith("process") else None
            self.stages[name] = start_stage(name, self.settings, run, command=command)
            started.append(self.stages[name])
        for stage in started:  # a loaded box: a stage may take a minute to join
            joined = wait_for(partial(_joined_or_dead, stage), 180) and stage.alive()
            assert joined, f"{stage.name} did not join its group in 180 s\n{tail(stage)}"

    def kill(self, name: str) -> None:
        stage = self.stages[name]
        stage.proc.send_signal(signal.SIGKILL)
        stage.proc.wait(30)

    def health(self, name: str) -> dict[str, Any]:
        """The stage's ``/healthz`` (JSON; a 503 says stuck)."""
        url = (self.stages[name].metrics_url or "").replace("/metrics", "/healthz")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body: dict[str, Any] = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        return body

    def metric(self, name: str, metric: str) -> float | None:
        """One unlabelled sample of a stage's /metrics."""
        with urllib.request.urlopen(self.stages[name].metrics_url or "", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(metric + " "):
                    return float(line.split()[1])
        return None

    def close(self) -> None:
        for stage in self.stages.values():  # all at once, then each waited for
            if stage.alive():
                stage.proc.terminate()
        for stage in self.stages.values():
            stage.stop(60)
        self.admin.close()
        self.http.stop()

    # --- producing ----------------------------------------------------------------------------------------

    def produce(self, pace_s: float) -> None:
        """Publish every round in a background thread, one round per ``pace_s``; :meth:`wait_produced` joins."""

        def run() -> None:
            pub = Publisher(self.settings.kafka.client_config())
            try:
                for r in range(self.n_rounds):
                    ts_ns = (self.start_ms + r * 1000) * 1_000_000
                    for batch in self.fleet.tick(ts_ns):
                        pub.publish(self.settings.topics.raw, batch.kafka_key, encode_samples(batch))
                        for s in batch.samples:
                            self.produced[(s.gpu_uuid, s.ts_ns // 1_000_000)] += 1
                            self.per_minute[(s.gpu_uuid, s.ts_ns // MINUTE_NS)] += 1
                    self._published = r + 1
                    time.sleep(pace_s)
                assert pub.close(300) == 0, f"undelivered: {pub.stats}"
                assert pub.stats.delivered == pub.stats.published and pub.stats.failed == 0, pub.stats
            except BaseException as exc:
                self._error = exc
                raise

        self._producer = threading.Thread(target=run, name="chaos-producer", daemon=True)
        self._producer.start()

    def published_rounds(self) -> int:
        return self._published

    def wait_produced(self, timeout_s: float = 900) -> None:
        assert self._producer is not None
        self._producer.join(timeout_s)
        assert not self._producer.is_alive(), "the producer did not finish"
        if self._error is not None:
            raise AssertionError(f"producing failed: {self._error}") from self._error

    # --- accounting ---------------------------------------------------------------------------------------

    def findings_on_topic(self) -> list[Finding]:
        return [
            decode_record(Finding, m.value() or b"") for m in read_to_end(self.settings, self.settings.topics.alerts)
        ]

    def stored_findings(self) -> set[tuple[str, ...]]:
        rows = stored_points(self.settings, "finding")
        return {_finding_key(r["detector"], r["node"], r["gpu"], r["severity"], r.get("application"), r["_time"])
                for r in rows}  # fmt: skip

    def firing_notices(self) -> list[tuple[str, str]]:
        """(delivery id, alert fingerprint) of every firing alert in every notice received."""
        out = []
        for r in self.http.on("/hook"):
            for alert in r.json()["alerts"]:
                if alert["status"] == "firing":
                    out.append((r.headers.get("X-Hermeneut-Delivery", ""), alert["fingerprint"]))
        return out

    def counts(self, scenario: str, rollups: bool = False) -> Counts:
        rows = stored_points(self.settings)
        keys = {(r["gpu"], int(r["_time"].timestamp() * 1000 + 0.5)) for r in rows}
        findings = self.findings_on_topic()
        on_topic = {_finding_key(f.detector, f.node, f.gpu_uuid or "-", f.severity.value,
                                 f.workload.application if f.workload else None, f.ts_ns // 1_000_000)
                    for f in findings}  # fmt: skip
        stored_findings = self.stored_findings()
        fired = {fingerprint(f.dedup_key) for f in findings if f.active}
        notices = self.firing_notices()
        c = Counts(
            scenario,
            produced=len(self.produced),
            stored=len(keys & set(self.produced)),
            stored_rows=len(rows),
            stored_keys=len(keys),
            findings=len(on_topic),
            findings_stored=len(on_topic & stored_findings),
            alerts=len(fired),
            notified=len(fired & {fp for _, fp in notices}),
            notices=len(notices),
            redelivered=len(notices) - len(set(notices)),
        )
        assert max(self.produced.values()) == 1, "the producer made one sample twice"
        if rollups:
            c.rollup_minutes, c.rollup_mismatches = self._rollups()
        return c

    def _rollups(self) -> tuple[int, int]:
        """(GPU-minutes closed, of which the rollup's sample count is not the samples produced in it)."""
        last = max(m for _, m in self.per_minute)
        closed = {k: n for k, n in self.per_minute.items() if k[1] < last - LATENESS_MIN}
        [rows] = flux_rows(
            self.settings,
            f'from(bucket: "{self.settings.influxdb.bucket}_1m") |> range(start: 0) '
            f'|> filter(fn: (r) => r._measurement == "gpu" and r.cluster == "{self.settings.cluster}" '
            'and r._field == "power_watts_count") |> group()',
        )
        counted: Counter[tuple[str, int]] = Counter()
        for r in rows:
            counted[(r["gpu"], int(r["_time"].timestamp()) * 10**9 // MINUTE_NS)] += int(r["_value"])
        return len(closed), sum(counted.get(k) != n for k, n in closed.items())

    def settle(self, scenario: str, timeout_s: float = 300, rollups: bool = False) -> Counts:
        """Wait until every produced sample is stored, every finding stored and every alert notified (or time ran
        out), then a little longer (a duplicate would show now); the counts."""
        self.wait_produced()
        want = len(self.produced)
        wait_for(lambda: len({(r["gpu"], r["_time"]) for r in stored_points(self.settings)}) >= want,
                 timeout_s, interval_s=2.0)  # fmt: skip
        wait_for(lambda: _settled(self.counts(scenario)), 120, interval_s=3.0)
        time.sleep(3.0)
        counts = self.counts(scenario, rollups)
        counts.extra = {"restarts": self.restarts} | self.notes
        counts.report()
        return counts


def read_to_end(settings: Settings, topic: str, timeout_s: float = 60) -> list[Message]:
    """Every record of ``topic`` up to its end offsets as of now (a read that knows when it is done, unlike waiting
    for silence)."""
    consumer = Consumer(settings.kafka.client_config() | {"group.id": f"chaos-{uuid.uuid4().hex[:8]}",
                                                           "enable.auto.commit": False})  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0])
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s

        def behind() -> bool:
            return any(tp.offset < ends[tp.partition] for tp in consumer.position(consumer.assignment()))

        while behind():
            assert time.monotonic() < deadline, f"{topic} not read to its end offsets {ends} in {timeout_s} s"
            out.extend(m for m in consumer.consume(500, timeout=0.5) if m.error() is None)
        return out
    finally:
        consumer.close()


def _joined_or_dead(stage: Stage) -> bool:
    return bool(stage.stats().get("assigned")) or not stage.alive()


def _finding_key(detector: str, node: str, gpu: str, severity: str, app: str | None, t: Any) -> tuple[str, ...]:
    ms = t if isinstance(t, int) else int(t.timestamp() * 1000 + 0.5)
    return (detector, node, gpu, severity, app or "", str(ms))


def _settled(c: Counts) -> bool:
    return c.findings_stored >= c.findings and c.notified >= c.alerts


def assert_accounted(c: Counts) -> None:
    """Nothing lost, nothing duplicated, every finding stored, every alert notified once."""
    assert c.produced > 0 and c.findings > 0 and c.alerts > 0, c.line()
    assert (c.lost, c.duplicated, c.phantom) == (0, 0, 0), c.line()
    assert c.findings_stored == c.findings, c.line()
    assert c.notified == c.alerts and c.duplicate_notices == 0, c.line()
    assert c.rollup_mismatches == 0, c.line()
