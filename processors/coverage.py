"""What the detectors cannot see in a set of data: the columns it has, how often it was sampled, and what it says of
jobs, nodes and events decide which detectors (processors.detectors.kinds.DETECTORS) can fire at all.

One pure function (:func:`blind_detectors`) holds the rules in one table, each with its reason in words, so that an
import's summary (hermeneut/jobs/importjob.py) can say what a user's logs cannot show: nvidia-smi and dcgm-exporter
logs often carry only utilization, power and memory every 1-60 s, and a quiet result from such data is not a healthy
fleet (issue 38: a straggler needed an SM clock the logs did not have, and nothing said so). A rule says "cannot
fire" only where the detector's inputs are certainly missing; a detector not named may still be limited by its data.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from pipeline import kinds

#: the memory-leak rule's slow route compares per-minute means (processors.detectors.memory)
_LEAK_PERIOD_S: Final = 60.0
#: its fast route fits 10-s means (processors.detectors.memory)
_FAST_LEAK_PERIOD_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class DataShape:
    """What a set of data holds besides its columns: its typical sampling interval (None: single samples, no
    series), the most GPUs one job named by a context had (None: unknown; 0: no job named), the most GPUs one node
    had, and whether it carries GPU events (XIDs, AMD's RAS events)."""

    interval_s: float | None
    job_gpus: int | None
    node_gpus: int
    events: bool = False


def _need(columns: Collection[str], *alternatives: tuple[str, ...]) -> bool:
    """Whether ``columns`` holds every column of at least one of the ``alternatives``."""
    return any(all(c in columns for c in alt) for alt in alternatives)


def _names(*alternatives: tuple[str, ...]) -> str:
    return " or ".join(" and ".join(alt) for alt in alternatives)


#: (detector, the column sets any one of which feeds it, what they are in words), in DETECTORS order
_COLUMNS: Final[tuple[tuple[str, tuple[tuple[str, ...], ...], str], ...]] = (
    (kinds.THERMAL, (("throttle_reasons_mask",), ("temperature_gpu_celsius", "sm_clock_mhz")),
     "the clock-event reasons, or the temperature with the SM clock"),
    (kinds.HBM, (("throttle_reasons_mask",), ("temperature_memory_celsius",)),
     "the clock-event reasons or the memory temperature"),
    (kinds.POWER, (("power_limit_watts",),), "the power limit, whose lowering it is"),
    (kinds.BRAKE, (("throttle_reasons_mask",),), "the clock-event reasons (the HW power brake bit)"),
    (kinds.NVLINK, (("nvlink_links_active",),), "the NVLink links active"),
    (kinds.PCIE, (("pcie_link_gen", "pcie_link_gen_max"), ("pcie_link_width", "pcie_link_width_max")),
     "the PCIe link's generation or width with its maximum"),
    (kinds.PCIE_NARROW, (("pcie_link_width", "pcie_link_width_max"),), "the PCIe link width"),
    (kinds.NVLINK_CRC, (("nvlink_crc_errors_total",),), "the NVLink CRC error counter"),
    (kinds.PCIE_REPLAY, (("pcie_replay_total",),), "the PCIe replay counter"),
    (kinds.PCIE_AER, (("pcie_aer_correctable_total",), ("pcie_aer_uncorrectable_total",)),
     "the PCIe AER error counters"),
    (kinds.SBE, (("ecc_corrected_total",),), "the corrected ECC error counter"),
    (kinds.REMAP, (("row_remap_pending",), ("retired_pages_pending",)),
     "the row remapping (or page retirement) pending flag"),
    (kinds.LEAK, (("memory_used_bytes", "memory_total_bytes"),), "the memory used and total"),
    (kinds.COLLAPSE, (("memory_used_bytes", "memory_total_bytes"),), "the memory used and total"),
    (kinds.IDLE, (("utilization_gpu_percent",),), "the GPU utilization"),
    (kinds.CLIFF, (("utilization_gpu_percent",),), "the GPU utilization"),
    (kinds.PHASE_SHIFT, (("utilization_gpu_percent", "power_watts"), ("pcie_tx_bytes_per_second",)),
     "the utilization with the power (checkpoint dips), or PCIe send (checkpoints)"),
    (kinds.STRAGGLER, (("utilization_gpu_percent", "sm_clock_mhz"), ("utilization_gpu_percent", "power_watts")),
     "the utilization with the SM clock or the power, to compare with the job's peers"),
    (kinds.JOB_SLOWDOWN, (("utilization_gpu_percent", "power_watts"),), "the utilization and the power"),
)  # fmt: skip
#: what an XID-fed detector needs when the data has no events: the uncorrectable counters stand in for the XIDs
_ECC_COUNTERS: Final = (("ecc_uncorrected_total",), ("retired_pages_dbe_total",), ("row_remap_failure",))
#: the detectors that judge a series, not a single sample
_SERIES: Final = (
    kinds.LEAK, kinds.COLLAPSE, kinds.STRAGGLER, kinds.JOB_SLOWDOWN, kinds.IDLE, kinds.CLIFF, kinds.PHASE_SHIFT,
    kinds.LOST_BUS, kinds.NVLINK_CRC, kinds.PCIE_REPLAY, kinds.PCIE_AER, kinds.SBE,
)  # fmt: skip


def _missing_columns(columns: Collection[str], events: bool) -> dict[str, str]:
    """The detectors whose input columns (or events) the data lacks, with what they need."""
    out = {d: f"needs {what} ({_names(*alts)})" for d, alts, what in _COLUMNS if not _need(columns, *alts)}
    if not events:
        if not _need(columns, *_ECC_COUNTERS):
            out[kinds.ECC] = f"needs uncorrectable ECC counters or XID events ({_names(*_ECC_COUNTERS)})"
        out[kinds.STORM] = out[kinds.XID] = "needs XID events (the NVML event stream); the data has none"
        out[kinds.RAS] = "needs AMD RAS events (AFIDs from AMD's exporter or amd-smi); the data has none"
    return out


def _missing_peers(shape: DataShape) -> dict[str, str]:
    """The detectors that need a job a context names, its peers, or a node's other GPUs, which the data lacks."""
    out: dict[str, str] = {}
    if shape.job_gpus == 0:
        for detector in (kinds.IDLE, kinds.CLIFF, kinds.COLLAPSE, kinds.PHASE_SHIFT):
            out[detector] = "needs a job a context names (a mapping's [context], --job): none is named"
    if shape.job_gpus is not None and shape.job_gpus < 2:
        why = "needs two GPUs or more of one job named by a context, to compare them: " + (
            "no job is named" if shape.job_gpus == 0 else "each job has one GPU"
        )
        out[kinds.STRAGGLER] = out[kinds.JOB_SLOWDOWN] = why
    if shape.node_gpus < 2:
        out[kinds.LOST_BUS] = "needs another GPU of the node still reporting: each node has one GPU"
    return out


def _missing_series(interval: float | None) -> dict[str, str]:
    """The detectors that need a time series, or one sampled often enough, which the data's interval denies."""
    if interval is None:
        return dict.fromkeys(_SERIES, "needs a time series: the data holds single samples")
    if interval > _LEAK_PERIOD_S:
        return {kinds.LEAK: f"needs a sample a minute at least (per-minute means): one every {interval:.3g} s"}
    if interval > _FAST_LEAK_PERIOD_S:
        return {
            kinds.LEAK: f"fast leaks (10-s means) need a sample every 10 s: one every {interval:.3g} s leaves the "
            "slow route alone (8 minutes of growth)"
        }
    return {}


def blind_detectors(columns: Collection[str], shape: DataShape) -> list[tuple[str, str]]:
    """(detector, why it cannot fire) for every detector the data cannot feed, in DETECTORS order (pure); a leak
    rule that sees only slow leaks at the data's interval is named too, saying so. Where several reasons hold,
    the missing columns are named first, then the missing job or peers, then the sampling."""
    out = _missing_columns(columns, shape.events)
    for more in (_missing_peers(shape), _missing_series(shape.interval_s)):
        for detector, why in more.items():
            out.setdefault(detector, why)
    return [(d, out[d]) for d in kinds.DETECTORS if d in out]
