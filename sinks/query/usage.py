"""Query layer, right-sizing reads: per-GPU-minute usage of jobs and applications, and link throughput seen.

Part of the query layer (the only place Flux is built).
Reads the raw ``gpu`` measurement downsampled by InfluxDB to one row per GPU and minute (each field's maximum
in the minute: the peak is what sizing must respect), the job id of that minute (its last value; ``job_id`` is a
field, not a tag), and each GPU's limits from ``gpu_info``. User input never reaches Flux unchecked: job ids
and applications are validated, ranges must be Flux durations; anything else raises :class:`InvalidQuery`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from pipeline.config import Settings
from pipeline.errors import InvalidQuery
from pipeline.events import APPLICATIONS
from pipeline.usage import GpuLimits, UsageSample, UsageStats, usage_stats
from pipeline.vocab import format_duration, parse_duration
from sinks.influxdb.schema import GPU, GPU_INFO
from sinks.query.flux import time_literal
from sinks.query.model import check_range, resolve_range
from sinks.query.store import flux_rows

_JOB_ID: Final = re.compile(r"^[A-Za-z0-9._:/@+=-]{1,128}$")
_FIELDS: Final = (
    "memory_used_bytes",
    "utilization_gpu_percent",
    "sm_active_percent",
    "power_watts",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
)


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """Usage of one job, one application (across its runs), or every job in ``range`` (back from ``stop``,
    default now) or from ``start`` to ``stop`` (RFC 3339: imported history is in the past)."""

    range: str | None = "7d"
    job: str | None = None
    application: str | None = None
    cluster: str | None = None
    start: str | None = None
    stop: str | None = None

    def validate(self) -> None:
        check_range(None if self.start else self.range, self.start, self.stop)
        if self.job is not None and not _JOB_ID.match(self.job):
            raise InvalidQuery(f"job id {self.job!r} has characters a job id cannot have")
        if self.application is not None and self.application not in APPLICATIONS:
            raise InvalidQuery(f"application {self.application!r} is not one of {', '.join(APPLICATIONS)}")
        if self.job is not None and self.application is not None:
            raise InvalidQuery("ask for a job or an application, not both")
        if self.cluster is not None and not _JOB_ID.match(self.cluster):
            raise InvalidQuery(f"cluster {self.cluster!r} is not a cluster name")

    @property
    def scope(self) -> str:
        return "application" if self.application else "job"

    def range_flux(self) -> str:
        """The Flux ``range()`` arguments: relative to the server's now, or two times."""
        if not (self.start or self.stop):
            return f"start: -{format_duration(parse_duration(self.range or '7d'))}"
        tr = resolve_range(None if self.start else self.range, self.start, self.stop, time.time_ns(), "7d")
        return f"start: {time_literal(tr.start_ns)}, stop: {time_literal(tr.stop_ns)}"

    def _filters(self) -> str:
        """Tag predicates, joined to the measurement's filter so that InfluxDB applies them while it reads."""
        out = ""
        if self.cluster:
            out += f' and r.cluster == "{self.cluster}"'
        if self.application:
            out += f' and r.application == "{self.application}"'
        return out

    def minutes_flux(self, bucket: str) -> str:
        """Per GPU and minute, each usage field's maximum."""
        self.validate()
        return (
            f'from(bucket: "{bucket}")\n  |> range({self.range_flux()})\n'
            f'  |> filter(fn: (r) => r._measurement == "{GPU}"{self._filters()} and '
            f"{_any_field(_FIELDS)})\n"
            "  |> aggregateWindow(every: 1m, fn: max, createEmpty: false)\n"
            '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
            "  |> group()"
        )

    def counts_flux(self, bucket: str) -> str:
        """Per GPU series and minute, how many utilization samples it holds (each stands for its GPU's interval:
        the one GPU-hour, pipeline.usage)."""
        self.validate()
        return (
            f'from(bucket: "{bucket}")\n  |> range({self.range_flux()})\n'
            f'  |> filter(fn: (r) => r._measurement == "{GPU}"{self._filters()} and '
            'r._field == "utilization_gpu_percent")\n'
            "  |> aggregateWindow(every: 1m, fn: count, createEmpty: false)\n"
            '  |> group()\n  |> keep(columns: ["_time", "gpu", "application", "_value"])'
        )

    def jobs_flux(self, bucket: str) -> str:
        """Per GPU and minute, the job id it ran."""
        self.validate()
        job = f'\n  |> filter(fn: (r) => r._value == "{self.job}")' if self.job else ""
        return (
            f'from(bucket: "{bucket}")\n  |> range({self.range_flux()})\n'
            f'  |> filter(fn: (r) => r._measurement == "{GPU}"{self._filters()} and r._field == "job_id")'
            f"{job}\n"
            "  |> aggregateWindow(every: 1m, fn: last, createEmpty: false)\n"
            '  |> group()\n  |> keep(columns: ["_time", "gpu", "_value"])'
        )

    def limits_flux(self, bucket: str) -> str:
        """Each GPU's latest memory total, power limit and sampling interval."""
        self.validate()
        cluster = f' and r.cluster == "{self.cluster}"' if self.cluster else ""
        return (
            f'from(bucket: "{bucket}")\n  |> range({self.range_flux()})\n'
            f'  |> filter(fn: (r) => r._measurement == "{GPU_INFO}"{cluster} and '
            '(r._field == "memory_total_bytes" or r._field == "power_limit_watts" or '
            'r._field == "sample_interval_seconds"))\n'
            '  |> last()\n  |> drop(columns: ["_time"])\n'
            '  |> group(columns: ["gpu"])\n'
            '  |> pivot(rowKey: ["gpu"], columnKey: ["_field"], valueColumn: "_value")\n'
            "  |> group()"
        )


