"""What the collector reads from NVML, as tables of calls bound to the NVML module once: every round's readings in
order (:func:`readings`, a reading tried only when another is unsupported), and the device's limits
(:func:`limit_readings`, read when the collector opens)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

#: NVML's "unknown P-state"
_PSTATE_UNKNOWN: Final = 32
#: NVML reports PCIe throughput in KiB/s
KIB: Final = 1024.0

Reader = Callable[[Any], dict[str, float]]


@dataclass(frozen=True, slots=True)
class Reading:
    """One NVML call and the fields it yields; ``after``: only tried once that other reading is unsupported."""

    key: str
    read: Reader
    after: str | None = None


def text(value: Any) -> str:
    """A value NVML returned as bytes or text, as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def sysfs_bus_id(nvml_bus_id: Any) -> str:
    """NVML's ``00000000:3B:00.0`` as Linux writes it (``0000:3b:00.0``); other forms are returned lower-cased."""
    bus_id = text(nvml_bus_id).strip()
    parts = bus_id.split(":")
    if len(parts) == 3:
        try:
            return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}".lower()
        except ValueError:
            pass
    return bus_id.lower()


def _pair(fn: Callable[..., Any], *args: Any, name: str, scale: float = 1.0) -> Reader:
    """A reader of one NVML call returning one number (``fn`` and ``args`` bound once, not looked up per call)."""
    if scale == 1.0:
        return lambda h: {name: fn(h, *args)}
    return lambda h: {name: fn(h, *args) * scale}


def readings(n: Any) -> tuple[Reading, ...]:
    """What is read every round, in order, bound to the NVML module ``n``."""
    memory = n.nvmlDeviceGetMemoryInfo
    version = n.nvmlMemory_v2
    utilization = n.nvmlDeviceGetUtilizationRates
    pstate = n.nvmlDeviceGetPerformanceState
    remapped = n.nvmlDeviceGetRemappedRows
    retired = n.nvmlDeviceGetRetiredPages
    # the "event reasons" name arrived with driver 535; older bindings only have the "throttle" one
    reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
    ecc = n.nvmlDeviceGetTotalEccErrors
    clock = n.nvmlDeviceGetClockInfo
    sampled = n.nvmlDeviceGetPcieThroughput

    def _utilization(h: Any) -> dict[str, float]:
        u = utilization(h)
        return {"utilization_gpu_percent": u.gpu, "utilization_memory_percent": u.memory}

    def _memory_v2(h: Any) -> dict[str, float]:
        m = memory(h, version)
        return {"memory_used_bytes": m.used, "memory_total_bytes": m.total, "memory_reserved_bytes": m.reserved}

    def _memory_v1(h: Any) -> dict[str, float]:
        m = memory(h)
        return {"memory_used_bytes": m.used, "memory_total_bytes": m.total}

    def _pstate(h: Any) -> dict[str, float]:
        state = pstate(h)
        return {} if state == _PSTATE_UNKNOWN else {"performance_state": state}

    def _row_remap(h: Any) -> dict[str, float]:
        corrected, uncorrected, pending, failure = remapped(h)
        return {
            "row_remap_correctable_total": corrected,
            "row_remap_uncorrectable_total": uncorrected,
            "row_remap_pending": int(bool(pending)),
            "row_remap_failure": int(bool(failure)),
        }

    def _retired(cause: int, name: str) -> Reader:
        return lambda h: {name: len(retired(h, cause))}

    return (
        Reading("utilization", _utilization),
        Reading("memory_v2", _memory_v2),
        Reading("memory", _memory_v1, after="memory_v2"),
        Reading("sm_clock", _pair(clock, n.NVML_CLOCK_SM, name="sm_clock_mhz")),
        Reading("graphics_clock", _pair(clock, n.NVML_CLOCK_GRAPHICS, name="graphics_clock_mhz")),
        Reading("memory_clock", _pair(clock, n.NVML_CLOCK_MEM, name="memory_clock_mhz")),
        Reading(
            "temperature", _pair(n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU, name="temperature_gpu_celsius")
        ),
        Reading("power", _pair(n.nvmlDeviceGetPowerUsage, name="power_watts", scale=1e-3)),
        Reading("power_limit", _pair(n.nvmlDeviceGetEnforcedPowerLimit, name="power_limit_watts", scale=1e-3)),
        Reading("energy", _pair(n.nvmlDeviceGetTotalEnergyConsumption, name="energy_joules", scale=1e-3)),
        Reading("fan", _pair(n.nvmlDeviceGetFanSpeed, name="fan_speed_percent")),
        Reading("pstate", _pstate),
        Reading("reasons", _pair(reasons, name="throttle_reasons_mask")),
        Reading(
            "ecc_corrected",
            _pair(ecc, n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_AGGREGATE_ECC, name="ecc_corrected_total"),
        ),
        Reading(
            "ecc_uncorrected",
            _pair(ecc, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_AGGREGATE_ECC, name="ecc_uncorrected_total"),
        ),
        Reading(
            "retired_sbe",
            _retired(n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, "retired_pages_sbe_total"),
        ),
        Reading("retired_dbe", _retired(n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, "retired_pages_dbe_total")),
        Reading("retired_pending", _pair(n.nvmlDeviceGetRetiredPagesPendingStatus, name="retired_pages_pending")),
        Reading("row_remap", _row_remap),
        Reading("pcie_gen", _pair(n.nvmlDeviceGetCurrPcieLinkGeneration, name="pcie_link_gen")),
        Reading("pcie_width", _pair(n.nvmlDeviceGetCurrPcieLinkWidth, name="pcie_link_width")),
        Reading("pcie_replay", _pair(n.nvmlDeviceGetPcieReplayCounter, name="pcie_replay_total")),
        Reading(
            "pcie_tx_sampled",
            _pair(sampled, n.NVML_PCIE_UTIL_TX_BYTES, name="pcie_tx_bytes_per_second", scale=KIB),
            after="pcie_counters",
        ),
        Reading(
            "pcie_rx_sampled",
            _pair(sampled, n.NVML_PCIE_UTIL_RX_BYTES, name="pcie_rx_bytes_per_second", scale=KIB),
            after="pcie_counters",
        ),
    )


