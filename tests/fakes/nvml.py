"""A fake NVML whose devices replay real ``nvidia-smi -q -x`` captures (tests/testdata/nvidia-smi-xml).

It looks like the ``pynvml`` module to the collector: the same function names and signatures, the real module's
constants, structures and ``NVMLError`` (unknown attributes are looked up on the real ``pynvml``). Every value a
capture prints as ``N/A`` (or does not contain at all, such as energy, NVLink or PCIe byte counters) raises
``NVMLError(NVML_ERROR_NOT_SUPPORTED)``, like the real library on that board; everything else returns the
capture's value in NVML's units (mW, mJ, bytes, MHz, KB/s).

What a capture cannot say is set by the test, explicitly: NVLink links (:class:`FakeLink`), MIG instances
(:class:`FakeMig`), counters that move between rounds (``gpu.values[...]``), topology between GPUs, and faults:
:meth:`FakeNvml.lose` (GPU_IS_LOST on every call), :meth:`FakeNvml.fail` (an error code on some or all calls of
one device) and :meth:`FakeNvml.inject_event` (an XID or other NVML event for the event set).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pynvml

CAPTURES = Path(__file__).resolve().parent.parent / "testdata" / "nvidia-smi-xml"

_MIB = 2**20
_REASON_BITS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clocks_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}
_VIRTUALIZATION = {"None": 0, "Pass-Through": 1, "VGPU": 2, "Host VGPU": 3}


@dataclass
class FakeProcess:
    pid: int
    name: str
    kind: str  # "C", "G" or "C+G", as nvidia-smi prints it
    used_memory_bytes: int | None


@dataclass
class FakeLink:
    """One NVLink (not in any capture: tests describe them)."""

    remote_bus_id: str
    active: bool = True
    remote_type: int = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    crc_flit: int = 0
    crc_data: int = 0
    replay: int = 0
    recovery: int = 0
    tx_kib: int = 0
    rx_kib: int = 0


@dataclass
class FakeMig:
    """A MIG device (GPU instance + compute instance); no capture has one, tests describe them."""

    uuid: str
    name: str
    gi_id: int
    ci_id: int
    memory_total: int | None  # None: NVML does not report it
    memory_used: int
    processes: list[FakeProcess] = field(default_factory=list)


@dataclass
class FakeGpu:
    """One device: ``values`` maps a reading to its value in NVML's unit, None (or absent) = not supported."""

    name: str
    uuid: str
    pci_bus_id: str
    values: dict[str, Any]
    processes: list[FakeProcess] = field(default_factory=list)
    links: list[FakeLink] = field(default_factory=list)
    migs: list[FakeMig] = field(default_factory=list)
    numa_node: int | None = None
    cpu_affinity: list[int] | None = None
    source: str = ""


@dataclass(frozen=True)
class Handle:
    gpu: int
    mig: int | None = None


# --- capture parsing ---------------------------------------------------------------------------------------

_NOT_A_VALUE = ("N/A", "", "[REDACTED]", "Requested functionality has been deprecated", "Unknown Error")


