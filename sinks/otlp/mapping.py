"""Pure mapping of hermeneut's records to OTLP/JSON: interpreted batches and health states to metrics, findings to
logs. No I/O; the sink (:mod:`sinks.otlp.sink`) sends what these return.

OTLP/JSON as the specification writes it (opentelemetry-proto, ``docs/specification.md``, "JSON Protobuf
Encoding"): lowerCamelCase keys, enums as integers, 64-bit integers (timestamps) as decimal strings, attribute
values as ``{"stringValue": ...}`` / ``{"intValue": "..."}`` / ``{"doubleValue": ...}`` / ``{"boolValue": ...}``.

Names follow the OpenTelemetry hardware semantic conventions (semantic-conventions ``docs/hardware/gpu.md`` and
``common.md``, status Development) where one exists, in their units:

    hw.gpu.utilization          Gauge          1    utilization_gpu_percent / 100 (``hw.gpu.task`` = general)
    hw.gpu.memory.usage         UpDownCounter  By   memory_used_bytes
    hw.gpu.memory.limit         UpDownCounter  By   memory_total_bytes
    hw.gpu.memory.utilization   Gauge          1    memory_used_bytes / memory_total_bytes (fraction used)
    hw.power                    Gauge          W    power_watts
    hw.energy                   Counter        J    energy_joules
    hw.temperature              Gauge          Cel  temperature_gpu_celsius / temperature_memory_celsius
                                                    (``hw.sensor_location`` = gpu / memory)
    hw.errors                   Counter  {error}    ecc_corrected_total / ecc_uncorrected_total
                                                    (``error.type`` = corrected / uncorrected)
    hw.status                   UpDownCounter  1    a health state: 1 for the GPU's state, 0 for the others

Every other schema field has no convention: it goes as ``hermeneut.gpu.<field>`` (a Gauge, its unit from the
field's name), and the anomaly score as ``hermeneut.gpu.anomaly_score``. Each data point carries ``hw.id`` (the GPU
uuid), ``hw.type`` = gpu, ``hw.name`` (gpu<index>), ``hw.model`` and ``hw.vendor``, and the job where one is known
(``hermeneut.job.id``, ``hermeneut.application``); the resource is the node (``host.name``, ``hermeneut.cluster``,
``service.name`` = hermeneut). Health states use ``hw.state`` ok / degraded / failed (healthy / degraded /
unhealthy) and the custom values unknown / maintenance the convention allows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from pipeline.catalogue import lookup
from pipeline.events import METRIC_INDEX, METRIC_NAMES, Finding, InterpretedBatch, Severity

SCOPE: Final = {"name": "hermeneut", "version": "1"}
#: OTLP's AggregationTemporality CUMULATIVE (every counter here is a running total read from the device)
CUMULATIVE: Final = 2

#: schema field -> (semconv name, kind, unit, scale, extra attributes); kind is gauge, updown or counter
SEMCONV: Final[dict[str, tuple[str, str, str, float, tuple[tuple[str, str], ...]]]] = {
    "utilization_gpu_percent": ("hw.gpu.utilization", "gauge", "1", 0.01, (("hw.gpu.task", "general"),)),
    "memory_used_bytes": ("hw.gpu.memory.usage", "updown", "By", 1.0, ()),
    "memory_total_bytes": ("hw.gpu.memory.limit", "updown", "By", 1.0, ()),
    "power_watts": ("hw.power", "gauge", "W", 1.0, ()),
    "energy_joules": ("hw.energy", "counter", "J", 1.0, ()),
    "temperature_gpu_celsius": ("hw.temperature", "gauge", "Cel", 1.0, (("hw.sensor_location", "gpu"),)),
    "temperature_memory_celsius": ("hw.temperature", "gauge", "Cel", 1.0, (("hw.sensor_location", "memory"),)),
    "ecc_corrected_total": ("hw.errors", "counter", "{error}", 1.0, (("error.type", "corrected"),)),
    "ecc_uncorrected_total": ("hw.errors", "counter", "{error}", 1.0, (("error.type", "uncorrected"),)),
}
#: unit suffixes of the schema's field names -> UCUM units (longest first: _bytes_per_second before _bytes)
_UNITS: Final = (
    ("_bytes_per_second", "By/s"), ("_bytes", "By"), ("_percent", "%"), ("_mhz", "MHz"), ("_celsius", "Cel"),
    ("_watts", "W"), ("_joules", "J"), ("_seconds", "s"), ("_total", "1"), ("_gbps", "Gbit/s"),
)  # fmt: skip
#: health state (pipeline.health.Health) -> hw.state; the convention's ok / degraded / failed, and two custom values
HW_STATE: Final = {
    "healthy": "ok",
    "degraded": "degraded",
    "unhealthy": "failed",
    "unknown": "unknown",
    "maintenance": "maintenance",
}
#: finding severity -> OTLP SeverityNumber (INFO, WARN, ERROR: a critical finding is an error of the device,
#: not a crash of the process that logs it, which is what FATAL means)
SEVERITY_NUMBER: Final = {Severity.INFO: 9, Severity.WARNING: 13, Severity.CRITICAL: 17}


def unit_of(name: str) -> str:
    """The UCUM unit of a schema field, from its name's suffix ("1": a count, a ratio or a state)."""
    return next((unit for suffix, unit in _UNITS if name.endswith(suffix)), "1")


