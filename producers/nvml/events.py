"""NVML events (XID, ECC, P-state, power source, MIG reconfiguration, GPU unavailable) as :class:`GpuEvent`.

Emits one ``GpuEvent`` per NVML event, with the XID number (or NVML's event data) as ``code``; its
``dedup_key`` (cluster/node/gpu/kind/code/ts) stays the same however often the message is re-delivered. The event
set is drained without waiting once per sampling round, so an event is stamped with the time of the round that
saw it (NVML's event record carries no time). P-state changes can come in bursts: per GPU and round only the last
is kept (the others are counted as ``coalesced``), XIDs and ECC events are all kept. Clock changes are not
watched: a real H100 raised about 30 a second, idle and busy (tests/testdata/nvml-h100-lent), each would have been
a stored ``gpu_event`` point per GPU and second, and the clocks are in every sample already. Two events
of one round get timestamps one nanosecond apart (round time + position), so two XIDs with the same number in one
round stay two events with two dedup keys.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pipeline.events import EventKind, GpuEvent
from producers.nvml.collector import Device

log = logging.getLogger(__name__)

#: NVML event type bit -> our kind (values from nvml.h, the same in pynvml)
EVENT_KINDS: Final[dict[int, EventKind]] = {
    0x0001: EventKind.ECC_SINGLE_BIT,  # nvmlEventTypeSingleBitEccError
    0x0002: EventKind.ECC_DOUBLE_BIT,  # nvmlEventTypeDoubleBitEccError
    0x0004: EventKind.PSTATE,  # nvmlEventTypePState
    0x0008: EventKind.XID,  # nvmlEventTypeXidCriticalError
    0x0010: EventKind.CLOCK_CHANGE,  # nvmlEventTypeClock
    0x0080: EventKind.POWER_SOURCE,  # nvmlEventTypePowerSourceChange
    0x0100: EventKind.MIG_CONFIG,  # nvmlEventMigConfigChange
    0x0400: EventKind.ROW_REMAP,  # nvmlEventTypeDramRetirementEvent
    0x4000: EventKind.GPU_LOST,  # nvmlEventTypeGpuUnavailableError
}
WATCHED: Final = sum(bit for bit, kind in EVENT_KINDS.items() if kind is not EventKind.CLOCK_CHANGE)
_COALESCED: Final = frozenset({EventKind.PSTATE})
_NO_INSTANCE: Final = 0xFFFFFFFF


@dataclass
class EventStats:
    events: int = 0
    coalesced: int = 0
    #: events whose device we could not tell (counted, not published)
    unknown_device: int = 0
    #: GPUs whose events could not be registered (no event support, e.g. vGPU guests)
    unregistered: int = 0


def to_gpu_event(
    event_type: int,
    data: int,
    device: Device,
    cluster: str,
    node: str,
    ts_ns: int,
    gpu_instance_id: int = _NO_INSTANCE,
) -> GpuEvent | None:
    """The GpuEvent for one NVML event record, or None for a type we do not publish."""
    kind = EVENT_KINDS.get(event_type)
    if kind is None:
        return None
    detail = f"gpu instance {gpu_instance_id}" if gpu_instance_id not in (_NO_INSTANCE, 0) else ""
    code = data if kind is EventKind.XID else 0
    return GpuEvent(cluster, node, device.uuid, device.index, ts_ns, kind, max(0, int(code)), detail)


def handle_key(handle: Any) -> Hashable:
    """A handle's identity: its address for a real NVML handle (ctypes pointer), else the object itself."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        key: Hashable = handle
        return key


class EventWatcher:
    """One NVML event set over the node's physical GPUs; :meth:`drain` once per round."""

    def __init__(self, nvml: Any, cluster: str, node: str, max_per_round: int = 10_000) -> None:
        self._nvml = nvml
        self.cluster, self.node = cluster, node
        self._max = max_per_round
        self._set: Any = None
        self._devices: dict[Hashable, Device] = {}
        self._last_error: int | None = None
        self.stats = EventStats()

    def open(self, devices: Sequence[Device]) -> None:
        n = self._nvml
        self._set = n.nvmlEventSetCreate()
        for device in devices:
            if device.is_mig:
                continue  # MIG events arrive on the parent, with the GPU instance id
            try:
                supported = n.nvmlDeviceGetSupportedEventTypes(device.handle) & WATCHED
                if supported:
                    n.nvmlDeviceRegisterEvents(device.handle, supported, self._set)
            except n.NVMLError as exc:
                self.stats.unregistered += 1
                log.warning("GPU %d: NVML events not available (%s)", device.index, exc)
                continue
            self._devices[handle_key(device.handle)] = device

    def drain(self, ts_ns: int) -> list[GpuEvent]:
        """Every event NVML queued since the last drain (without waiting)."""
        n = self._nvml
        if self._set is None:
            return []
        events: list[GpuEvent] = []
        latest: dict[tuple[str, EventKind], int] = {}
        for _ in range(self._max):
            try:
                record = n.nvmlEventSetWait_v2(self._set, 0)
            except n.NVMLError as exc:
                if exc.value not in (n.NVML_ERROR_TIMEOUT, self._last_error):
                    log.warning("NVML event wait: %s", exc)  # once per kind of failure, not every round
                self._last_error = exc.value
                break
            device = self._devices.get(handle_key(record.device))
            if device is None:
                self.stats.unknown_device += 1
                continue
            event = to_gpu_event(
                record.eventType,
                record.eventData,
                device,
                self.cluster,
                self.node,
                ts_ns,
                getattr(record, "gpuInstanceId", _NO_INSTANCE),
            )
            if event is None:
                continue
            if event.kind in _COALESCED:
                previous = latest.get((event.gpu_uuid, event.kind))
                if previous is not None:
                    events[previous] = event
                    self.stats.coalesced += 1
                    continue
                latest[(event.gpu_uuid, event.kind)] = len(events)
            events.append(event)
        self.stats.events += len(events)
        return [dataclasses.replace(e, ts_ns=ts_ns + i) for i, e in enumerate(events)]

    def close(self) -> None:
        if self._set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._set)
            except self._nvml.NVMLError as exc:
                log.warning("nvmlEventSetFree: %s", exc)
            self._set = None
