"""Parse ``nvidia-smi -q -x`` captures into what NVML would answer for each GPU (in NVML's units).

One ``<gpu>`` element becomes a :class:`CapturedGpu`: ``values`` maps each reading to the value NVML returns for it
(mW, mJ, bytes, MHz, KB/s), None where the capture prints ``N/A`` (or has no such element: energy, NVLink and PCIe
byte counters), so a replay answers NOT_SUPPORTED exactly where the real board does. MIG devices come from a
capture's ``<mig_devices>`` (GPU and compute instance, memory, the processes of each; no profile or uuid there), or
better from the text of ``nvidia-smi -L`` and ``nvidia-smi -q`` (:func:`parse_mig_text`: with each device's profile
and uuid), the form the real MIG captures we have were published in. What no capture can say
(NVLink peers, counters that move between rounds) is described by the caller with :class:`CapturedLink` or by
editing ``values``.

Used by :mod:`producers.nvml.replay` (an NVML that replays captures: the collector's tests, its benchmark, and the
import of capture directories).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from pipeline import catalogue
from pipeline.vocab import CLOCK_REASONS

_MIB = 2**20
#: nvidia-smi's element names (after ``clocks_event_reason_`` / ``clocks_throttle_reason_``) -> NVML's reason names
_REASON_TAGS = {
    "gpu_idle": "GpuIdle",
    "applications_clocks_setting": "ApplicationsClocksSetting",
    "sw_power_cap": "SwPowerCap",
    "hw_slowdown": "HwSlowdown",
    "sync_boost": "SyncBoost",
    "sw_thermal_slowdown": "SwThermalSlowdown",
    "hw_thermal_slowdown": "HwThermalSlowdown",
    "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
    "display_clocks_setting": "DisplayClockSetting",
}
_REASON_BITS = {tag: next(r.bit for r in CLOCK_REASONS if r.name == name) for tag, name in _REASON_TAGS.items()}
_VIRTUALIZATION = {"None": 0, "Pass-Through": 1, "VGPU": 2, "Host VGPU": 3}


@dataclass
class CapturedProcess:
    pid: int
    name: str
    kind: str  # "C", "G" or "C+G", as nvidia-smi prints it
    used_memory_bytes: int | None


@dataclass
class CapturedLink:
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
class CapturedMig:
    """A MIG device (GPU instance + compute instance): from :func:`parse_mig_text`, a capture's ``<mig_devices>``,
    or described by a test."""

    uuid: str
    name: str
    gi_id: int
    ci_id: int
    memory_total: int | None  # None: NVML does not report it
    memory_used: int
    processes: list[CapturedProcess] = field(default_factory=list)


@dataclass
class CapturedGpu:
    """One device: ``values`` maps a reading to its value in NVML's unit, None (or absent) = not supported."""

    name: str
    uuid: str
    pci_bus_id: str
    values: dict[str, Any]
    processes: list[CapturedProcess] = field(default_factory=list)
    links: list[CapturedLink] = field(default_factory=list)
    migs: list[CapturedMig] = field(default_factory=list)
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


def _processes(gpu: ET.Element) -> dict[tuple[int, int] | None, list[CapturedProcess]]:
    """The processes by the (GPU instance, compute instance) they run on (None: the GPU itself, MIG off)."""
    out: dict[tuple[int, int] | None, list[CapturedProcess]] = {}
    for p in gpu.findall("processes/process_info"):
        pid = _int(p, "pid")
        assert pid is not None
        name = (p.findtext("process_name") or "").strip()
        gi, ci = _int(p, "gpu_instance_id"), _int(p, "compute_instance_id")
        where = None if gi is None or ci is None else (gi, ci)
        proc = CapturedProcess(pid, name, (p.findtext("type") or "C").strip(), _mib(p, "used_memory"))
        out.setdefault(where, []).append(proc)
    return out


def _xml_migs(
    gpu: ET.Element, name: str, uuid: str, processes: dict[tuple[int, int] | None, list[CapturedProcess]]
) -> list[CapturedMig]:
    """``<mig_devices>``: each device's GPU and compute instance and memory, and its processes. The XML names no
    profile and no MIG uuid: the uuid is made from the parent's and the instance ids (as for dcgm-exporter's MIG
    devices), the profile is the catalogue's one whose memory is within 8 % of the device's if only one is (a
    profile that fits two, 1g.20gb or 2g.20gb, is named by its memory alone: ``20gb``)."""
    out = []
    for d in gpu.findall("mig_devices/mig_device"):
        gi, ci = _int(d, "gpu_instance_id"), _int(d, "compute_instance_id")
        total, used = _mib(d, "fb_memory_usage/total"), _mib(d, "fb_memory_usage/used")
        if gi is None or ci is None:
            continue
        mig_uuid, model = f"MIG-{uuid.removeprefix('GPU-')}/{gi}/{ci}", f"{name} MIG {_profile_by_memory(name, total)}"
        out.append(CapturedMig(mig_uuid, model, gi, ci, total, used or 0, processes.get((gi, ci), [])))
    return out


