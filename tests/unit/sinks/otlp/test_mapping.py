"""The OTLP mapping on a real capture: the lent H100's 75 NVML rounds (tests/testdata/nvml-h100-lent) through the
codec and the processor's normalization, as the interpreted topic carries them, then to OTLP/JSON. Every value the
batch holds is found again under its OpenTelemetry name, in the convention's unit; nothing else is made up."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from pipeline.codec import decode_interpreted, encode_interpreted, encode_samples
from pipeline.config import ValidationSettings
from pipeline.events import (
    METRIC_INDEX,
    METRIC_NAMES,
    Finding,
    GpuProcess,
    GpuSample,
    InterpretedBatch,
    SampleBatch,
    Severity,
    Workload,
)
from pipeline.health.states import Health
from processors.normalize import RawMessage, process_raw
from sinks.otlp.mapping import (
    HW_STATE,
    SEMCONV,
    BadHealth,
    batch_metrics,
    finding_log,
    health_metrics,
    metric_name,
    unit_of,
    vendor_of,
)
from tests import TESTDATA

READINGS = TESTDATA / "nvml-h100-lent" / "readings.jsonl"
UUID = "GPU-00000000-0000-0000-0000-000000000000"


def h100_batches() -> list[InterpretedBatch]:
    """Each NVML round as the processor forwards it (encoded raw, normalized, encoded and decoded again)."""
    out = []
    for line in READINGS.read_text().splitlines():
        raw = json.loads(line)
        (s,) = raw["samples"]
        processes = tuple(GpuProcess(**p) for p in s["processes"])
        sample = GpuSample(s["cluster"], s["node"], s["gpu_uuid"], s["gpu_index"], s["gpu_model"], s["ts_ns"],
                           s["metrics"], None, processes)  # fmt: skip
        batch = SampleBatch(raw["cluster"], raw["node"], (sample,))
        message = RawMessage(batch.kafka_key, encode_samples(batch), "raw/0/0")
        ((_, interpreted),) = process_raw([message], s["ts_ns"], ValidationSettings()).forward
        out.append(decode_interpreted(encode_interpreted(interpreted)))
    return out


@pytest.fixture(scope="module")
def batches() -> list[InterpretedBatch]:
    return h100_batches()


def points_of(resource_metrics: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(metric name, metric, data point) of every point, with the point's attributes as a plain dict."""
    out = []
    for rm in resource_metrics:
        for sm in rm["scopeMetrics"]:
            for m in sm["metrics"]:
                data = m.get("gauge") or m["sum"]
                for p in data["dataPoints"]:
                    values = {a["key"]: next(iter(a["value"].values())) for a in p["attributes"]}
                    out.append((m["name"], m, p | {"attrs": values}))
    return out


def test_every_present_value_of_the_real_h100_is_one_point_under_its_name_and_unit(
    batches: list[InterpretedBatch],
) -> None:
    assert len(batches) == 75
    for batch in batches:
        exported = batch_metrics(batch)
        points = points_of(exported.resource_metrics)
        row = batch.metrics[0]
        present = [n for n in METRIC_NAMES if np.isfinite(row[METRIC_INDEX[n]])]
        # one point per present field, plus the fraction of memory used (the H100 reports both halves)
        assert len(points) == exported.points == len(present) + 1
        assert len(present) >= 30  # what the capture holds, NaN where NVML had nothing
        seen = {(name, p["attrs"].get("hw.sensor_location"), p["attrs"].get("error.type")): p for name, _, p in points}
        for field in present:
            value = float(row[METRIC_INDEX[field]])
            extra = dict(SEMCONV[field][4]) if field in SEMCONV else {}
            key = (metric_name(field), extra.get("hw.sensor_location"), extra.get("error.type"))
            point = seen[key]
            scale = SEMCONV[field][3] if field in SEMCONV else 1.0
            assert point["asDouble"] == pytest.approx(value * scale), field
            assert point["timeUnixNano"] == str(int(batch.ts_ns[0]))
        used = row[METRIC_INDEX["memory_used_bytes"]] / row[METRIC_INDEX["memory_total_bytes"]]
        assert seen[("hw.gpu.memory.utilization", None, None)]["asDouble"] == pytest.approx(used)


def test_the_conventions_names_units_kinds_and_attributes(batches: list[InterpretedBatch]) -> None:
    busy = [b for b in batches if b.metrics[0, METRIC_INDEX["utilization_gpu_percent"]] >= 99][5]  # past the ramp
    exported = batch_metrics(busy)
    (resource,) = exported.resource_metrics
    res = {a["key"]: a["value"]["stringValue"] for a in resource["resource"]["attributes"]}
    assert res == {"service.name": "hermeneut", "host.name": "h100", "hermeneut.cluster": "lent"}
    by_name = {name: (m, p) for name, m, p in points_of(exported.resource_metrics)}
    metric, point = by_name["hw.gpu.utilization"]
    assert metric["unit"] == "1" and "gauge" in metric and 0.99 <= point["asDouble"] <= 1.0
    assert point["attrs"] == {"hw.id": UUID, "hw.type": "gpu", "hw.name": "gpu0", "hw.model": "NVIDIA H100 80GB HBM3",
                              "hw.vendor": "NVIDIA", "hw.gpu.task": "general"}  # fmt: skip
    metric, point = by_name["hw.power"]
    assert metric["unit"] == "W" and 680 <= point["asDouble"] <= 705  # at its 700 W limit
    for name, unit, monotonic in (("hw.gpu.memory.usage", "By", False), ("hw.gpu.memory.limit", "By", False),
                                  ("hw.energy", "J", True), ("hw.errors", "{error}", True)):  # fmt: skip
        metric, _ = by_name[name]
        assert metric["unit"] == unit and metric["sum"]["isMonotonic"] is monotonic, name
        assert metric["sum"]["aggregationTemporality"] == 2  # cumulative: running totals from the device
    assert by_name["hw.gpu.memory.limit"][1]["asDouble"] == 85520809984
    assert by_name["hermeneut.gpu.sm_clock_mhz"][0]["unit"] == "MHz"
    json.dumps(exported.resource_metrics, allow_nan=False)  # valid JSON: no NaN ever reaches a point