def metric_name(name: str) -> str:
    """The OTLP metric a schema field goes to (without its attributes)."""
    return SEMCONV[name][0] if name in SEMCONV else f"hermeneut.gpu.{name}"


def vendor_of(model: str) -> str:
    """``hw.vendor`` of a GPU model: the catalogue's board, else the name's first word ("": not known)."""
    spec = lookup(model)
    name = spec.name if spec is not None else model
    upper = name.upper()
    if upper.startswith("AMD") or "INSTINCT" in upper:
        return "AMD"
    if spec is not None or upper.startswith(("NVIDIA", "TESLA", "QUADRO", "GEFORCE")):
        return "NVIDIA"
    return ""


def attr(key: str, value: str | int | float | bool) -> dict[str, Any]:
    """One OTLP/JSON KeyValue (ints as decimal strings: JSON's numbers are not 64-bit safe)."""
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _resource(cluster: str, node: str) -> dict[str, Any]:
    return {
        "attributes": [attr("service.name", "hermeneut"), attr("host.name", node), attr("hermeneut.cluster", cluster)]
    }


@dataclass
class _Metric:
    """One metric of one resource being built: its points, in the order added."""

    name: str
    kind: str
    unit: str
    points: list[dict[str, Any]] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        if self.kind == "gauge":
            return {"name": self.name, "unit": self.unit, "gauge": {"dataPoints": self.points}}
        monotonic = self.kind == "counter"
        data = {"dataPoints": self.points, "aggregationTemporality": CUMULATIVE, "isMonotonic": monotonic}
        return {"name": self.name, "unit": self.unit, "sum": data}


@dataclass(frozen=True, slots=True)
class Exported:
    """What one message became: OTLP/JSON resource entries and how many data points / log records they hold."""

    resource_metrics: list[dict[str, Any]] = field(default_factory=list)
    resource_logs: list[dict[str, Any]] = field(default_factory=list)
    points: int = 0
    records: int = 0

    @property
    def items(self) -> int:
        return self.points + self.records


def _gpu_attributes(batch: InterpretedBatch, i: int, vendors: dict[str, str]) -> list[dict[str, Any]]:
    model = batch.gpu_model[i]
    vendor = vendors.setdefault(model, vendor_of(model))
    out = [attr("hw.id", batch.gpu_uuid[i]), attr("hw.type", "gpu"), attr("hw.name", f"gpu{batch.gpu_index[i]}")]
    out.append(attr("hw.model", model))
    if vendor:
        out.append(attr("hw.vendor", vendor))
    workload = batch.workload[i]
    if workload is not None:
        if workload.job_id:
            out.append(attr("hermeneut.job.id", workload.job_id))
        out.append(attr("hermeneut.application", workload.application))
    return out


def batch_metrics(batch: InterpretedBatch) -> Exported:
    """An interpreted batch as OTLP metrics: one resource per node, a data point per present value (an absent
    value, NaN, is no point: OTLP has no "not supported"), in the batch's row order."""
    metrics = batch.metrics
    present = np.isfinite(metrics)
    used, total = METRIC_INDEX["memory_used_bytes"], METRIC_INDEX["memory_total_bytes"]
    with np.errstate(divide="ignore", invalid="ignore"):
        used_ratio = metrics[:, used] / metrics[:, total]
    by_node: dict[tuple[str, str], dict[tuple[str, str], _Metric]] = {}
    vendors: dict[str, str] = {}
    ts = batch.ts_ns.tolist()
    score = batch.score.tolist()
    values = metrics.tolist()
    points = 0
    for i in range(len(batch)):
        node = by_node.setdefault((batch.cluster[i], batch.node[i]), {})
        base = _gpu_attributes(batch, i, vendors)
        stamp = str(ts[i])
        row = values[i]
        for j in np.flatnonzero(present[i]).tolist():
            name = METRIC_NAMES[j]
            if name in SEMCONV:
                otel, kind, unit, scale, extra = SEMCONV[name]
                value = row[j] * scale
            else:
                otel, kind, unit, extra, value = f"hermeneut.gpu.{name}", "gauge", unit_of(name), (), row[j]
            metric = node.get((otel, kind))
            if metric is None:
                metric = node[(otel, kind)] = _Metric(otel, kind, unit)
            attributes = base + [attr(k, v) for k, v in extra] if extra else base
            metric.points.append({"timeUnixNano": stamp, "asDouble": value, "attributes": attributes})
            points += 1
        extras = [("hw.gpu.memory.utilization", "1", used_ratio[i]), ("hermeneut.gpu.anomaly_score", "1", score[i])]
        for otel, unit, value in extras:
            if math.isfinite(value):
                metric = node.setdefault((otel, "gauge"), _Metric(otel, "gauge", unit))
                metric.points.append({"timeUnixNano": stamp, "asDouble": float(value), "attributes": base})
                points += 1
    resources = [
        {"resource": _resource(c, n), "scopeMetrics": [{"scope": SCOPE, "metrics": [m.json() for m in ms.values()]}]}
        for (c, n), ms in by_node.items()
    ]
    return Exported(resource_metrics=resources, points=points)