def _profile_by_memory(board: str, memory: int | None) -> str:
    spec = catalogue.lookup(board)
    if memory is None:
        return "unknown"
    fits = {
        p.name
        for p in (spec.mig_profiles if spec else ())
        if not p.name.endswith("+me") and abs(p.memory_bytes - memory) <= 0.08 * p.memory_bytes
    }
    return fits.pop() if len(fits) == 1 else f"{round(memory / 2**30)}gb"


def gpu_from_xml(gpu: ET.Element, source: str = "") -> CapturedGpu:
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
    bus_id = _text(pci, "pci_bus_id") or gpu.get("id") or ""
    processes = _processes(gpu)
    migs = _xml_migs(gpu, name, uuid, processes)
    return CapturedGpu(name, uuid, bus_id, values, processes.get(None, []), migs=migs, source=source)


def parse_capture(path: Path) -> list[CapturedGpu]:
    """Every GPU of one capture file."""
    root = ET.parse(path).getroot()
    return [gpu_from_xml(g, path.name) for g in root.findall("gpu")]


# --- MIG devices from nvidia-smi's text output -------------------------------------------------------------

_LIST_GPU = re.compile(r"^GPU (\d+): (.+) \(UUID: (\S+)\)$")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (\S+)\)$")
_QUERY_GPU = re.compile(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+$", re.MULTILINE)
_MIG_DEVICE = re.compile(
    r"^    MIG Device\n\s+Index\s+: (\d+)\n\s+GPU Instance ID\s+: (\d+)\n\s+Compute Instance ID\s+: (\d+)\n"
    r"(?:.*\n)*?\s+Shared FB Memory Usage\n\s+Total\s+: (\d+) MiB\n(?:\s+Reserved\s+: \d+ MiB\n)?"
    r"\s+Used\s+: (\d+) MiB",
    re.MULTILINE,
)
_MIG_PROCESS = re.compile(
    r"GPU instance ID\s+: (\d+)\n\s+Compute instance ID\s+: (\d+)\n\s+Process ID\s+: (\d+)\n"
    r"\s+Type\s+: (\S+)\n\s+Name\s+: (.*)\n\s+Used GPU Memory\s+: (\d+) MiB"
)


def parse_mig_text(listing: str, query: str) -> dict[str, list[CapturedMig]]:
    """The MIG devices of each GPU (by its uuid) from ``nvidia-smi -L`` (``listing``: profile names and uuids, in
    device order) and ``nvidia-smi -q`` (``query``, text: each device's GPU and compute instance, its instance's
    memory total and use, and the processes of each instance). NVML names a MIG device ``<GPU name> MIG
    <profile>``; two compute instances of one GPU instance (``1c.3g.71gb``, ``2c.3g.71gb``) share its memory."""
    gpus: list[tuple[str, str, list[tuple[str, str]]]] = []
    for line in listing.splitlines():
        if found := _LIST_GPU.match(line):
            gpus.append((found[2], found[3], []))
        elif (found := _LIST_MIG.match(line)) and gpus:
            gpus[-1][2].append((found[1], found[3]))
    blocks = _QUERY_GPU.split(query)[1:]
    if len(blocks) != len(gpus):
        raise ValueError(f"nvidia-smi -L lists {len(gpus)} GPUs, nvidia-smi -q has {len(blocks)}")
    out: dict[str, list[CapturedMig]] = {}
    for (name, uuid, listed), block in zip(gpus, blocks, strict=True):
        processes = [
            (int(gi), int(ci), CapturedProcess(int(pid), pname.strip(), kind, int(used) * _MIB))
            for gi, ci, pid, kind, pname, used in _MIG_PROCESS.findall(block)
        ]
        migs = []
        for index, gi, ci, total, used in _MIG_DEVICE.findall(block):
            profile, mig_uuid = listed[int(index)]
            mine = [p for g, c, p in processes if (g, c) == (int(gi), int(ci))]
            memory = (int(total) * _MIB, int(used) * _MIB)
            migs.append(CapturedMig(mig_uuid, f"{name} MIG {profile}", int(gi), int(ci), *memory, mine))
        if len(migs) != len(listed):
            raise ValueError(f"{uuid}: nvidia-smi -L lists {len(listed)} MIG devices, nvidia-smi -q has {len(migs)}")
        out[uuid] = migs
    return out