def test_an_absent_value_is_no_point_and_a_job_is_named(batches: list[InterpretedBatch]) -> None:
    batch = batches[0]
    metrics = batch.metrics.copy()
    metrics[0, METRIC_INDEX["power_watts"]] = np.nan
    job = Workload("llm-pretraining", job_id="bench-1", source="slurm")
    from dataclasses import replace

    changed = replace(batch, metrics=metrics, workload=(job,), score=np.array([2.5]))
    points = points_of(batch_metrics(changed).resource_metrics)
    names = [n for n, _, _ in points]
    assert "hw.power" not in names and names.count("hermeneut.gpu.anomaly_score") == 1
    assert all(p["attrs"]["hermeneut.job.id"] == "bench-1" for _, _, p in points)
    assert all(p["attrs"]["hermeneut.application"] == "llm-pretraining" for _, _, p in points)


def test_units_and_vendors() -> None:
    assert unit_of("pcie_tx_bytes_per_second") == "By/s" and unit_of("memory_reserved_bytes") == "By"
    assert unit_of("fan_speed_percent") == "%" and unit_of("performance_state") == "1"
    assert vendor_of("NVIDIA H100 80GB HBM3") == "NVIDIA" and vendor_of("AMD Instinct MI300X") == "AMD"
    assert vendor_of("Tesla T4") == "NVIDIA" and vendor_of("mystery board") == ""


FINDING = Finding(
    "thermal-throttling", Severity.CRITICAL, True, "lent", "h100", UUID, "NVIDIA H100 80GB HBM3",
    1_795_801_260_000_000_000, 1_795_801_250_000_000_000, "GPU 0 throttles for heat at 89 C",
    action="check the cooling", evidence={"temperature_gpu_celsius": 89.0}, gpu_index=0,
)  # fmt: skip


@pytest.mark.parametrize(("severity", "number"), [(Severity.INFO, 9), (Severity.WARNING, 13), (Severity.CRITICAL, 17)])
def test_a_finding_is_one_log_record_with_its_severity(severity: Severity, number: int) -> None:
    from dataclasses import replace

    exported = finding_log(replace(FINDING, severity=severity))
    assert exported.records == 1 and exported.points == 0
    ((record,),) = [sl["logRecords"] for rl in exported.resource_logs for sl in rl["scopeLogs"]]
    assert record["severityNumber"] == number and record["severityText"] == severity.value.upper()
    assert record["body"] == {"stringValue": FINDING.summary}
    assert record["timeUnixNano"] == str(FINDING.ts_ns)
    attrs = {a["key"]: next(iter(a["value"].values())) for a in record["attributes"]}
    assert attrs["hw.id"] == UUID and attrs["hermeneut.detector"] == "thermal-throttling"
    assert attrs["hermeneut.finding.state"] == "firing" and attrs["hermeneut.evidence.temperature_gpu_celsius"] == 89.0
    assert attrs["hermeneut.finding.since_unix_nano"] == str(FINDING.since_ns)  # an int64: a string in OTLP/JSON
    resolved = finding_log(replace(FINDING, active=False)).resource_logs[0]["scopeLogs"][0]["logRecords"][0]
    assert {"key": "hermeneut.finding.state", "value": {"stringValue": "resolved"}} in resolved["attributes"]


def health(state: str, gpu: str | None = UUID) -> dict[str, Any]:
    reasons = [{"detector": "thermal-throttling", "severity": "critical", "state": state, "remedy": "drain",
                "since_ns": 1, "summary": "hot"}]  # fmt: skip
    return {"cluster": "lent", "node": "h100", "gpu": gpu, "state": state, "remedy": "drain", "last_seen_ns": None,
            "reasons": reasons, "ts_ns": 1_795_801_260_000_000_000}  # fmt: skip


@pytest.mark.parametrize("state", [h.value for h in Health])
def test_a_health_state_is_hw_status_one_for_its_state_zero_for_the_others(state: str) -> None:
    exported = health_metrics(health(state))
    points = points_of(exported.resource_metrics)
    assert {n for n, _, _ in points} == {"hw.status"} and exported.points == len(HW_STATE) == len(points)
    ones = [p["attrs"]["hw.state"] for _, _, p in points if p["asDouble"] == 1.0]
    assert ones == [HW_STATE[state]]
    assert all(p["attrs"]["hw.id"] == UUID and p["attrs"]["hermeneut.remedy"] == "drain" for _, _, p in points)
    metric = points[0][1]
    assert metric["unit"] == "1" and metric["sum"]["isMonotonic"] is False  # an UpDownCounter, as the convention


def test_a_node_state_and_bad_records() -> None:
    points = points_of(health_metrics(health("degraded", gpu=None)).resource_metrics)
    assert {p["attrs"]["hw.id"] for _, _, p in points} == {"h100"}
    assert {p["attrs"]["hw.type"] for _, _, p in points} == {"host"}
    with pytest.raises(BadHealth, match="unknown health state"):
        health_metrics(health("sick"))
    with pytest.raises(BadHealth, match="missing or bad field"):
        health_metrics({"cluster": "c", "node": "n", "state": "healthy"})
