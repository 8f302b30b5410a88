"""GPU usage statistics per job or per application: what right-sizing advice is computed from.

The query layer reads per-GPU-minute rows (:class:`UsageSample`: the minute's peak memory and utilization, SM
activity and power) and :func:`usage_stats` folds them into one :class:`UsageStats` per job (or per
application, across its runs): peak / p95 / p99 memory, p95 utilization, SM activity and power, GPU-hours.
Pure; shared by ``sinks`` (which builds them) and ``processors.rightsize`` (which judges them).

**The one GPU-hour** (:func:`gpu_hours`; docs/queries.md): a GPU-hour is 3,600 GPU-seconds, and every stored
sample stands for its GPU's sampling interval (``sample_interval_seconds`` in ``gpu_info``: the collector's
interval live, the one an import detected; the ``sample_interval_s`` setting where a GPU never stored one). Exact
for a job that starts mid-minute, and countable in every store: raw samples, the 1-minute rollups'
``<field>_count``, the job summaries' ``gpu_seconds``. ``jobs`` (the jobs bucket's task in Flux,
:func:`sinks.query.flux.jobs_task_flux`), ``rightsize`` (a per-minute row carries its sample count) and
``top wasted`` all count this way. An idle (wasted) sample is one of a minute whose peak utilization stayed under
the threshold (:data:`IDLE_UTIL_PERCENT` by default): right-sizing's idle minute, what the rollups can tell.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.vocab import IDLE_UTIL_PERCENT


@dataclass(frozen=True, slots=True)
class UsageSample:
    """One GPU during one minute: the minute's maxima (memory, utilization, SM activity, power, link traffic)."""

    gpu_uuid: str
    gpu_model: str
    job_id: str | None
    application: str | None
    memory_used_bytes: float
    utilization_percent: float
    #: None: the source reports no power (absent stays absent, never zero)
    power_watts: float | None
    sm_active_percent: float | None = None
    nvlink_bytes_per_second: float | None = None
    pcie_bytes_per_second: float | None = None
    #: the samples the minute holds (each stands for its GPU's sampling interval: the one GPU-hour)
    samples: float = 1.0


@dataclass(frozen=True, slots=True)
class GpuLimits:
    memory_total_bytes: float
    power_limit_watts: float | None = None
    #: how far apart the GPU's samples are (s), when it said: a series sampled every 5 minutes has a row every
    #: 5 minutes, each standing for 5 GPU-minutes
    sample_interval_s: float | None = None


@dataclass(frozen=True, slots=True)
class UsageStats:
    """One job (``scope`` "job") or one application across its runs (``scope`` "application")."""

    key: str
    scope: str
    application: str | None
    gpu_model: str
    gpus: int
    runs: int
    gpu_hours: float
    memory_total_bytes: float
    memory_peak_bytes: float
    memory_p95_bytes: float
    memory_p99_bytes: float
    utilization_p95_percent: float
    #: None: no power reading in the rows
    power_p95_watts: float | None
    power_limit_watts: float | None = None
    sm_active_p95_percent: float | None = None
    #: the most the job pushed over NVLink / PCIe per GPU (p99 of its minutes): what it needs from a link
    nvlink_p99_bytes_per_second: float | None = None
    pcie_p99_bytes_per_second: float | None = None
    #: GPU-hours of minutes in which the GPU stayed under IDLE_UTIL_PERCENT: held, and idle
    idle_gpu_hours: float = 0.0


def _p(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def gpu_hours(samples: float, sample_interval_s: float) -> float:
    """GPU-hours of ``samples`` samples of a GPU sampled every ``sample_interval_s`` (the one definition, see the
    module docstring)."""
    return samples * sample_interval_s / 3600.0


def interval_of(gpu_uuid: str, limits: dict[str, GpuLimits], default_s: float) -> float:
    """How long one sample of this GPU stands for: its stored interval, else ``default_s`` (the setting)."""
    limit = limits.get(gpu_uuid)
    return limit.sample_interval_s if limit is not None and limit.sample_interval_s else default_s


def usage_stats(
    samples: Sequence[UsageSample], limits: dict[str, GpuLimits], scope: str, default_interval_s: float = 1.0
) -> list[UsageStats]:
    """Fold GPU-minutes into statistics per job (``scope="job"``, minutes without a job id are left out) or per
    application (``scope="application"``); sorted by GPU-hours, largest first. GPU-hours: each minute's samples
    times its GPU's interval (``default_interval_s``, the setting, where it stored none)."""
    if scope not in ("job", "application"):
        raise ValueError(f"scope must be job or application, not {scope!r}")
    groups: dict[str, list[UsageSample]] = {}
    for s in samples:
        key = s.job_id if scope == "job" else s.application
        if key:
            groups.setdefault(key, []).append(s)
    out = []
    for key, rows in groups.items():
        # GPU-seconds of each minute row (the one definition: its samples times its GPU's interval)
        seconds = [r.samples * interval_of(r.gpu_uuid, limits, default_interval_s) for r in rows]
        model = Counter(r.gpu_model for r in rows).most_common(1)[0][0]
        same_model = [r for r in rows if r.gpu_model == model]
        totals = [limits[r.gpu_uuid].memory_total_bytes for r in same_model if r.gpu_uuid in limits]
        power_limits = [
            p for r in same_model if r.gpu_uuid in limits and (p := limits[r.gpu_uuid].power_limit_watts) is not None
        ]
        memory = [r.memory_used_bytes for r in same_model]
        sm = [r.sm_active_percent for r in same_model if r.sm_active_percent is not None]
        nvl = [r.nvlink_bytes_per_second for r in same_model if r.nvlink_bytes_per_second is not None]
        pcie = [r.pcie_bytes_per_second for r in same_model if r.pcie_bytes_per_second is not None]
        out.append(
            UsageStats(
                key=key,
                scope=scope,
                application=Counter(r.application for r in rows).most_common(1)[0][0],
                gpu_model=model,
                gpus=len({r.gpu_uuid for r in rows}),
                runs=len({r.job_id for r in rows if r.job_id}) or 1,
                gpu_hours=sum(seconds) / 3600.0,
                idle_gpu_hours=sum(
                    t for t, r in zip(seconds, rows, strict=True) if r.utilization_percent < IDLE_UTIL_PERCENT
                )
                / 3600.0,
                memory_total_bytes=float(np.median(totals)) if totals else float("nan"),
                memory_peak_bytes=float(max(memory)),
                memory_p95_bytes=_p(memory, 95) or 0.0,
                memory_p99_bytes=_p(memory, 99) or 0.0,
                utilization_p95_percent=_p([r.utilization_percent for r in same_model], 95) or 0.0,
                power_p95_watts=_p([r.power_watts for r in same_model if r.power_watts is not None], 95),
                power_limit_watts=float(np.median(power_limits)) if power_limits else None,
                sm_active_p95_percent=_p(sm, 95),
                nvlink_p99_bytes_per_second=_p(nvl, 99),
                pcie_p99_bytes_per_second=_p(pcie, 99),
            )
        )
    return sorted(out, key=lambda u: -u.gpu_hours)
