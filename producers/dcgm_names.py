"""dcgm-exporter's metric names of every generation and the unit each is exposed in: the one table the live
``dcgm-exporter`` source and the importers (saved scrapes, Prometheus) map through.

Three generations are in the field (sources: ``tests/testdata/dcgm-exporter/README.md``):

- up to 4.8.x (DCGM up to 4.6): the legacy names, e.g. ``DCGM_FI_DEV_SM_CLOCK`` in MHz, ``DCGM_FI_DEV_FB_USED`` in
  MiB, ``DCGM_FI_DEV_GPU_UTIL`` in percent, ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` in mJ; the node label is
  ``Hostname`` up to 4.8.2 and ``hostname`` from 4.8.3;
- 4.9.0 (DCGM 4.7): the default and profiling fields renamed to DCGM's field-naming standard, eleven of them in SI
  units (Hz, J, a 0-1 ratio, bytes, B/s); the driver label ``DCGM_FI_DRIVER_VERSION`` is now
  ``DCGM_FI_SYSTEM_DRIVER_VERSION``;
- 4.10.0 (DCGM 4.8): the PCIe and NVLink profiling rates renamed ``*_BYTES_PER_SECOND`` (still B/s).

Names are recognised per series, not per exporter: a site mid-upgrade (a Prometheus range across the upgrade, two
exporter versions behind one federation) has both. Where one GPU reports a quantity under several names in one
scrape, the first name of its row below wins: the newest generation's (its units are exact, bytes where the
legacy field rounded to whole MiB), and for the power limit the enforced one over the requested one. The
others are counted (``duplicate``), never added up. A field of ``parts`` (NVLink CRC errors: flit + data) sums
its parts, each part chosen the same way.

A unit is named once per row; the factor to the schema's unit (the suffix of the field's name: ``_mhz``,
``_joules``, ``_percent``, ``_bytes``, ``_bytes_per_second``, ...) is derived from it, and a row whose unit is of
another kind than its field's fails at import, not at a customer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: the value a unit's 1 is worth in its SI base, and the kind of quantity (a factor only converts within a kind)
UNITS: Final[dict[str, tuple[str, float]]] = {
    "MHz": ("frequency", 1e6),
    "Hz": ("frequency", 1.0),
    "mJ": ("energy", 1e-3),
    "J": ("energy", 1.0),
    "%": ("fraction", 0.01),
    "ratio": ("fraction", 1.0),
    "MiB": ("size", float(2**20)),
    "B": ("size", 1.0),
    "KiB/s": ("rate", 1024.0),
    "MB/s": ("rate", 1e6),
    "B/s": ("rate", 1.0),
    "W": ("power", 1.0),
    "C": ("temperature", 1.0),
    "1": ("count", 1.0),
}

#: the schema's unit, read off a field name's suffix (first match; pipeline/events.py puts units in names)
_SCHEMA_UNITS: Final = (
    ("_bytes_per_second", "B/s"),
    ("_bytes", "B"),
    ("_mhz", "MHz"),
    ("_joules", "J"),
    ("_percent", "%"),
    ("_watts", "W"),
    ("_celsius", "C"),
)

#: not schema fields: the last XID (an event when it changes) and free memory (for the total when none is given)
XID: Final = "xid"
FREE: Final = "memory_free_bytes"

LEGACY, DCGM46, EXP490, EXP4100 = "legacy", "DCGM 4.6", "4.9.0", "4.10.0"

#: field (or field:part) -> its names, the preferred first, each with the unit it is exposed in and the generation
#: that named it (LEGACY: up to 4.8.x; DCGM46: DCGM 4.6's field-naming standard, default from exporter 4.9.0;
#: EXP490 / EXP4100: named by that exporter release)
TABLE: Final[tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...]] = (
    ("sm_clock_mhz", (("DCGM_FI_DEV_SM_CLOCK_HERTZ", "Hz", EXP490), ("DCGM_FI_DEV_SM_CLOCK", "MHz", LEGACY))),
    ("memory_clock_mhz", (("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "Hz", EXP490), ("DCGM_FI_DEV_MEM_CLOCK", "MHz", LEGACY))),
    ("sm_clock_max_mhz", (("DCGM_FI_DEV_MAX_SM_CLOCK", "MHz", LEGACY),)),
    ("memory_clock_max_mhz", (("DCGM_FI_DEV_MAX_MEM_CLOCK", "MHz", LEGACY),)),
    ("temperature_gpu_celsius", (("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "C", DCGM46), ("DCGM_FI_DEV_GPU_TEMP", "C", LEGACY))),
    ("temperature_memory_celsius", (
        ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "C", DCGM46), ("DCGM_FI_DEV_MEMORY_TEMP", "C", LEGACY))),
    ("temperature_slowdown_celsius", (
        ("DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS", "C", DCGM46), ("DCGM_FI_DEV_SLOWDOWN_TEMP", "C", LEGACY))),
    ("temperature_shutdown_celsius", (
        ("DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS", "C", DCGM46), ("DCGM_FI_DEV_SHUTDOWN_TEMP", "C", LEGACY))),
    ("temperature_memory_max_celsius", (
        ("DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS", "C", DCGM46), ("DCGM_FI_DEV_MEM_MAX_OP_TEMP", "C", LEGACY))),
    ("power_watts", (("DCGM_FI_DEV_BOARD_POWER_WATTS", "W", DCGM46), ("DCGM_FI_DEV_POWER_USAGE", "W", LEGACY))),
    ("power_limit_watts", (
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS", "W", DCGM46),
        ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "W", LEGACY),
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS", "W", DCGM46),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "W", LEGACY))),
    ("power_default_limit_watts", (
        ("DCGM_FI_DEV_BOARD_POWER_LIMIT_DEFAULT_WATTS", "W", DCGM46),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", "W", LEGACY))),
    ("energy_joules", (
        ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "J", EXP490), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ", LEGACY))),
    ("utilization_gpu_percent", (
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", "ratio", EXP490), ("DCGM_FI_DEV_GPU_UTIL", "%", LEGACY))),
    ("utilization_memory_percent", (
        ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", "ratio", EXP490), ("DCGM_FI_DEV_MEM_COPY_UTIL", "%", LEGACY))),
    ("fan_speed_percent", (("DCGM_FI_DEV_FAN_SPEED_RATIO", "ratio", EXP490), ("DCGM_FI_DEV_FAN_SPEED", "%", LEGACY))),
    ("memory_used_bytes", (("DCGM_FI_DEV_FB_USED_BYTES", "B", EXP490), ("DCGM_FI_DEV_FB_USED", "MiB", LEGACY))),
    ("memory_total_bytes", (("DCGM_FI_DEV_FB_CAPACITY_BYTES", "B", EXP490), ("DCGM_FI_DEV_FB_TOTAL", "MiB", LEGACY))),
    ("memory_reserved_bytes", (
        ("DCGM_FI_DEV_FB_RESERVED_BYTES", "B", EXP490), ("DCGM_FI_DEV_FB_RESERVED", "MiB", LEGACY))),
    (FREE, (("DCGM_FI_DEV_FB_FREE_BYTES", "B", EXP490), ("DCGM_FI_DEV_FB_FREE", "MiB", LEGACY))),
    ("performance_state", (("DCGM_FI_DEV_GPU_PSTATE", "1", DCGM46), ("DCGM_FI_DEV_PSTATE", "1", LEGACY))),
    ("throttle_reasons_mask", (
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "1", LEGACY), ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "1", LEGACY))),
    ("pcie_link_gen", (("DCGM_FI_DEV_PCIE_LINK_GEN", "1", LEGACY),)),
    ("pcie_link_gen_max", (("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "1", LEGACY),)),
    ("pcie_link_width", (("DCGM_FI_DEV_PCIE_LINK_WIDTH", "1", LEGACY),)),
    ("pcie_link_width_max", (("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "1", LEGACY),)),
    # DCP's measured PCIe bytes over NVML's sampled KB/s (deprecated in DCGM for the DCP field)
    ("pcie_tx_bytes_per_second", (
        ("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", "B/s", EXP4100), ("DCGM_FI_PROF_PCIE_TX_BYTES", "B/s", LEGACY),
        ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "KiB/s", LEGACY))),
    ("pcie_rx_bytes_per_second", (
        ("DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND", "B/s", EXP4100), ("DCGM_FI_PROF_PCIE_RX_BYTES", "B/s", LEGACY),
        ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "KiB/s", LEGACY))),
    ("nvlink_tx_bytes_per_second", (
        ("DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND", "B/s", EXP4100), ("DCGM_FI_PROF_NVLINK_TX_BYTES", "B/s", LEGACY))),
    ("nvlink_rx_bytes_per_second", (
        ("DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND", "B/s", EXP4100), ("DCGM_FI_PROF_NVLINK_RX_BYTES", "B/s", LEGACY))),
    ("pcie_replay_total", (
        ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "1", DCGM46), ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "1", LEGACY))),
    ("ecc_corrected_total", (("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "1", LEGACY),)),
    ("ecc_uncorrected_total", (("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "1", LEGACY),)),
    ("retired_pages_sbe_total", (
        ("DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL", "1", DCGM46), ("DCGM_FI_DEV_RETIRED_SBE", "1", LEGACY))),
    ("retired_pages_dbe_total", (
        ("DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL", "1", DCGM46), ("DCGM_FI_DEV_RETIRED_DBE", "1", LEGACY))),
    ("retired_pages_pending", (
        ("DCGM_FI_DEV_PAGE_RETIRED_PENDING", "1", DCGM46), ("DCGM_FI_DEV_RETIRED_PENDING", "1", LEGACY))),
    ("row_remap_correctable_total", (
        ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "1", DCGM46),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "1", LEGACY))),
    ("row_remap_uncorrectable_total", (
        ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "1", DCGM46),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "1", LEGACY))),
    ("row_remap_pending", (("DCGM_FI_DEV_ROW_REMAP_PENDING", "1", LEGACY),)),
    ("row_remap_failure", (
        ("DCGM_FI_DEV_ROW_REMAP_FAILED", "1", DCGM46), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1", LEGACY))),
    ("nvlink_replay_errors_total", (
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", "1", DCGM46),
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "1", LEGACY))),
    ("nvlink_recovery_errors_total", (
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", "1", DCGM46),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "1", LEGACY))),
    ("nvlink_crc_errors_total:flit", (
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", "1", DCGM46),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "1", LEGACY))),
    ("nvlink_crc_errors_total:data", (
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL", "1", DCGM46),
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "1", LEGACY))),
    ("sm_active_percent", (
        ("DCGM_FI_PROF_SM_UTIL_RATIO", "ratio", DCGM46), ("DCGM_FI_PROF_SM_ACTIVE", "ratio", LEGACY))),
    ("tensor_active_percent", (
        ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", "ratio", DCGM46), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ratio", LEGACY))),
    ("dram_active_percent", (
        ("DCGM_FI_PROF_DRAM_UTIL_RATIO", "ratio", DCGM46), ("DCGM_FI_PROF_DRAM_ACTIVE", "ratio", LEGACY))),
    (XID, (("DCGM_FI_DEV_XID_ERROR", "1", DCGM46), ("DCGM_FI_DEV_XID_ERRORS", "1", LEGACY))),
)  # fmt: skip

#: fields of the default counters the schema has no place for (counted as ``ignored``, not named in the log):
#: encoder/decoder load, the graphics-engine ratio (sm_active says more), the vGPU licence, NVLink's summed
#: throughput (the schema keeps TX and RX), the used share of memory (used and total are mapped), SM occupancy
IGNORED: Final = frozenset(
    {
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_ENC_UTIL_RATIO",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL_RATIO",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
        "DCGM_FI_DEV_FB_USED_PERCENT",
        "DCGM_FI_DEV_FB_USED_RATIO",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
    }
)

#: the node's label, newest first (``hostname`` from 4.8.3, ``Hostname`` before)
HOST_LABELS: Final = ("hostname", "Hostname")
#: the driver-version label on every series, newest first (4.9.0 renamed it)
DRIVER_LABELS: Final = ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION")


@dataclass(frozen=True, slots=True)
class Name:
    """One exposed metric name: the field it fills (``part`` of a summed field), the unit it is exposed in, the
    factor to the schema's unit, its rank among the names of the same quantity (0 = preferred) and generation."""

    metric: str
    field: str
    part: str
    unit: str
    factor: float
    rank: int
    generation: str


def schema_unit(field: str) -> str:
    """The unit the schema stores ``field`` in (its name's suffix; a count when none)."""
    return next((unit for suffix, unit in _SCHEMA_UNITS if field.endswith(suffix)), "1")


def factor(unit: str, field: str) -> float:
    """What a value in ``unit`` is multiplied by to be in ``field``'s unit; ValueError across kinds."""
    (kind, si), (to_kind, to_si) = UNITS[unit], UNITS[schema_unit(field)]
    if kind != to_kind:
        raise ValueError(f"{unit} ({kind}) cannot fill {field} ({to_kind})")
    return si / to_si


def _names() -> dict[str, Name]:
    out: dict[str, Name] = {}
    for target, names in TABLE:
        field, _, part = target.partition(":")
        for rank, (metric, unit, generation) in enumerate(names):
            if metric in out:
                raise ValueError(f"{metric} is in the table twice")
            out[metric] = Name(metric, field, part, unit, factor(unit, field), rank, generation)
    return out


#: every metric name the mapping reads, old and new
NAMES: Final = _names()


def first_label(labels: dict[str, str], names: tuple[str, ...]) -> str:
    """The value of the first of ``names`` the series carries ("" when none)."""
    return next((labels[n] for n in names if labels.get(n)), "")
