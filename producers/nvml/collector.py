"""The NVML collector: reads every GPU (and MIG instance) of this node through NVML into :class:`GpuSample`.

Emits, per GPU and round, the METRIC_FIELDS the device supports (utilization, memory used/total/reserved, SM /
graphics / memory clocks and their maxima, GPU and memory temperature with slowdown/shutdown thresholds, power
draw / enforced limit / default limit, energy, fan, P-state, the clock-event reasons mask, ECC totals, retired
pages, row remapping, PCIe generation/width (current and max), PCIe TX/RX throughput and replay counter, NVLink
state, per-link throughput and error counters; with an :class:`~producers.nvml.aer.AerReader`, the PCIe AER counters
of each GPU's link from sysfs), the running processes with their GPU memory, and a
``GPU_LOST`` :class:`GpuEvent` the first time NVML answers ``GPU_IS_LOST`` for a device.

NVML is injected (the real ``pynvml`` module in production, a fake in tests): no global state, and never
``nvidia-smi``. Rules that make its output trustworthy:

- *Absent, never zero.* A reading NVML answers NOT_SUPPORTED (or FUNCTION_NOT_FOUND, INVALID_ARGUMENT,
  NO_PERMISSION) for is cached per device and never asked again; its field is simply missing. A limit of 0 (a
  vGPU guest's max clocks) is not a limit and is left out. In a vGPU guest (virtualization mode VGPU) NVML
  reports 0 for temperature and clocks instead of NOT_SUPPORTED (tests/testdata/nvidia-smi-xml/tesla_p4.xml),
  so those readings are not asked there.
- *One bad GPU does not stop the others.* A transient NVML error (UNKNOWN, TIMEOUT, ...) leaves that field out
  for that round and is counted; GPU_IS_LOST marks the device lost (one event) and the rest keep being read.
- *Rates from counter deltas.* PCIe bytes (NVML field counters) and NVLink bytes per link give rates from the
  second round on; the first round has none. Where the PCIe byte counters are not supported, NVML's sampled
  throughput (``nvmlDeviceGetPcieThroughput``, a 20 ms window per call, so 40 ms of wall time per GPU) is used
  unless disabled.
- *Costly readings less often.* In rounds 2-4 (the first in steady state) the CPU time of each reading is
  measured (``time.thread_time_ns``: this thread's, so a busy machine does not inflate it); one whose cheapest of
  the three reads costs more than :class:`Costly`'s bound (so one slow read does not count) is read every
  ``Costly.every`` rounds from then on, and its field is absent in the rounds between (absent, never stale). On a
  real H100 (driver 580.159.04, in a virtual machine) the total energy counter cost 3.9 ms of CPU per read, 85 %
  of the collector's cost, and the PCIe replay counter 0.17 ms (tests/testdata/nvml-h100-lent); the judged
  counters' rises are taken against their last known value (processors/detectors/gpus.py), so a replay storm is
  still seen. The batched field values (PCIe and NVLink byte counters, whose rates the detectors judge per row)
  are read every round.
- *Limits once.* Maxima, thresholds, default power limit and max PCIe link are read when the collector opens;
  the enforced power limit is read every round (operators and power capping change it). On Ada and later boards
  that report thermal thresholds only relative to T.Limit, the absolute slowdown/shutdown temperatures are
  derived from the T.Limit margin and offsets (rtx-4000-sff-ada-v13.xml).
- *MIG.* With MIG enabled, each MIG device is a sample of its own (``MIG-...`` uuid, model naming the profile,
  the parent's index); its memory total comes from the GPU catalogue's profile when NVML does not say.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline import catalogue
from pipeline.events import EventKind, GpuEvent, GpuProcess, GpuSample, NvLinkSample
from producers.nvml.aer import AerReader
from producers.nvml.readings import KIB, Reading, limit_readings, readings, sysfs_bus_id, text
from producers.rates import CounterRates

log = logging.getLogger(__name__)

#: a reading that failed transiently this round (kept apart from "no value")
_FAILED: Final = object()


@dataclass(frozen=True, slots=True)
class Costly:
    """A reading that costs more than ``read_us`` of CPU per read (its cheapest in the timed rounds) is read every
    ``every`` rounds (the settings: ``collector.costly_read_us`` and ``costly_read_interval_s``)."""

    read_us: float
    every: int


class GpuLost(Exception):
    """NVML answered GPU_IS_LOST (or GPU_NOT_FOUND) for a device: it fell off the bus."""


@dataclass
class Device:
    """A GPU or MIG instance as the collector knows it; everything learned about it is cached here."""

    handle: Any
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    parent_uuid: str | None = None
    gpu_instance_id: int | None = None
    virtual: bool = False
    limits: dict[str, float] = field(default_factory=dict)
    #: readings NVML does not support on this device: never asked again
    unsupported: set[str] = field(default_factory=set)
    #: NVML field-value ids (id, scope) still worth asking for
    fields: list[tuple[int, int]] = field(default_factory=list)
    links: tuple[int, ...] = ()
    remote_bus: dict[int, str] = field(default_factory=dict)
    remote_type: dict[int, int] = field(default_factory=dict)
    process_names: dict[int, str] = field(default_factory=dict)
    #: the readings still worth asking for (recomputed when ``unsupported`` grows)
    active: tuple[Reading, ...] | None = None
    #: per NVLink: the cache keys of its state and error-counter readings
    link_keys: dict[int, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    lost: bool = False
    #: rounds read so far
    rounds: int = 0
    #: each reading's cheapest read in the timed rounds (CPU µs), and those over ``Costly.read_us``: read less often
    costs: dict[str, float] = field(default_factory=dict)
    costly: dict[str, float] = field(default_factory=dict)

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None


@dataclass
class CollectorStats:
    rounds: int = 0
    samples: int = 0
    #: transient NVML errors (that field was left out of that round)
    nvml_errors: int = 0
    #: (device, reading) pairs found unsupported, cached and not asked again
    unsupported: int = 0
    lost_gpus: int = 0
    #: device rounds that produced no value at all (not published)
    empty_samples: int = 0
    #: (device, reading) pairs read only every ``Costly.every`` rounds for their CPU cost
    costly_readings: int = 0


#: what a vGPU guest reports as 0 instead of NOT_SUPPORTED
_VGPU_BLIND: Final = frozenset(
    {
        "temperature",
        "sm_clock",
        "graphics_clock",
        "memory_clock",
        "sm_clock_max",
        "graphics_clock_max",
        "memory_clock_max",
    }
)
#: the rounds in which each reading's CPU time is measured (the first is the second round: steady state)
_TIMED_ROUNDS: Final = (2, 3, 4)
_NVLINK_COUNTERS: Final = (
    ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
)


class NvmlCollector:
    """Reads this node's GPUs through an injected NVML module; :meth:`open` first, then :meth:`collect` per round."""

    def __init__(
        self,
        nvml: Any,
        cluster: str,
        node: str,
        *,
        pcie_throughput_fallback: bool = True,
        processes: bool = True,
        aer: AerReader | None = None,
        costly: Costly | None = None,
        clock: Callable[[], int] = time.thread_time_ns,
    ) -> None:
        """``costly``: how often a reading that cost more than its bound of CPU is read (None: every reading every
        round); ``clock``: CPU nanoseconds of this thread (a fake in tests)."""
        self._nvml = nvml
        self._aer = aer
        self._costly_us, self._costly_every = (costly.read_us, costly.every) if costly else (math.inf, 1)
        self._clock = clock
        self.cluster, self.node = cluster, node
        self._pcie_fallback = pcie_throughput_fallback
        self._processes = processes
        self._devices: list[Device] = []
        self._readings = readings(nvml)
        self._limit_readings = limit_readings(nvml)
        self._nvlink_state = nvml.nvmlDeviceGetNvLinkState
        self._nvlink_errors = nvml.nvmlDeviceGetNvLinkErrorCounter
        self._nvlink_counters = tuple(getattr(nvml, constant) for _, constant in _NVLINK_COUNTERS)
        self._enabled = nvml.NVML_FEATURE_ENABLED
        self._success = nvml.NVML_SUCCESS
        self._get_fields = nvml.nvmlDeviceGetFieldValues
        #: which member of the nvmlValue_t union holds a field value of each type
        self._value_member = {
            nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        }
        self._rates = CounterRates()
        self.stats = CollectorStats()
        n = nvml
        self._permanent = frozenset(
            getattr(n, name)
            for name in (
                "NVML_ERROR_NOT_SUPPORTED",
                "NVML_ERROR_FUNCTION_NOT_FOUND",
                "NVML_ERROR_INVALID_ARGUMENT",
                "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
                "NVML_ERROR_DEPRECATED",
                "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
            )
            if hasattr(n, name)
        )
        self._lost_codes = frozenset(
            getattr(n, name) for name in ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_GPU_NOT_FOUND") if hasattr(n, name)
        )
        self._field_ids = {
            "memory_temp": n.NVML_FI_DEV_MEMORY_TEMP,
            "pcie_tx": n.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
            "pcie_rx": n.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
            "nvlink_tx": n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            "nvlink_rx": n.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        }

    # --- lifecycle ---------------------------------------------------------------------------------------
    def open(self) -> None:
        """Initialise NVML and learn every device (raises the NVMLError if NVML itself cannot start)."""
        n = self._nvml
        n.nvmlInit()
        self._devices = []
        for index in range(n.nvmlDeviceGetCount()):
            try:
                device = self._open_device(index)
            except (n.NVMLError, GpuLost) as exc:
                # a GPU that is already gone cannot be named; the others are still worth reading
                log.error("GPU %d cannot be opened (%s): skipped", index, exc)
                continue
            self._devices.append(device)
            self._devices.extend(self._safe_mig_devices(device))
        migs = sum(d.is_mig for d in self._devices)
        log.info("NVML: %d GPUs, %d MIG devices", len(self._devices) - migs, migs)

    def close(self) -> None:
        if self._aer is not None:
            self._aer.close()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.warning("nvmlShutdown: %s", exc)

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(self._devices)

    def _open_device(self, index: int) -> Device:
        n = self._nvml
        handle = n.nvmlDeviceGetHandleByIndex(index)
        device = Device(
            handle,
            index,
            text(n.nvmlDeviceGetUUID(handle)),
            text(n.nvmlDeviceGetName(handle)),
            sysfs_bus_id(n.nvmlDeviceGetPciInfo_v3(handle).busId),
        )
        mode = self._plain(device, "virtualization", n.nvmlDeviceGetVirtualizationMode, handle)
        if mode == n.NVML_GPU_VIRTUALIZATION_MODE_VGPU:
            device.virtual = True
            device.unsupported |= _VGPU_BLIND
            device.active = None
        device.fields = [(self._field_ids[k], 0) for k in ("memory_temp", "pcie_tx", "pcie_rx")]
        device.limits = self._read_limits(device)
        self._open_links(device)
        return device

    def _mig_devices(self, parent: Device) -> list[Device]:
        n = self._nvml
        mode = self._plain(parent, "mig_mode", n.nvmlDeviceGetMigMode, parent.handle)
        if mode is None or mode is _FAILED or mode[0] != n.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for i in range(n.nvmlDeviceGetMaxMigDeviceCount(parent.handle)):
            try:
                handle = n.nvmlDeviceGetMigDeviceHandleByIndex(parent.handle, i)
            except n.NVMLError as exc:
                if exc.value == n.NVML_ERROR_NOT_FOUND:  # an empty slot
                    continue
                raise
            mig = Device(
                handle,
                parent.index,
                text(n.nvmlDeviceGetUUID(handle)),
                text(n.nvmlDeviceGetName(handle)),
                parent.pci_bus_id,
                parent_uuid=parent.uuid,
            )
            gi = self._plain(mig, "gpu_instance_id", n.nvmlDeviceGetGpuInstanceId, handle)
            mig.gpu_instance_id = gi if isinstance(gi, int) else None
            mig.limits = _mig_limits(parent.model, mig.model)
            out.append(mig)
        return out

    def _safe_mig_devices(self, parent: Device) -> list[Device]:
        try:
            return self._mig_devices(parent)
        except (self._nvml.NVMLError, GpuLost) as exc:
            log.error("GPU %d: MIG devices cannot be listed (%s); the GPU itself is still read", parent.index, exc)
            return []

    def refresh_mig(self) -> bool:
        """Re-read the MIG layout (after a MIG_CONFIG event); returns True when it changed."""
        before = {d.uuid for d in self._devices if d.is_mig}
        physical = [d for d in self._devices if not d.is_mig]
        devices: list[Device] = []
        for device in physical:
            devices.append(device)
            if not device.lost:
                devices.extend(self._safe_mig_devices(device))
        self._devices = devices
        return before != {d.uuid for d in devices if d.is_mig}

    # --- NVML calls --------------------------------------------------------------------------------------
    def _plain(self, device: Device, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML call: its value, None when unsupported (cached), _FAILED when it failed this time."""
        if key in device.unsupported:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            return self._failed(device, key, exc, getattr(fn, "__name__", key))

    def _failed(self, device: Device, key: str, exc: Any, what: str) -> Any:
        code = exc.value
        if code in self._lost_codes:
            raise GpuLost(f"{what}: {exc}") from exc
        if code in self._permanent:
            self._unsupported(device, key)
            self.stats.unsupported += 1
            return None
        self.stats.nvml_errors += 1
        return _FAILED

    @staticmethod
    def _unsupported(device: Device, key: str) -> None:
        device.unsupported.add(key)
        device.active = None

    def _wanted(self, device: Device, reading: Reading) -> bool:
        if reading.key in device.unsupported:
            return False
        if reading.after is None:
            return True
        return reading.after in device.unsupported and (reading.after != "pcie_counters" or self._pcie_fallback)

    def _read(self, device: Device, reading: Reading, out: dict[str, float]) -> None:
        try:
            out.update(reading.read(device.handle))
        except self._nvml.NVMLError as exc:
            self._failed(device, reading.key, exc, reading.key)

    def _said_costly(self, device: Device) -> None:
        """Counts and logs once what the timed rounds found costly on ``device``."""
        if not device.costly:
            return
        self.stats.costly_readings += len(device.costly)
        costs = ", ".join(f"{key} {us:,.0f} µs" for key, us in device.costly.items())
        log.info(
            "GPU %d (%s): %s of CPU per read (over %.0f µs): read every %d rounds",
            device.index,
            device.uuid,
            costs,
            self._costly_us,
            self._costly_every,
        )

    def _timed_read(self, device: Device, reading: Reading, out: dict[str, float]) -> None:
        """:meth:`_read`, keeping the cheapest CPU time the reading took in the timed rounds."""
        start = self._clock()
        self._read(device, reading, out)
        spent_us = (self._clock() - start) / 1e3
        if reading.key not in device.unsupported:
            device.costs[reading.key] = min(spent_us, device.costs.get(reading.key, spent_us))

    def _read_limits(self, device: Device) -> dict[str, float]:
        limits: dict[str, float] = {}
        for reading in self._limit_readings:
            if self._wanted(device, reading):
                self._read(device, reading, limits)
        # a limit of 0 is "not reported" (a vGPU guest's max clocks), not a limit
        limits = {k: float(v) for k, v in limits.items() if v > 0}
        if "temperature_slowdown_celsius" not in limits or "temperature_shutdown_celsius" not in limits:
            limits |= {k: v for k, v in self._tlimit_thresholds(device).items() if k not in limits}
        return limits

    def _tlimit_thresholds(self, device: Device) -> dict[str, float]:
        """Absolute thresholds from T.Limit: margin = T.Limit - temperature, offsets relative to T.Limit."""
        n = self._nvml
        margin = self._plain(device, "temp_margin", n.nvmlDeviceGetMarginTemperature, device.handle)
        current = self._plain(device, "temperature", n.nvmlDeviceGetTemperature, device.handle, n.NVML_TEMPERATURE_GPU)
        if not isinstance(margin, int) or not isinstance(current, int):
            return {}
        ids = [(n.NVML_FI_DEV_TEMPERATURE_SLOWDOWN_TLIMIT, 0), (n.NVML_FI_DEV_TEMPERATURE_SHUTDOWN_TLIMIT, 0)]
        values = self._plain(device, "tlimit_fields", n.nvmlDeviceGetFieldValues, device.handle, ids)
        if values is None or values is _FAILED:
            return {}
        out = {}
        for name, fv in zip(("temperature_slowdown_celsius", "temperature_shutdown_celsius"), values, strict=True):
            if fv.nvmlReturn == n.NVML_SUCCESS:
                out[name] = float(current + margin - self._field_value(fv))
        return out

    def _open_links(self, device: Device) -> None:
        n = self._nvml
        links = []
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                n.nvmlDeviceGetNvLinkState(device.handle, link)
            except n.NVMLError as exc:
                if exc.value in self._lost_codes:
                    raise
                if link == 0 or exc.value == n.NVML_ERROR_INVALID_ARGUMENT:
                    break  # no NVLink at all, or past the last link
                continue
            links.append(link)
            device.link_keys[link] = (f"nvlink{link}.state", tuple(f"nvlink{link}.{c}" for c, _ in _NVLINK_COUNTERS))
            remote = self._plain(
                device, f"nvlink{link}.remote", n.nvmlDeviceGetNvLinkRemotePciInfo, device.handle, link
            )
            if remote is not None and remote is not _FAILED:
                device.remote_bus[link] = sysfs_bus_id(remote.busId)
            kind = self._plain(device, f"nvlink{link}.type", n.nvmlDeviceGetNvLinkRemoteDeviceType, device.handle, link)
            if isinstance(kind, int):
                device.remote_type[link] = kind
        device.links = tuple(links)
        if links:
            device.limits["nvlink_links_max"] = float(len(links))
            device.fields += [(self._field_ids[k], link) for link in links for k in ("nvlink_tx", "nvlink_rx")]

    def _field_value(self, fv: Any) -> float:
        return float(getattr(fv.value, self._value_member.get(fv.valueType, "ullVal")))

    # --- one round ---------------------------------------------------------------------------------------
    def collect(self, ts_ns: int) -> tuple[list[GpuSample], list[GpuEvent]]:
        """Read every device once; a lost device yields one GPU_LOST event and is skipped from then on."""
        samples: list[GpuSample] = []
        events: list[GpuEvent] = []
        for device in self._devices:
            if device.lost:
                continue
            try:
                sample = self._sample(device, ts_ns)
            except GpuLost as exc:
                events.extend(self._mark_lost(device, ts_ns, str(exc)))
                continue
            # limits alone (read at open) are not a reading: a device that answered nothing is not published
            if sample.processes or not sample.metrics.keys() <= device.limits.keys():
                samples.append(sample)
            else:
                self.stats.empty_samples += 1
        self.stats.rounds += 1
        self.stats.samples += len(samples)
        return samples, events

    def _mark_lost(self, device: Device, ts_ns: int, detail: str) -> list[GpuEvent]:
        log.error("GPU %d (%s) is lost: %s; the other GPUs are still read", device.index, device.uuid, detail)
        lost = [d for d in self._devices if d is device or d.parent_uuid == device.uuid]
        for d in lost:
            d.lost = True
            self._rates.forget(d.uuid)
        self.stats.lost_gpus += 1
        return [
            GpuEvent(self.cluster, self.node, device.uuid, device.index, ts_ns, EventKind.GPU_LOST, 0, detail[:200])
        ]

    def _sample(self, device: Device, ts_ns: int) -> GpuSample:
        metrics: dict[str, float] = dict(device.limits)
        # field values first: whether the PCIe byte counters work decides whether the sampled fallback runs
        link_rates = self._field_values(device, ts_ns, metrics)
        device.rounds += 1
        timing = self._costly_every > 1 and device.rounds in _TIMED_ROUNDS
        skip = set(device.costly) if (device.rounds - _TIMED_ROUNDS[-1]) % self._costly_every else set()
        done: set[str] = set()
        while True:
            if device.active is None:  # first round, or a reading just turned out unsupported: its fallback runs
                device.active = tuple(r for r in self._readings if self._wanted(device, r))
            active = device.active
            for reading in active:
                if reading.key not in done and reading.key not in skip:
                    done.add(reading.key)
                    if timing:
                        self._timed_read(device, reading, metrics)
                    else:
                        self._read(device, reading, metrics)
            if device.active is active:
                break
        if timing and device.rounds == _TIMED_ROUNDS[-1]:
            device.costly = {key: us for key, us in device.costs.items() if us > self._costly_us}
            self._said_costly(device)
        links = self._links(device, link_rates, metrics) if device.links else None
        if self._aer is not None and not device.is_mig:  # a MIG instance shares its GPU's link
            metrics.update(self._aer.read(device.pci_bus_id))
        processes = self._read_processes(device) if self._processes else None
        if processes is not None:
            metrics["process_count"] = len(processes)
        return GpuSample(
            self.cluster, self.node, device.uuid, device.index, device.model, ts_ns, metrics, links, processes
        )

    def _field_values(self, device: Device, ts_ns: int, metrics: dict[str, float]) -> dict[tuple[int, int], float]:
        """The batched field-value reading: memory temperature, PCIe and NVLink byte counters (as rates)."""
        if not device.fields:
            return {}
        values = self._plain(device, "field_values", self._get_fields, device.handle, device.fields)
        if values is None:
            device.fields = []
            self._unsupported(device, "pcie_counters")
            return {}
        if values is _FAILED:
            return {}
        found: dict[tuple[int, int], float] = {}
        keep = []
        for key, fv in zip(device.fields, values, strict=True):
            if fv.nvmlReturn == self._success:
                found[key] = self._field_value(fv)
                keep.append(key)
            elif fv.nvmlReturn in self._lost_codes:
                raise GpuLost(f"nvmlDeviceGetFieldValues: field {key[0]}: GPU is lost")
            elif fv.nvmlReturn in self._permanent:
                self.stats.unsupported += 1
            else:
                keep.append(key)
                self.stats.nvml_errors += 1
        device.fields = keep
        ids = self._field_ids
        if (ids["memory_temp"], 0) in found:
            metrics["temperature_memory_celsius"] = found[(ids["memory_temp"], 0)]
        no_counters = (ids["pcie_tx"], 0) not in keep and (ids["pcie_rx"], 0) not in keep
        if no_counters and "pcie_counters" not in device.unsupported:
            self._unsupported(device, "pcie_counters")
        for counter, name in (("pcie_tx", "pcie_tx_bytes_per_second"), ("pcie_rx", "pcie_rx_bytes_per_second")):
            if (ids[counter], 0) in found:
                rate = self._rates.rate((device.uuid, counter), found[(ids[counter], 0)], ts_ns)
                if rate is not None:
                    metrics[name] = rate
        link_rates: dict[tuple[int, int], float] = {}
        for field_key in ("nvlink_tx", "nvlink_rx"):
            for link in device.links:
                value = found.get((ids[field_key], link))
                if value is not None:
                    rate = self._rates.rate((device.uuid, field_key, link), value, ts_ns, KIB)
                    if rate is not None:
                        link_rates[(ids[field_key], link)] = rate
        return link_rates

    def _links(
        self, device: Device, rates: dict[tuple[int, int], float], metrics: dict[str, float]
    ) -> tuple[NvLinkSample, ...]:
        tx_id, rx_id = self._field_ids["nvlink_tx"], self._field_ids["nvlink_rx"]
        handle, plain = device.handle, self._plain
        out = []
        for link in device.links:
            state_key, counter_keys = device.link_keys[link]
            state = plain(device, state_key, self._nvlink_state, handle, link)
            crc_flit, crc_data, replay, recovery = (
                value if isinstance(value, int) else None
                for value in (
                    plain(device, key, self._nvlink_errors, handle, link, counter)
                    for key, counter in zip(counter_keys, self._nvlink_counters, strict=True)
                )
            )
            crc = None if crc_flit is None and crc_data is None else (crc_flit or 0) + (crc_data or 0)
            out.append(
                NvLinkSample(
                    link,
                    state == self._enabled,
                    rates.get((tx_id, link)),
                    rates.get((rx_id, link)),
                    crc,
                    replay,
                    recovery,
                    device.remote_bus.get(link),
                )
            )
        metrics["nvlink_links_active"] = sum(link.active for link in out)
        for name, values in (
            ("nvlink_crc_errors_total", [link.crc_errors_total for link in out]),
            ("nvlink_replay_errors_total", [link.replay_errors_total for link in out]),
            ("nvlink_recovery_errors_total", [link.recovery_errors_total for link in out]),
            ("nvlink_tx_bytes_per_second", [link.tx_bytes_per_second for link in out]),
            ("nvlink_rx_bytes_per_second", [link.rx_bytes_per_second for link in out]),
        ):
            known = [v for v in values if v is not None]
            if known:
                metrics[name] = sum(known)
        return tuple(out)

    def _read_processes(self, device: Device) -> tuple[GpuProcess, ...] | None:
        n = self._nvml
        compute = self._plain(device, "processes_compute", n.nvmlDeviceGetComputeRunningProcesses, device.handle)
        graphics = self._plain(device, "processes_graphics", n.nvmlDeviceGetGraphicsRunningProcesses, device.handle)
        if compute in (None, _FAILED) and graphics in (None, _FAILED):
            return None
        found: dict[int, GpuProcess] = {}
        for kind, procs in (("compute", compute), ("graphics", graphics)):
            if procs is None or procs is _FAILED:
                continue
            for p in procs:
                if p.pid not in found:  # a C+G process is in both lists: it counts once, as compute
                    memory = p.usedGpuMemory
                    found[p.pid] = GpuProcess(p.pid, self._process_name(device, p.pid), memory, kind)
        device.process_names = {pid: device.process_names.get(pid, "") for pid in found}
        return tuple(found.values())

    def _process_name(self, device: Device, pid: int) -> str:
        name = device.process_names.get(pid)
        if name is None:
            try:
                name = text(self._nvml.nvmlSystemGetProcessName(pid))
            except self._nvml.NVMLError:
                name = ""  # it exited between the two calls, or we may not see it
            device.process_names[pid] = name
        return name


def _mig_limits(parent_model: str, mig_model: str) -> dict[str, float]:
    """A MIG device's memory from the catalogue's profile (a compute instance's: its GPU instance's, which it
    shares), for when NVML does not report it."""
    found = catalogue.mig_profile(f"{parent_model} MIG {mig_model.rsplit(' MIG ', 1)[-1]}")
    return {} if found is None else {"memory_total_bytes": float(found[0].memory_bytes)}