_LINK_FIELDS: Final = (
    "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"
)  # fmt: skip


def _any_field(fields: tuple[str, ...]) -> str:
    """A Flux predicate for a set of fields: OR-ed equalities, which influxd pushes down to storage (``contains()``
    is not pushed down: it reads every field of the range; 24 h of a 128-GPU fleet timed out the dashboard)."""
    return "(" + " or ".join(f'r._field == "{f}"' for f in fields) + ")"


def _opt(row: dict[str, Any], name: str) -> float | None:
    value = row.get(name)
    return None if value is None else float(value)


def _sum(row: dict[str, Any], a: str, b: str) -> float | None:
    x, y = _opt(row, a), _opt(row, b)
    return None if x is None and y is None else (x or 0.0) + (y or 0.0)


def samples_from_rows(
    minutes: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    only_jobs: bool,
    counts: list[dict[str, Any]] | None = None,
) -> list[UsageSample]:
    """Join the minute rows with the job-id rows (by GPU and minute) and the sample counts (by GPU series and
    minute: 1 where none); with ``only_jobs`` keep minutes of a job."""
    job_of: dict[tuple[str, datetime], str] = {(r["gpu"], r["_time"]): str(r["_value"]) for r in jobs}
    held = {(r["gpu"], r.get("application"), r["_time"]): float(r["_value"]) for r in counts or ()}
    out = []
    for r in minutes:
        if r.get("memory_used_bytes") is None or r.get("utilization_gpu_percent") is None:
            continue
        job = job_of.get((r["gpu"], r["_time"]))
        if only_jobs and job is None:
            continue
        out.append(
            UsageSample(
                gpu_uuid=r["gpu"],
                gpu_model=r.get("gpu_model", ""),
                job_id=job,
                application=r.get("application"),
                memory_used_bytes=float(r["memory_used_bytes"]),
                utilization_percent=float(r["utilization_gpu_percent"]),
                power_watts=_opt(r, "power_watts"),
                sm_active_percent=_opt(r, "sm_active_percent"),
                nvlink_bytes_per_second=_sum(r, "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"),
                pcie_bytes_per_second=_sum(r, "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"),
                samples=held.get((r["gpu"], r.get("application"), r["_time"]), 1.0),
            )
        )
    return out


