"""OTLP out against a real OpenTelemetry Collector (pipeline.services.otelcol: built once from the Go module proxy,
OTLP/HTTP in, its file exporter out): ``hermeneut sink --sink otlp`` and ``hermeneut sink`` (InfluxDB) run as
stages on real Kafka, each in its own consumer group, over the same messages: the lent H100's 75 NVML rounds as the
processor forwards them, findings and health states. What the collector wrote is read back from its file and
compared with what InfluxDB holds (counts and values), and with the health states published; then the added latency
(a message published -> its points in the collector's file) is measured on live messages."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hermeneut.stages import start_stage
from pipeline.codec import encode_interpreted, encode_record
from pipeline.config import OtlpSettings, Settings
from pipeline.events import METRIC_INDEX, Finding, InterpretedBatch, Severity
from pipeline.publisher import Publisher
from pipeline.services import otelcol
from pipeline.services.stages import Stage, wait_for
from tests.integration.harness import stored_points
from tests.unit.sinks.otlp.test_mapping import UUID, h100_batches

pytestmark = pytest.mark.integration
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory, defaults: Settings) -> Iterator[otelcol.CollectorProcess]:
    """The collector, built into the services cache on first use (progress bar; CI pays it once per machine)."""
    proc = otelcol.start(defaults.services.cache_dir, tmp_path_factory.mktemp("otelcol"))
    yield proc
    proc.stop()


def exported(path: Path, cluster: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(data points, log records) of one cluster in the collector's file, each with its metric's name (``name``)
    and its attributes as a dict (``attrs``)."""
    points: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []

    def attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {a["key"]: next(iter(a["value"].values())) for a in items}

    for line in path.read_text().splitlines() if path.exists() else []:
        request = json.loads(line)
        for rm in request.get("resourceMetrics", []):
            if attrs(rm["resource"]["attributes"]).get("hermeneut.cluster") != cluster:
                continue
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    data = m.get("gauge") or m.get("sum")
                    points += [p | {"name": m["name"], "attrs": attrs(p["attributes"])} for p in data["dataPoints"]]
        for rl in request.get("resourceLogs", []):
            if attrs(rl["resource"]["attributes"]).get("hermeneut.cluster") != cluster:
                continue
            for sl in rl["scopeLogs"]:
                records += [r | {"attrs": attrs(r["attributes"])} for r in sl["logRecords"]]
    return points, records


def h100_now(cluster: str, now_ns: int) -> list[InterpretedBatch]:
    """The capture's rounds, one second apart and ending now (the values as captured), in the test's cluster."""
    batches = h100_batches()
    return [
        replace(b, cluster=(cluster,), ts_ns=np.array([now_ns - (len(batches) - i) * 10**9], dtype=np.int64))
        for i, b in enumerate(batches)
    ]


def findings(cluster: str, now_ns: int) -> list[Finding]:
    hot = Finding("thermal-throttling", Severity.CRITICAL, True, cluster, "h100", UUID, "NVIDIA H100 80GB HBM3",
                  now_ns - 5 * 10**9, now_ns - 20 * 10**9, "GPU 0 throttles for heat", action="check the cooling",
                  evidence={"temperature_gpu_celsius": 89.0}, gpu_index=0)  # fmt: skip
    return [
        hot,
        replace(hot, severity=Severity.WARNING, detector="pcie-link-degraded", summary="x8 of x16"),
        replace(hot, active=False, ts_ns=now_ns - 10**9, summary="GPU 0 cooled down"),
    ]


def health_records(cluster: str, now_ns: int) -> list[dict[str, Any]]:
    reason = {"detector": "thermal-throttling", "severity": "critical", "state": "unhealthy", "remedy": "drain",
              "since_ns": now_ns, "summary": "hot"}  # fmt: skip
    one = {"cluster": cluster, "node": "h100", "gpu": UUID, "state": "unhealthy", "remedy": "drain",
           "last_seen_ns": None, "reasons": [reason], "ts_ns": now_ns}  # fmt: skip
    return [one, one | {"gpu": None, "state": "degraded", "remedy": "none", "reasons": []}]


