"""An NVML that replays ``nvidia-smi -q -x`` captures: ``pynvml``'s functions over :class:`CapturedGpu` s.

It looks like the ``pynvml`` module to the collector: the same function names and signatures, the real module's
constants, structures and ``NVMLError`` (unknown attributes are looked up on the real ``pynvml``). Every value a
capture prints as ``N/A`` raises ``NVMLError(NVML_ERROR_NOT_SUPPORTED)``, like the real library on that board.

Faults can be scripted for tests: :meth:`ReplayNvml.lose` (GPU_IS_LOST on every call), :meth:`ReplayNvml.fail` (an
error code on some or all calls of one device) and :meth:`ReplayNvml.inject_event` (an XID or other NVML event).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import pynvml

from producers.nvml.capture import CapturedGpu, CapturedLink, CapturedMig, Handle


class _EventSet:
    def __init__(self) -> None:
        self.registered: dict[int, int] = {}  # gpu index -> event mask


class ReplayNvml:
    """Module-like fake of ``pynvml`` over a list of :class:`CapturedGpu` (index = position in the list)."""

    def __init__(self, gpus: list[CapturedGpu], topology: dict[tuple[int, int], int] | None = None) -> None:
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

    def _gpu(self, handle: Handle, function: str, args: tuple[Any, ...] = ()) -> CapturedGpu:
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
        if handle.mig is not None:  # MIG devices answer only what CapturedMig models
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        value = gpu.values.get(key)
        if value is None:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _mig(self, handle: Handle) -> CapturedMig | None:
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
    def _field(self, gpu: CapturedGpu, handle: Handle, field_id: int, scope: int) -> Any:
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
    def _link(self, handle: Handle, link: int, function: str, args: tuple[Any, ...] = ()) -> CapturedLink:
        gpu = self._gpu(handle, function, (link, *args))
        if handle.mig is not None or not gpu.links:
            raise self._error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(gpu.links):
            raise self._error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        active = self._link(handle, link, "nvmlDeviceGetNvLinkState").active
        state: int = pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED
        return state

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
        mask: int = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeClock
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
