"""Right-sizing advice: from a job's (or an application's) measured usage, the smaller slice of GPU it needs.

Pure: :class:`pipeline.usage.UsageStats` in, :class:`Recommendation` out. What a job *needs*:

- memory: its p99 memory plus ``headroom`` (20%), and never less than its peak plus 5% (the peak happened);
- compute: its p95 SM activity (DCGM; utilization when SM activity is not reported, which overstates need:
  utilization counts a kernel on one SM as busy) plus the same headroom.

``used_share`` is the larger of the two as a share of the GPU it ran on. ``wasted_gpu_hours`` is one definition of
waste, the one the idle-capacity finding and ``top wasted`` count too: the GPU-hours the job held its GPUs idle
(under ``pipeline.vocab.IDLE_UTIL_PERCENT``), plus, of the hours it computed, the share of the GPU it did not need.
The options, best saving first:

- ``release``: a job idle for a quarter or more of the time it held its GPUs gives them back between its phases
  (or asks for shorter allocations): it saves its idle GPU-hours;
- ``mig``: the smallest MIG profile of its GPU model (catalogue ``mig_profiles``) with enough memory and compute
  slices (its share of the board's SMs >= compute need);
- ``pack``: N such jobs on one GPU (MPS or time-slicing) when memory and compute leave room for 2 or more;
- ``smaller-gpu``: the catalogue's smallest GPU of the same class (data-centre or not) with enough memory and a
  board power of at least the job's p95 draw plus headroom (power is the catalogue's one cross-generation proxy
  for compute class);
- ``split``: when no smaller GPU holds the model, k smaller GPUs holding 1/k of it each, at the cost of exchanging
  ``exchange_bytes`` per step over the path between them: a ring all-reduce moves 2(k-1)/k of it through each
  link and pays 2(k-1) link latencies, so extra time per step = 2(k-1)/k x bytes / bandwidth + 2(k-1) x latency,
  with the bandwidth measured on the fleet (the best throughput seen on that kind of link) or the catalogue's;
- ``keep`` when the job uses at least ``keep_share`` (60%) of its GPU.

Options are ranked by GPU-hours saved; MIG is preferred when it saves within one slice (1/7) of packing, for its
isolation. A split is listed after the others (it trades step time for smaller GPUs); one drawing more board
power than the big GPU is not offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from pipeline.catalogue import SPECS, GpuSpec, lookup
from pipeline.usage import UsageStats
from pipeline.vocab import IDLE_UTIL_PERCENT

#: per-lane PCIe throughput per direction (GB/s) after line coding, by generation
PCIE_LANE_GBYTES: Final = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
#: assumed one-way latency per hop (s): NVLink/NVSwitch ~ a few us, PCIe switch ~ 10 us, across sockets more
LATENCY_S: Final = {"nvlink": 5e-6, "pcie": 10e-6, "sys": 20e-6}
#: a job idle for at least this share of the GPU-hours it held is told to give its GPUs back between phases
RELEASE_SHARE: Final = 0.25


@dataclass(frozen=True, slots=True)
class Link:
    """The interconnect between the GPUs of a split: kind, usable bandwidth per direction, where the number is from."""

    kind: str
    bytes_per_second: float
    latency_s: float
    source: str


@dataclass(frozen=True, slots=True)
class Option:
    kind: str
    target: str
    #: share of the job's current GPU-hours this option would still use
    share: float
    saved_gpu_hours: float
    detail: str
    extra_step_s: float | None = None


@dataclass(frozen=True, slots=True)
class Recommendation:
    stats: UsageStats
    used_share: float
    wasted_gpu_hours: float
    options: tuple[Option, ...]
    summary: str
    evidence: dict[str, float] = field(default_factory=dict)


def catalogue_link(spec: GpuSpec) -> Link:
    """What the catalogue says about a model's link to its peers: NVLink if it has any, else its PCIe link."""
    if spec.nvlink_links and spec.nvlink_gbytes_per_second:
        return Link("nvlink", spec.nvlink_links * spec.nvlink_gbytes_per_second * 1e9, LATENCY_S["nvlink"], "catalogue")
    per_lane = PCIE_LANE_GBYTES.get(spec.pcie_gen_max or 3, 0.985)
    return Link("pcie", per_lane * (spec.pcie_width_max or 16) * 1e9, LATENCY_S["pcie"], "catalogue")