def publish(settings: Settings, records: list[tuple[str, bytes, bytes]]) -> None:
    pub = Publisher(settings.kafka.client_config())
    for topic, key, value in records:
        pub.publish(topic, key, value)
    assert pub.close(30) == 0


def running(stage: Stage) -> Stage:
    assert wait_for(lambda: bool(stage.stats().get("assigned")), 90), stage.log.read_text()[-3000:]
    return stage


def test_the_collector_receives_telemetry_findings_and_health_as_influxdb_stores_them(
    settings: Settings, collector: otelcol.CollectorProcess, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"otlp": OtlpSettings(endpoint=collector.endpoint)})
    now = time.time_ns()
    batches, found, health = (
        h100_now(settings.cluster, now),
        findings(settings.cluster, now),
        health_records(settings.cluster, now),
    )
    t = settings.topics
    publish(
        settings,
        [(t.interpreted, b"h100", encode_interpreted(b)) for b in batches]
        + [(t.alerts, f.dedup_key.encode(), encode_record(f)) for f in found]
        + [(t.health, f"{h['cluster']}/{h['node']}/{h['gpu']}".encode(), json.dumps(h).encode()) for h in health],
    )
    influx = running(start_stage("sink", settings, tmp_path / "influxdb"))
    otlp = running(start_stage("sink", settings, tmp_path / "otlp", "--sink", "otlp"))
    try:
        assert wait_for(lambda: influx.stats().get("points_written", 0) >= len(batches), 90), influx.stats()
        assert wait_for(lambda: otlp.stats().get("messages", 0) >= len(batches) + 5, 90), otlp.stats()
        assert wait_for(lambda: len(stored_points(settings)) >= len(batches), 60)
        time.sleep(1.0)  # the file exporter flushes every 100 ms: whatever else came would be there now
        points, records = exported(collector.output_file, settings.cluster)
        stats = otlp.stats()
    finally:
        for stage in (influx, otlp):
            stage.stop()
    assert stats["messages_refused"] == stats["points_rejected"] == stats["dead_lettered"] == 0, stats
    assert stats["points_exported"] == len(points) and stats["records_exported"] == len(records) == len(found)

    # telemetry: every stored sample is there once, with the same values, under the conventions' names and units
    rows = stored_points(settings)
    assert len(rows) == len(batches) == 75
    by_ms: dict[tuple[str, int], float] = {}
    for p in points:
        a = p["attrs"]
        key = p["name"] + ":" + a.get("hw.sensor_location", a.get("error.type", a.get("hw.state", "")))
        key += "" if a["hw.id"] == UUID else f":{a['hw.id']}"
        assert (key, int(p["timeUnixNano"]) // 10**6) not in by_ms, f"{key} twice"
        by_ms[(key, int(p["timeUnixNano"]) // 10**6)] = p["asDouble"]
    compared = 0
    for row in rows:
        ms = (row["_time"] - EPOCH) // timedelta(milliseconds=1)
        for field, key, scale in (("power_watts", "hw.power:", 1.0), ("utilization_gpu_percent", "hw.gpu.utilization:",
                                  100.0), ("memory_used_bytes", "hw.gpu.memory.usage:", 1.0),
                                  ("temperature_gpu_celsius", "hw.temperature:gpu", 1.0),
                                  ("sm_clock_mhz", "hermeneut.gpu.sm_clock_mhz:", 1.0)):  # fmt: skip
            if row.get(field) is not None:
                assert by_ms[(key, ms)] * scale == pytest.approx(row[field]), (field, row["_time"])
                compared += 1
    assert compared >= 5 * 75 - 5
    power = [p for p in points if p["name"] == "hw.power"]
    assert len(power) == 75 and {p["attrs"]["hw.id"] for p in power} == {UUID}
    assert {p["attrs"]["hw.vendor"] for p in power} == {"NVIDIA"}
    assert len({p["timeUnixNano"] for p in power}) == 75
    energy = sorted((int(p["timeUnixNano"]), p["asDouble"]) for p in points if p["name"] == "hw.energy")
    first = batches[0].metrics[0, METRIC_INDEX["energy_joules"]]
    assert energy[0][1] == pytest.approx(first) and len(energy) == 75

    # findings: one log record per stored finding, with its severity and summary
    stored = stored_points(settings, "finding")
    assert len(stored) == len(records) == 3
    by_summary = {r["body"]["stringValue"]: r for r in records}
    for row in stored:
        record = by_summary[row["summary"]]
        assert record["severityText"] == row["severity"].upper()
        assert record["attrs"]["hermeneut.finding.state"] == ("firing" if row["active"] else "resolved")
    assert sorted(r["severityNumber"] for r in records) == [13, 17, 17]

    # health: hw.status, 1 for each published state and 0 for the others (InfluxDB does not store health)
    status = [p for p in points if p["name"] == "hw.status"]
    assert len(status) == 2 * 5
    ones = {(p["attrs"]["hw.id"], p["attrs"]["hw.state"]) for p in status if p["asDouble"] == 1.0}
    assert ones == {(UUID, "failed"), ("h100", "degraded")}


class FileWatch:
    """When each sample time first appears in the collector's file (monotonic seconds), read as it grows."""

    def __init__(self, path: Path, cluster: str) -> None:
        self.path, self.cluster, self.offset = path, cluster.encode(), 0
        self.seen: dict[int, float] = {}

    def watch(self, stamps: dict[int, float], until: float, every: bool = False) -> None:
        """Read what was appended until ``until`` (or, with ``every``, until all ``stamps`` were seen)."""
        while time.monotonic() < until and not (every and set(stamps) <= set(self.seen)):
            if self.path.exists():
                with self.path.open("rb") as f:
                    f.seek(self.offset)
                    chunk = f.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]
                self.offset += len(complete)
                now = time.monotonic()
                for line in complete.splitlines():
                    if self.cluster in line:
                        for ts in stamps:
                            if ts not in self.seen and str(ts).encode() in line:
                                self.seen[ts] = now
            time.sleep(0.005)


def test_added_latency_kafka_to_the_collectors_file(
    settings: Settings, collector: otelcol.CollectorProcess, tmp_path: Path
) -> None:
    """Live messages, one every 200 ms: from the publisher's send to the points in the collector's file (the
    sink's 100 ms batching, the request, the collector's pipeline and its file exporter's 100 ms flush). Printed
    (``pytest -s``) and bounded loosely, for a loaded 2-core machine."""
    settings = settings.model_copy(update={"otlp": OtlpSettings(endpoint=collector.endpoint)})
    otlp = running(start_stage("sink", settings, tmp_path / "otlp", "--sink", "otlp"))
    template = h100_batches()[30]
    sent: dict[int, float] = {}
    watch = FileWatch(collector.output_file, settings.cluster)
    watch.watch({}, until=time.monotonic() + 0.5)  # skip what earlier tests left in the file
    pub = Publisher(settings.kafka.client_config())
    try:
        for _ in range(40):
            ts = time.time_ns()
            batch = replace(template, cluster=(settings.cluster,), ts_ns=np.array([ts], dtype=np.int64))
            sent[ts] = time.monotonic()
            pub.publish(settings.topics.interpreted, b"h100", encode_interpreted(batch))
            pub.poll(0)
            watch.watch(sent, until=time.monotonic() + 0.2)
        assert pub.close(30) == 0
        watch.watch(sent, until=time.monotonic() + 10.0, every=True)
        runner = otlp.stats()
    finally:
        otlp.stop()
    assert set(watch.seen) == set(sent), f"{len(watch.seen)} of {len(sent)} seen"
    latency = np.array([watch.seen[ts] - sent[ts] for ts in sent]) * 1000
    p50, p95, high = np.percentile(latency, [50, 95, 100])
    print(f"\nKafka -> collector file, {len(latency)} messages: p50 {p50:.0f} ms, p95 {p95:.0f} ms, max {high:.0f} ms;"
          f" the sink's own sample -> acknowledged p50 {runner.get('latency_p50_s')} s")  # fmt: skip
    assert p50 < 2000