def _text(el: ET.Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text in _NOT_A_VALUE else text


def _number(el: ET.Element | None, path: str) -> float | None:
    """``350.00 W`` -> 350.0, ``16x`` -> 16, ``P8`` -> 8, ``N/A`` or missing -> None."""
    text = _text(el, path)
    if text is None:
        return None
    match = re.match(r"^P?(-?\d+(?:\.\d+)?)", text)
    return float(match.group(1)) if match else None


def _int(el: ET.Element | None, path: str) -> int | None:
    value = _number(el, path)
    return None if value is None else int(value)


def _yes(el: ET.Element | None, path: str) -> int | None:
    text = _text(el, path)
    return None if text is None else int(text.lower() in ("yes", "active", "enabled"))


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc(gpu: ET.Element, scope: str) -> tuple[int | None, int | None]:
    root = gpu.find(f"ecc_errors/{scope}")
    if root is None:
        return None, None
    if root.find("single_bit") is not None:  # drivers <= 470: per location, with totals
        return _int(root, "single_bit/total"), _int(root, "double_bit/total")
    corrected = _sum([_int(root, "sram_correctable"), _int(root, "dram_correctable")])
    uncorrected = _sum(
        [_int(root, t) for t in ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded")]
        + [_int(root, "dram_uncorrectable")]
    )
    return corrected, uncorrected


def _reasons(gpu: ET.Element) -> int | None:
    root = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if root is None:
        root, prefix = gpu.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    if root is None or len(root) == 0:
        return None
    mask = 0
    for child in root:
        bit = _REASON_BITS.get(child.tag.removeprefix(prefix))
        if bit is not None and (child.text or "").strip() == "Active":
            mask |= bit
    return mask


def _mib(el: ET.Element | None, path: str) -> int | None:
    value = _number(el, path)
    return None if value is None else int(value) * _MIB


def _milli(el: ET.Element | None, *paths: str) -> int | None:
    value = _first(*(_number(el, p) for p in paths))
    return None if value is None else round(value * 1000)


def _processes(gpu: ET.Element) -> list[FakeProcess]:
    out = []
    for p in gpu.findall("processes/process_info"):
        pid = _int(p, "pid")
        assert pid is not None
        name = (p.findtext("process_name") or "").strip()
        out.append(FakeProcess(pid, name, (p.findtext("type") or "C").strip(), _mib(p, "used_memory")))
    return out


def gpu_from_xml(gpu: ET.Element, source: str = "") -> FakeGpu:
    """What NVML would answer for one ``<gpu>`` element of a capture."""
    pci, temp, link = gpu.find("pci"), gpu.find("temperature"), gpu.find("pci/pci_gpu_link_info")
    power = gpu.find("power_readings")
    if power is None:
        power = gpu.find("gpu_power_readings")
    mem, clocks, max_clocks = gpu.find("fb_memory_usage"), gpu.find("clocks"), gpu.find("max_clocks")
    remap = gpu.find("remapped_rows")
    remap_values = (
        None
        if remap is None or _text(remap, "remapped_row_corr") is None
        else (
            _int(remap, "remapped_row_corr"),
            _int(remap, "remapped_row_unc"),
            _yes(remap, "remapped_row_pending"),
            _yes(remap, "remapped_row_failure"),
        )
    )
    ecc_mode = _text(gpu, "ecc_mode/current_ecc")
    agg_corrected, agg_uncorrected = _ecc(gpu, "aggregate")
    mig = _text(gpu, "mig_mode/current_mig")
    values: dict[str, Any] = {
        "util.gpu": _int(gpu, "utilization/gpu_util"),
        "util.memory": _int(gpu, "utilization/memory_util"),
        "mem.total": _mib(mem, "total"),
        "mem.reserved": _mib(mem, "reserved"),
        "mem.used": _mib(mem, "used"),
        "mem.free": _mib(mem, "free"),
        "clock.graphics": _int(clocks, "graphics_clock"),
        "clock.sm": _int(clocks, "sm_clock"),
        "clock.mem": _int(clocks, "mem_clock"),
        "maxclock.graphics": _int(max_clocks, "graphics_clock"),
        "maxclock.sm": _int(max_clocks, "sm_clock"),
        "maxclock.mem": _int(max_clocks, "mem_clock"),
        "temp.gpu": _int(temp, "gpu_temp"),
        "temp.memory": _int(temp, "memory_temp"),
        "threshold.shutdown": _int(temp, "gpu_temp_max_threshold"),
        "threshold.slowdown": _int(temp, "gpu_temp_slow_threshold"),
        "threshold.gpu_max": _int(temp, "gpu_temp_max_gpu_threshold"),
        "threshold.mem_max": _int(temp, "gpu_temp_max_mem_threshold"),
        "temp.margin": _int(temp, "gpu_temp_tlimit"),
        "tlimit.shutdown": _int(temp, "gpu_temp_max_tlimit_threshold"),
        "tlimit.slowdown": _int(temp, "gpu_temp_slow_tlimit_threshold"),
        "tlimit.gpu_max": _int(temp, "gpu_temp_max_gpu_tlimit_threshold"),
        "tlimit.mem_max": _int(temp, "gpu_temp_max_mem_tlimit_threshold"),
        # NVML: 1 s average on Ampere+ (newer drivers print it as average_power_draw), instantaneous before
        "power.usage_mw": _milli(power, "power_draw", "average_power_draw", "instant_power_draw"),
        "power.enforced_mw": _milli(power, "enforced_power_limit", "current_power_limit"),
        "power.default_mw": _milli(power, "default_power_limit"),
        "fan": _int(gpu, "fan_speed"),
        "pstate": _int(gpu, "performance_state"),
        "reasons": _reasons(gpu),
        "ecc.mode": None if ecc_mode is None else int(ecc_mode == "Enabled"),
        "ecc.corrected": agg_corrected,
        "ecc.uncorrected": agg_uncorrected,
        "retired.sbe": _int(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
        "retired.dbe": _int(gpu, "retired_pages/double_bit_retirement/retired_count"),
        "retired.pending": _yes(gpu, "retired_pages/pending_retirement"),
        "remap": remap_values,
        "pcie.gen": _int(link, "pcie_gen/current_link_gen"),
        "pcie.gen_max": _int(link, "pcie_gen/max_link_gen"),
        "pcie.width": _int(link, "link_widths/current_link_width"),
        "pcie.width_max": _int(link, "link_widths/max_link_width"),
        "pcie.replay": _int(pci, "replay_counter"),
        "pcie.tx_kbs": _int(pci, "tx_util"),
        "pcie.rx_kbs": _int(pci, "rx_util"),
        "virt": _VIRTUALIZATION.get(_text(gpu, "gpu_virtualization_mode/virtualization_mode") or ""),
        "mig.current": None if mig is None else int(mig == "Enabled"),
    }
    name = _text(gpu, "product_name") or "Unknown"
    uuid = _text(gpu, "uuid") or ""
    bus_id = _text(pci, "pci_bus_id") or gpu.get("id", "")
    return FakeGpu(name, uuid, bus_id, values, _processes(gpu), source=source)


def load_capture(name: str) -> list[FakeGpu]:
    """Every GPU of one capture file (e.g. ``"rtx-3090-v12.xml"``)."""
    root = ET.parse(CAPTURES / name).getroot()
    return [gpu_from_xml(g, name) for g in root.findall("gpu")]


def capture_names() -> list[str]:
    return sorted(p.name for p in CAPTURES.glob("*.xml"))


def all_captures() -> Iterator[tuple[str, list[FakeGpu]]]:
    for name in capture_names():
        yield name, load_capture(name)


# --- the fake module ---------------------------------------------------------------------------------------


class _EventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # gpu index -> event mask


class FakeNvml:
    """Module-like fake of ``pynvml`` over a list of :class:`FakeGpu` (index = position in the list)."""

    def __init__(self, gpus: list[FakeGpu], topology: dict[tuple[int, int], int] | None = None) -> None:
        self.gpus = gpus
        self.topology = topology or {}
        self.initialized = False
        self.lost: set[int] = set()
        self.failures: dict[int, tuple[int, frozenset[str] | None]] = {}
        self.events: list[tuple[int, int, int]] = []  # (gpu index, event type, data)
        self.event_sets: list[_EventSet] = []
        #: when a list, every device call is appended as (function name, args) -- the benchmark replays it
        self.record: list[tuple[str, tuple[Any, ...]]] | None = None

    def __getattr__(self, name: str) -> Any:
        # constants, structures and NVMLError come from the real module, so codes and classes are identical
        return getattr(pynvml, name)

    # --- fault injection ---
    def lose(self, index: int) -> None:
        """From now on every call on this GPU raises GPU_IS_LOST (it fell off the bus)."""
        self.lost.add(index)

    def fail(self, index: int, code: int, functions: set[str] | None = None) -> None:
        """Calls on this GPU (all, or only ``functions``) raise ``code`` until :meth:`heal`."""
        self.failures[index] = (code, frozenset(functions) if functions else None)

    def heal(self, index: int) -> None:
        self.failures.pop(index, None)
        self.lost.discard(index)

    def inject_event(self, index: int, event_type: int, data: int = 0) -> None:
        self.events.append((index, event_type, data))

    # --- helpers ---
    @staticmethod
    def _error(code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def _gpu(self, handle: Handle, function: str, args: tuple[Any, ...] = ()) -> FakeGpu:
        if not self.initialized:
            raise self._error(pynvml.NVML_ERROR_UNINITIALIZED)
        if self.record is not None:
            self.record.append((function, (handle, *args)))
        if handle.gpu in self.lost:
            raise self._error(pynvml.NVML_ERROR_GPU_IS_LOST)
        failure = self.failures.get(handle.gpu)
        if failure is not None and (failure[1] is None or function in failure[1]):
            raise self._error(failure[0])
        return self.gpus[handle.gpu]

    def _value(self, handle: Handle, key: str, function: str, args: tuple[Any, ...] = ()) -> Any:
        gpu = self._gpu(handle, function, args)
        if handle.mig is not None:  # MIG devices answer only what FakeMig models
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        value = gpu.values.get(key)
        if value is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _mig(self, handle: Handle) -> FakeMig | None:
        if handle.mig is None:
            return None
        migs = self.gpus[handle.gpu].migs
        if handle.mig >= len(migs):  # a MIG device destroyed since the handle was taken
            raise self._error(pynvml.NVML_ERROR_NOT_FOUND)
        return migs[handle.mig]

    # --- library ---
    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return "fake"

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise self._error(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < self.nvmlDeviceGetCount():
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    # --- identity ---
    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        mig = self._mig(handle)
        return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetName(self, handle: Handle) -> bytes:
        gpu = self._gpu(handle, "nvmlDeviceGetName")
        mig = self._mig(handle)
        return (mig.name if mig else gpu.name).encode()

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self._gpu(handle, "nvmlDeviceGetIndex")
        return handle.gpu

    def nvmlDeviceGetPciInfo_v3(self, handle: Handle) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo_v3")
        return SimpleNamespace(busId=gpu.pci_bus_id.encode())

    def nvmlDeviceGetVirtualizationMode(self, handle: Handle) -> int:
        return int(self._value(handle, "virt", "nvmlDeviceGetVirtualizationMode"))

    # --- MIG ---
    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        current = self._value(handle, "mig.current", "nvmlDeviceGetMigMode")
        return [current, current]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        self._value(handle, "mig.current", "nvmlDeviceGetMaxMigDeviceCount")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex", (index,))
        if index >= len(gpu.migs):
            raise self._error(pynvml.NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gi_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        self._gpu(handle, "nvmlDeviceGetComputeInstanceId")
        mig = self._mig(handle)
        if mig is None:
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return mig.ci_id

    # --- readings ---
    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        gpu = self._value(handle, "util.gpu", "nvmlDeviceGetUtilizationRates")
        memory = self.gpus[handle.gpu].values.get("util.memory")
        if memory is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> SimpleNamespace:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo", (version,))
        mig = self._mig(handle)
        if mig is not None:
            if mig.memory_total is None:
                raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            free = mig.memory_total - mig.memory_used
            info = SimpleNamespace(total=mig.memory_total, used=mig.memory_used, free=free)
            if version:
                info.reserved = 0
            return info
        v = gpu.values
        if v.get("mem.total") is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if version and v.get("mem.reserved") is None:
            # drivers before 510 have no nvmlDeviceGetMemoryInfo_v2
            raise self._error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        info = SimpleNamespace(total=v["mem.total"], used=v["mem.used"], free=v["mem.free"])
        if version:
            info.reserved = v["mem.reserved"]
        return info

    _CLOCKS: ClassVar[dict[int, str]] = {
        pynvml.NVML_CLOCK_GRAPHICS: "graphics",
        pynvml.NVML_CLOCK_SM: "sm",
        pynvml.NVML_CLOCK_MEM: "mem",
    }

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:
        return int(self._value(handle, f"clock.{self._CLOCKS[clock]}", "nvmlDeviceGetClockInfo", (clock,)))

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, clock: int) -> int:
        return int(self._value(handle, f"maxclock.{self._CLOCKS[clock]}", "nvmlDeviceGetMaxClockInfo", (clock,)))

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return int(self._value(handle, "temp.gpu", "nvmlDeviceGetTemperature", (sensor,)))

    _THRESHOLDS: ClassVar[dict[int, str]] = {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: "shutdown",
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "slowdown",
        pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "gpu_max",
        pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: "mem_max",
    }

    def nvmlDeviceGetTemperatureThreshold(self, handle: Handle, threshold: int) -> int:
        key = f"threshold.{self._THRESHOLDS[threshold]}"
        return int(self._value(handle, key, "nvmlDeviceGetTemperatureThreshold", (threshold,)))

    def nvmlDeviceGetMarginTemperature(self, handle: Handle) -> int:
        return int(self._value(handle, "temp.margin", "nvmlDeviceGetMarginTemperature"))

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return int(self._value(handle, "power.usage_mw", "nvmlDeviceGetPowerUsage"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        return int(self._value(handle, "power.enforced_mw", "nvmlDeviceGetEnforcedPowerLimit"))

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Handle) -> int:
        return int(self._value(handle, "power.default_mw", "nvmlDeviceGetPowerManagementDefaultLimit"))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        return int(self._value(handle, "energy_mj", "nvmlDeviceGetTotalEnergyConsumption"))

    def nvmlDeviceGetFanSpeed(self, handle: Handle) -> int:
        return int(self._value(handle, "fan", "nvmlDeviceGetFanSpeed"))

    def nvmlDeviceGetPerformanceState(self, handle: Handle) -> int:
        return int(self._value(handle, "pstate", "nvmlDeviceGetPerformanceState"))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        return int(self._value(handle, "reasons", "nvmlDeviceGetCurrentClocksEventReasons"))

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors", (error_type, counter_type))
        assert counter_type == pynvml.NVML_AGGREGATE_ECC, "the captures' aggregate counts are modelled"
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        value = gpu.values.get("ecc.corrected" if corrected else "ecc.uncorrected")
        if handle.mig is not None or not gpu.values.get("ecc.mode") or value is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no ECC, or ECC disabled: no counters
        return int(value)

    def nvmlDeviceGetRetiredPages(self, handle: Handle, cause: int) -> list[int]:
        sbe = cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        count = self._value(handle, "retired.sbe" if sbe else "retired.dbe", "nvmlDeviceGetRetiredPages", (cause,))
        return [0x1000 * (i + 1) for i in range(count)]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        return int(self._value(handle, "retired.pending", "nvmlDeviceGetRetiredPagesPendingStatus"))

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        value: tuple[int, int, int, int] = self._value(handle, "remap", "nvmlDeviceGetRemappedRows")
        return value

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Handle) -> int:
        return int(self._value(handle, "pcie.gen", "nvmlDeviceGetCurrPcieLinkGeneration"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Handle) -> int:
        return int(self._value(handle, "pcie.gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Handle) -> int:
        return int(self._value(handle, "pcie.width", "nvmlDeviceGetCurrPcieLinkWidth"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Handle) -> int:
        return int(self._value(handle, "pcie.width_max", "nvmlDeviceGetMaxPcieLinkWidth"))

    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int:
        return int(self._value(handle, "pcie.replay", "nvmlDeviceGetPcieReplayCounter"))

    def nvmlDeviceGetPcieThroughput(self, handle: Handle, counter: int) -> int:
        key = "pcie.tx_kbs" if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else "pcie.rx_kbs"
        return int(self._value(handle, key, "nvmlDeviceGetPcieThroughput", (counter,)))

    # --- field values ---
    def _field(self, gpu: FakeGpu, handle: Handle, field_id: int, scope: int) -> Any:
        if handle.mig is not None:
            return None
        v = gpu.values
        simple = {
            pynvml.NVML_FI_DEV_MEMORY_TEMP: "temp.memory",
            pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: "pcie.tx_bytes",
            pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: "pcie.rx_bytes",
            pynvml.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT: "tlimit.shutdown",
            pynvml.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT: "tlimit.slowdown",
            pynvml.NVML_FI_DEV_TEMPERATURE_GPU_MAX_TLIMIT: "tlimit.gpu_max",
            pynvml.NVML_FI_DEV_TEMPERATURE_MEM_MAX_TLIMIT: "tlimit.mem_max",
        }
        if field_id in simple:
            return v.get(simple[field_id])
        if field_id in (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            if scope >= len(gpu.links):
                return None
            link = gpu.links[scope]
            return link.tx_kib if field_id == pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else link.rx_kib
        return None

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[Any]) -> list[SimpleNamespace]:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues", (list(field_ids),))
        out = []
        for item in field_ids:
            field_id, scope = item if isinstance(item, tuple) else (item, 0)
            value = self._field(gpu, handle, field_id, scope)
            signed = isinstance(value, int) and value < 0
            out.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    timestamp=0,
                    latencyUsec=0,
                    nvmlReturn=pynvml.NVML_SUCCESS if value is not None else pynvml.NVML_ERROR_NOT_SUPPORTED,
                    valueType=pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG
                    if signed
                    else pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                    value=SimpleNamespace(sllVal=value or 0, ullVal=value or 0, dVal=0.0, uiVal=0, siVal=0, ulVal=0),
                )
            )
        return out

    # --- NVLink ---
    def _link(self, handle: Handle, link: int, function: str, args: tuple[Any, ...] = ()) -> FakeLink:
        gpu = self._gpu(handle, function, (link, *args))
        if handle.mig is not None or not gpu.links:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.links):
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        active = self._link(handle, link, "nvmlDeviceGetNvLinkState").active
        return pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Handle, link: int, counter: int) -> int:
        fake = self._link(handle, link, "nvmlDeviceGetNvLinkErrorCounter", (counter,))
        return {
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: fake.crc_flit,
            pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: fake.crc_data,
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: fake.replay,
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: fake.recovery,
        }[counter]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Handle, link: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._link(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo").remote_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        return self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").remote_type

    # --- processes ---
    def _procs(self, handle: Handle, function: str, kinds: tuple[str, ...]) -> list[SimpleNamespace]:
        gpu = self._gpu(handle, function)
        mig = self._mig(handle)
        procs = mig.processes if mig else gpu.processes
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_memory_bytes, gpuInstanceId=0, computeInstanceId=0)
            for p in procs
            if p.kind in kinds
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        return self._procs(handle, "nvmlDeviceGetComputeRunningProcesses", ("C", "C+G"))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        return self._procs(handle, "nvmlDeviceGetGraphicsRunningProcesses", ("G", "C+G"))

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        for gpu in self.gpus:
            for p in [*gpu.processes, *(q for m in gpu.migs for q in m.processes)]:
                if p.pid == pid:
                    return p.name.encode()
        raise self._error(pynvml.NVML_ERROR_NOT_FOUND)

    # --- events ---
    def nvmlEventSetCreate(self) -> _EventSet:
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self.event_sets.remove(event_set)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        mask = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeClock
        if gpu.values.get("ecc.mode"):
            mask |= pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
        if gpu.values.get("mig.current") is not None:
            mask |= pynvml.nvmlEventMigConfigChange
        return mask

    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: _EventSet) -> None:
        supported = self.nvmlDeviceGetSupportedEventTypes(handle)
        if event_types & ~supported:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set.registered[handle.gpu] = event_set.registered.get(handle.gpu, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> SimpleNamespace:
        for i, (index, event_type, data) in enumerate(self.events):
            if event_set.registered.get(index, 0) & event_type:
                del self.events[i]
                return SimpleNamespace(
                    device=Handle(index), eventType=event_type, eventData=data, gpuInstanceId=0, computeInstanceId=0
                )
        raise self._error(pynvml.NVML_ERROR_TIMEOUT)

    # --- topology ---
    def nvmlDeviceGetTopologyCommonAncestor(self, a: Handle, b: Handle) -> int:
        self._gpu(a, "nvmlDeviceGetTopologyCommonAncestor", (b,))
        self._gpu(b, "nvmlDeviceGetTopologyCommonAncestor", (a,))
        level = self.topology.get((min(a.gpu, b.gpu), max(a.gpu, b.gpu)))
        if level is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return level

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNumaNodeId")
        if gpu.numa_node is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    def nvmlDeviceGetCpuAffinity(self, handle: Handle, words: int) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetCpuAffinity", (words,))
        if gpu.cpu_affinity is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (gpu.cpu_affinity + [0] * words)[:words]