def limit_readings(n: Any) -> tuple[Reading, ...]:
    """The device's limits, read when the collector opens."""
    max_clock, threshold = n.nvmlDeviceGetMaxClockInfo, n.nvmlDeviceGetTemperatureThreshold
    return (
        Reading("sm_clock_max", _pair(max_clock, n.NVML_CLOCK_SM, name="sm_clock_max_mhz")),
        Reading("graphics_clock_max", _pair(max_clock, n.NVML_CLOCK_GRAPHICS, name="graphics_clock_max_mhz")),
        Reading("memory_clock_max", _pair(max_clock, n.NVML_CLOCK_MEM, name="memory_clock_max_mhz")),
        Reading(
            "temp_shutdown",
            _pair(threshold, n.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, name="temperature_shutdown_celsius"),
        ),
        Reading(
            "temp_slowdown",
            _pair(threshold, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, name="temperature_slowdown_celsius"),
        ),
        Reading(
            "temp_memory_max",
            _pair(threshold, n.NVML_TEMPERATURE_THRESHOLD_MEM_MAX, name="temperature_memory_max_celsius"),
        ),
        Reading(
            "power_default_limit",
            _pair(n.nvmlDeviceGetPowerManagementDefaultLimit, name="power_default_limit_watts", scale=1e-3),
        ),
        Reading("pcie_gen_max", _pair(n.nvmlDeviceGetMaxPcieLinkGeneration, name="pcie_link_gen_max")),
        Reading("pcie_width_max", _pair(n.nvmlDeviceGetMaxPcieLinkWidth, name="pcie_link_width_max")),
    )