def split_extra_s(exchange_bytes: float, k: int, link: Link) -> float:
    """Extra time per step for a ring all-reduce of ``exchange_bytes`` over k GPUs on ``link`` (module docstring)."""
    if k < 2:
        return 0.0
    return 2 * (k - 1) / k * exchange_bytes / link.bytes_per_second + 2 * (k - 1) * link.latency_s


def recommend(
    stats: UsageStats,
    headroom: float = 0.2,
    keep_share: float = 0.6,
    exchange_bytes: float | None = None,
    measured: dict[str, Link] | None = None,
) -> Recommendation:
    """The advice for one job or application (module docstring); ``measured`` maps a GPU model to the best link
    throughput seen on the fleet for it (else the catalogue's figure is used)."""
    spec = lookup(stats.gpu_model)
    total = None if math.isnan(stats.memory_total_bytes) else stats.memory_total_bytes
    if total is None and spec is not None:
        total = float(spec.memory_bytes)
    mem_need = max(stats.memory_p99_bytes * (1 + headroom), stats.memory_peak_bytes * 1.05)
    activity = stats.sm_active_p95_percent if stats.sm_active_p95_percent is not None else stats.utilization_p95_percent
    compute_need = min(1.0, activity / 100 * (1 + headroom))
    mem_share = min(1.0, mem_need / total) if total else 1.0
    used = max(mem_share, compute_need)
    idle = min(stats.idle_gpu_hours, stats.gpu_hours)
    wasted = idle + (stats.gpu_hours - idle) * (1 - used)
    options: list[Option] = []
    if stats.gpu_hours and idle / stats.gpu_hours >= RELEASE_SHARE:
        share = idle / stats.gpu_hours
        what = f"idle (under {IDLE_UTIL_PERCENT:g}% utilization) for {share:.0%} of the time it held its GPUs"
        advice = "give them back between phases, or allocate for less time"
        options.append(Option("release", stats.gpu_model, 1 - share, idle, f"{what}: {advice}"))
    if used >= keep_share:
        options.append(Option("keep", stats.gpu_model, 1.0, 0.0, f"uses {used:.0%} of its GPU when it computes"))
    else:
        options += _mig(stats, spec, mem_need, compute_need)
        options += _pack(stats, mem_share, compute_need)
        options += _smaller(stats, spec, mem_need)
    if compute_need < keep_share and not any(o.kind == "smaller-gpu" for o in options):
        # memory-bound and compute-light: the model could be spread over smaller GPUs, at a price per step
        options += _split(stats, spec, mem_need, exchange_bytes, measured or {})
    # MIG wins within one slice of packing: it isolates memory and faults, MPS/time-slicing does not
    options.sort(
        key=lambda o: (o.kind == "split", -o.saved_gpu_hours - (stats.gpu_hours / 7 if o.kind == "mig" else 0))
    )
    if not options:
        options.append(Option("keep", stats.gpu_model, 1.0, 0.0, "no smaller fit in the catalogue"))
    best = options[0]
    what = f"{stats.scope} {stats.key}" + (
        f" ({stats.application})" if stats.scope == "job" and stats.application else ""
    )
    summary = (
        f"{what} on {stats.gpus} x {stats.gpu_model}: uses {used:.0%} of its GPU(s) (memory p99 "
        f"{stats.memory_p99_bytes / 2**30:.1f} GiB, peak {stats.memory_peak_bytes / 2**30:.1f} GiB, "
        f"{'SM active' if stats.sm_active_p95_percent is not None else 'util'} p95 {activity:.0f}%, power p95 "
        f"{'not reported' if stats.power_p95_watts is None else f'{stats.power_p95_watts:.0f} W'}); {wasted:.1f} of "
        f"{stats.gpu_hours:.1f} GPU-hours wasted ({idle:.1f} idle) -> "
        f"{best.kind}: {best.target} ({best.detail})"
    )
    evidence = {
        "gpu_hours": stats.gpu_hours,
        "wasted_gpu_hours": wasted,
        "idle_gpu_hours": idle,
        "used_share": used,
        "memory_need_bytes": mem_need,
        "compute_need": compute_need,
        "memory_p99_bytes": stats.memory_p99_bytes,
        "memory_peak_bytes": stats.memory_peak_bytes,
    }
    if stats.power_p95_watts is not None:
        evidence["power_p95_watts"] = stats.power_p95_watts
    return Recommendation(stats, used, wasted, tuple(options), summary, evidence)