def unsized(minutes: list[dict[str, Any]], jobs: list[dict[str, Any]], scope: str) -> dict[str, int]:
    """Per job (or application), the GPU-minutes with a utilization but no memory reading: right-sizing sizes
    memory first, so such a job is not sized (a trace of utilization and power alone), and says so."""
    job_of = {(r["gpu"], r["_time"]): str(r["_value"]) for r in jobs}
    out: dict[str, int] = {}
    for r in minutes:
        if r.get("memory_used_bytes") is None and r.get("utilization_gpu_percent") is not None:
            key = job_of.get((r["gpu"], r["_time"])) if scope == "job" else r.get("application")
            if key:
                out[key] = out.get(key, 0) + 1
    return out


def usage(settings: Settings, query: UsageQuery) -> list[UsageStats]:
    """Usage statistics per job (or for the application) in the range, from the configured InfluxDB."""
    return usage_and_gaps(settings, query)[0]


def usage_and_gaps(settings: Settings, query: UsageQuery) -> tuple[list[UsageStats], dict[str, int]]:
    """:func:`usage`, and the jobs (or applications) it could not size for want of memory readings
    (:func:`unsized`)."""
    query.validate()
    i = settings.influxdb
    minutes, jobs, limit_rows, counts = flux_rows(
        settings,
        query.minutes_flux(i.bucket),
        query.jobs_flux(i.bucket),
        query.limits_flux(i.bucket),
        query.counts_flux(i.bucket),
    )
    limits = {
        r["gpu"]: GpuLimits(
            float(r["memory_total_bytes"]), _opt(r, "power_limit_watts"), _opt(r, "sample_interval_seconds")
        )
        for r in limit_rows
        if r.get("memory_total_bytes") is not None
    }
    samples = samples_from_rows(minutes, jobs, only_jobs=query.scope == "job", counts=counts)
    stats = usage_stats(samples, limits, query.scope, settings.sample_interval_s)
    sized = {u.key for u in stats}
    return stats, {k: n for k, n in unsized(minutes, jobs, query.scope).items() if k not in sized}


@dataclass(frozen=True, slots=True)
class LinkThroughput:
    """The most one GPU of a model pushed over NVLink and over PCIe per direction in the range (bytes/s)."""

    gpu_model: str
    nvlink_bytes_per_second: float | None
    pcie_bytes_per_second: float | None


def link_throughput_flux(bucket: str, query: UsageQuery) -> str:
    query.validate()
    where = f' and r.cluster == "{query.cluster}"' if query.cluster else ""
    return (
        f'from(bucket: "{bucket}")\n  |> range({query.range_flux()})\n'
        f'  |> filter(fn: (r) => r._measurement == "{GPU}"{where} and {_any_field(_LINK_FIELDS)})\n'
        "  |> max()\n"
        '  |> group(columns: ["gpu_model", "_field"])\n  |> max()\n  |> group()\n'
        '  |> keep(columns: ["gpu_model", "_field", "_value"])'
    )


def link_throughput(settings: Settings, query: UsageQuery) -> list[LinkThroughput]:
    """Per GPU model, the best link throughput seen on the fleet in the query's range and cluster: a demonstrated
    lower bound of the bandwidth."""
    [rows] = flux_rows(settings, link_throughput_flux(settings.influxdb.bucket, query))
    best: dict[str, dict[str, float]] = {}
    for r in rows:
        kind = "nvlink" if str(r["_field"]).startswith("nvlink") else "pcie"
        per_model = best.setdefault(str(r["gpu_model"]), {})
        per_model[kind] = max(per_model.get(kind, 0.0), float(r["_value"]))
    return [LinkThroughput(model, v.get("nvlink") or None, v.get("pcie") or None) for model, v in sorted(best.items())]