def finding_log(finding: Finding) -> Exported:
    """A finding as one OTLP log record: its summary the body, its severity the record's, the rest attributes
    (``hermeneut.finding.state`` firing / resolved: a clear is a record too, as the finding topic has it)."""
    f = finding
    attributes = [
        attr("hermeneut.detector", f.detector),
        attr("hermeneut.finding.state", "firing" if f.active else "resolved"),
        attr("hermeneut.finding.key", f.dedup_key),
        attr("hermeneut.finding.since_unix_nano", f.since_ns),
    ]
    if f.gpu_uuid:
        attributes += [attr("hw.id", f.gpu_uuid), attr("hw.type", "gpu")]
        if f.gpu_index is not None:
            attributes.append(attr("hw.name", f"gpu{f.gpu_index}"))
    if f.gpu_model:
        attributes.append(attr("hw.model", f.gpu_model))
    if f.action:
        attributes.append(attr("hermeneut.action", f.action))
    if f.workload is not None and f.workload.job_id:
        attributes.append(attr("hermeneut.job.id", f.workload.job_id))
    attributes += [attr(f"hermeneut.evidence.{k}", float(v)) for k, v in sorted(f.evidence.items())]
    record = {
        "timeUnixNano": str(f.ts_ns),
        "observedTimeUnixNano": str(f.ts_ns),
        "severityNumber": SEVERITY_NUMBER[f.severity],
        "severityText": f.severity.value.upper(),
        "body": {"stringValue": f.summary},
        "attributes": attributes,
    }
    resource = {"resource": _resource(f.cluster, f.node), "scopeLogs": [{"scope": SCOPE, "logRecords": [record]}]}
    return Exported(resource_logs=[resource], records=1)


class BadHealth(ValueError):
    """A health record that cannot be exported (what is wrong in one line)."""


def health_metrics(record: Mapping[str, Any]) -> Exported:
    """A health state (the health topic's JSON, pipeline.health.fold.assessment_json plus ``ts_ns``) as ``hw.status``:
    one point per state, 1 for the GPU's (or node's) and 0 for the others, as the convention's StateSet stand-in
    asks; the remedy and the first reason go as attributes. A node's own state has ``hw.type`` host."""
    try:
        cluster, node, state = str(record["cluster"]), str(record["node"]), str(record["state"])
        ts_ns = int(record["ts_ns"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadHealth(f"missing or bad field: {exc}") from exc
    if state not in HW_STATE:
        raise BadHealth(f"unknown health state {state!r}")
    gpu = record.get("gpu")
    base = [attr("hw.id", str(gpu)), attr("hw.type", "gpu")] if gpu else [attr("hw.id", node), attr("hw.type", "host")]
    base.append(attr("hermeneut.remedy", str(record.get("remedy", "none"))))
    reasons = record.get("reasons") or []
    if reasons and isinstance(reasons[0], Mapping) and reasons[0].get("detector"):
        base.append(attr("hermeneut.reason", str(reasons[0]["detector"])))
    points = [
        {"timeUnixNano": str(ts_ns), "asDouble": float(ours == state), "attributes": [*base, attr("hw.state", hw)]}
        for ours, hw in HW_STATE.items()
    ]
    metric = _Metric("hw.status", "updown", "1", points).json()
    resource = {"resource": _resource(cluster, node), "scopeMetrics": [{"scope": SCOPE, "metrics": [metric]}]}
    return Exported(resource_metrics=[resource], points=len(points))


def metrics_request(parts: Iterable[Exported]) -> dict[str, Any]:
    """An ExportMetricsServiceRequest of the parts' resource metrics."""
    return {"resourceMetrics": [r for p in parts for r in p.resource_metrics]}


def logs_request(parts: Iterable[Exported]) -> dict[str, Any]:
    """An ExportLogsServiceRequest of the parts' resource logs."""
    return {"resourceLogs": [r for p in parts for r in p.resource_logs]}