def _mig(stats: UsageStats, spec: GpuSpec | None, mem_need: float, compute_need: float) -> list[Option]:
    if spec is None or not spec.mig_profiles:
        return []
    fitting = [p for p in spec.mig_profiles if p.memory_bytes >= mem_need and p.compute_share >= compute_need]
    if not fitting:
        return []
    best = min(fitting, key=lambda p: (p.compute_share, p.memory_bytes, "+me" in p.name))
    if best.compute_share >= 1:
        return []
    share = best.compute_share
    return [
        Option(
            "mig",
            best.name,
            share,
            stats.gpu_hours * (1 - share),
            f"{best.memory_bytes / 2**30:.0f} GiB and {best.slices}/{best.of} of the SMs hold it; "
            f"{best.of // best.slices} such instances per GPU",
        )
    ]


def _pack(stats: UsageStats, mem_share: float, compute_need: float) -> list[Option]:
    per_gpu = math.floor(min(1 / max(mem_share, 1e-9), 1 / max(compute_need, 1e-9)))
    if per_gpu < 2:
        return []
    share = 1 / per_gpu
    return [
        Option(
            "pack",
            f"{per_gpu} jobs per GPU",
            share,
            stats.gpu_hours * (1 - share),
            f"memory {mem_share:.0%} and compute {compute_need:.0%} of one GPU each (MPS or time-slicing)",
        )
    ]


def _candidates(stats: UsageStats, spec: GpuSpec) -> list[GpuSpec]:
    """Smaller GPUs of the same class with enough board power for the job's p95 draw plus headroom (any board
    power, when the source reports no power)."""
    power_need = 0.0 if stats.power_p95_watts is None else stats.power_p95_watts * 1.2
    return [
        s
        for s in SPECS
        if s.data_center == spec.data_center
        and s.memory_bytes < spec.memory_bytes
        and s.power_default_watts is not None
        and spec.power_default_watts is not None
        and spec.power_default_watts > s.power_default_watts >= power_need
    ]


def _smaller(stats: UsageStats, spec: GpuSpec | None, mem_need: float) -> list[Option]:
    if spec is None or spec.power_default_watts is None:
        return []
    fits = [s for s in _candidates(stats, spec) if s.memory_bytes >= mem_need]
    if fits:
        best = min(fits, key=lambda s: (s.memory_bytes, s.power_default_watts or 0))
        share = (best.power_default_watts or 0) / spec.power_default_watts
        return [
            Option(
                "smaller-gpu",
                best.name,
                share,
                stats.gpu_hours * (1 - share),
                f"{best.memory_bytes / 2**30:.0f} GiB holds {mem_need / 2**30:.1f} GiB; board power "
                f"{best.power_default_watts:.0f} W vs {spec.power_default_watts:.0f} W",
            )
        ]
    return []


def _split(
    stats: UsageStats, spec: GpuSpec | None, mem_need: float, exchange_bytes: float | None, measured: dict[str, Link]
) -> list[Option]:
    """The model over k smaller GPUs: the fewest GPUs, then the least board power; never one whose board power
    exceeds the big GPU's (a negative saving is no alternative)."""
    if spec is None or not spec.power_default_watts:
        return []
    out = []
    for s in _candidates(stats, spec):
        k = math.ceil(mem_need / s.memory_bytes)
        if not 2 <= k <= 8:
            continue
        share = k * (s.power_default_watts or 0) / spec.power_default_watts
        if share > 1.0:
            continue
        link = measured.get(s.name) or catalogue_link(s)
        extra = None if exchange_bytes is None else split_extra_s(exchange_bytes, k, link)
        cost = (
            f"+{extra * 1e3:.1f} ms per step exchanging {exchange_bytes / 2**20:.0f} MiB over {link.kind} at "
            f"{link.bytes_per_second / 1e9:.0f} GB/s ({link.source})"
            if extra is not None and exchange_bytes is not None
            else "pass --exchange-bytes (bytes exchanged per step) for the extra time per step"
        )
        power = f"{k} x {s.power_default_watts:.0f} W board power vs {spec.power_default_watts:.0f} W"
        out.append(Option("split", f"{k} x {s.name}", share, stats.gpu_hours * (1 - share), f"{cost}; {power}", extra))
    return sorted(out, key=lambda o: (o.share, o.target))[:1]
