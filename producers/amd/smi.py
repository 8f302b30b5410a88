"""``amd-smi`` on the node as a source: for AMD nodes that run no device-metrics-exporter (a Slurm cluster, a
single server). Each round runs ``amd-smi metric --json``; :meth:`AmdSmiSource.open` runs ``amd-smi static --json``
once, for each GPU's model, serial, compute partition and the limits its driver enforces.

amd-smi's JSON is read into the device-metrics-exporter's field names (:data:`PATHS`), so one mapping serves both
(:func:`producers.amd.exporter.to_batches`: units, generations, throttling by cause, the "no value" markers):

    usage.gfx_activity / umc_activity (%)          gpu_gfx_activity / gpu_umc_activity
    power.socket_power (W)                         gpu_power_usage (the current socket power, else the average:
                                                   amd-smi picks the one the GPU has)
    temperature.hotspot / edge / mem (C)           gpu_junction_temperature / gpu_edge_temperature /
                                                   gpu_memory_temperature
    mem_usage.total_vram / used_vram / free_vram   gpu_total_vram / gpu_used_vram / gpu_free_vram (MB: MiB, as
                                                   amd-smi divides by 1024^2)
    energy.total_energy_consumption (J or uJ)      gpu_energy_consumed (uJ; ROCm 6.2+ prints J, older uJ)
    clock.gfx_N / mem_N .clk and .max_clk (MHz)    gpu_clock / gpu_max_clock, clock_type system / memory
    pcie.speed (GT/s), pcie.replay_count           pcie_speed, pcie_replay_count
    ecc.total_correctable / uncorrectable_count    gpu_ecc_correct_total / gpu_ecc_uncorrect_total
    throttle.<cause>_accumulated, accumulation_    the exporter's gpu_violation_* residency counters and
    counter, <cause>_violation_activity (%)        percentages (MI300+)

A value whose unit is not the one expected is not converted by guess: it is counted (``unconvertible_values``)
and named once in the log. Sections amd-smi prints that have no field in the schema (voltages, fan, video
clocks, per-block ECC, per-XCP activity lists, PCIe bandwidth) are counted as ``unmapped``; a key amd-smi did not
print in the version this was written against is counted as ``unknown`` and named once in the log.

From ``amd-smi static --json``: the model (``asic.market_name``, the last ``MI\\d{3}`` in it), the board serial,
the compute partition, the PCIe maximum (``bus``), and the limits in force, which take the place of the
catalogue's: the power cap (``limit.socket_power``, else ``max_power``) as ``power_limit_watts``; the slowdown
and shutdown temperatures of the sensor the GPU temperature is read from (hotspot, else edge). Identity: the
board serial with the GPU's index (two dies of an MI250X share a board), else ``amd-smi:<index>`` on the node.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from pipeline.config import CollectorSettings, Settings
from pipeline.errors import BadSourceData, ConfigError, DecodeError
from pipeline.events import SampleBatch
from pipeline.registry import from_section, with_options
from pipeline.topology import NodeTopology, TopologyGpu
from producers.amd.exporter import FIELDS, RESIDENCY_CAUSES, WHOLE, ExporterState, ScrapeStats, to_batches
from producers.dcgm_exporter import PromSample
from producers.source import Runner, check_names, run_command

log = logging.getLogger(__name__)

#: unit -> factor into the exporter field's unit
#: (``""``: a bare number, as amd-smi printed every value before ROCm 6.1.1 added units, in the unit it documents;
#: energy has none: its bare unit changed between releases)
_PERCENT: Final = {"%": 1.0, "": 1.0}
_WATTS: Final = {"W": 1.0, "mW": 1e-3, "": 1.0}
_CELSIUS: Final = {"C": 1.0, "": 1.0}
_MIB: Final = {"MB": 1.0, "MiB": 1.0, "GB": 1024.0, "KB": 1 / 1024, "": 1.0}
_MHZ: Final = {"MHz": 1.0, "GHz": 1000.0, "": 1.0}
_GT_S: Final = {"GT/s": 1.0, "": 1.0}
_COUNT: Final = {"": 1.0}
#: amd-smi's name of a throttling cause where it is not the exporter's (producers.amd.exporter.RESIDENCY_CAUSES)
_SMI_CAUSE: Final = {"processor_hot": "prochot"}
#: (section, key) -> (the exporter's field, the units it may come in)
PATHS: Final[Mapping[tuple[str, str], tuple[str, Mapping[str, float]]]] = {
    ("usage", "gfx_activity"): ("gpu_gfx_activity", _PERCENT),
    ("usage", "umc_activity"): ("gpu_umc_activity", _PERCENT),
    ("power", "socket_power"): ("gpu_power_usage", _WATTS),
    ("temperature", "hotspot"): ("gpu_junction_temperature", _CELSIUS),
    ("temperature", "edge"): ("gpu_edge_temperature", _CELSIUS),
    ("temperature", "mem"): ("gpu_memory_temperature", _CELSIUS),
    ("mem_usage", "total_vram"): ("gpu_total_vram", _MIB),
    ("mem_usage", "used_vram"): ("gpu_used_vram", _MIB),
    ("mem_usage", "free_vram"): ("gpu_free_vram", _MIB),
    ("energy", "total_energy_consumption"): ("gpu_energy_consumed", {"uJ": 1.0, "J": 1e6, "mJ": 1e3}),
    ("pcie", "speed"): ("pcie_speed", _GT_S),
    ("pcie", "replay_count"): ("pcie_replay_count", _COUNT),
    ("ecc", "total_correctable_count"): ("gpu_ecc_correct_total", _COUNT),
    ("ecc", "total_uncorrectable_count"): ("gpu_ecc_uncorrect_total", _COUNT),
    ("throttle", "accumulation_counter"): ("gpu_violation_current_accumulated_counter", _COUNT),
    **{
        ("throttle", f"{_SMI_CAUSE.get(cause, cause)}_{key}"): (f"gpu_violation_{cause}_residency_{kind}", units)
        for cause in RESIDENCY_CAUSES
        for key, kind, units in (("accumulated", "accumulated", _COUNT), ("violation_activity", "percentage", _PERCENT))
    },
}
#: clock domain (``gfx_3`` -> ``gfx``) -> the exporter's clock_type
CLOCK_TYPES: Final = {"gfx": "system", "mem": "memory"}
_CLOCK_KEYS: Final = {"clk": "gpu_clock", "max_clk": "gpu_max_clock"}
#: what amd-smi prints that has no field in the schema (counted as unmapped, not unknown)
UNMAPPED_SECTIONS: Final = frozenset(
    {"ecc_blocks", "fan", "voltage_curve", "overdrive", "mem_overdrive", "perf_level", "xgmi_err", "voltage"}
)
#: keys of mapped sections amd-smi prints that have no field in the schema
UNMAPPED_KEYS: Final = frozenset(
    {("usage", k) for k in ("mm_activity", "vcn_activity", "jpeg_activity", "gfx_busy_inst", "jpeg_busy", "vcn_busy")}
    | {("power", k) for k in ("gfx_voltage", "soc_voltage", "mem_voltage", "power_management", "throttle_status")}
    | {("mem_usage", k) for k in ("total_visible_vram", "used_visible_vram", "free_visible_vram")}
    | {("mem_usage", k) for k in ("total_gtt", "used_gtt", "free_gtt")}
    | {
        ("pcie", k)
        for k in (
            "width",
            "bandwidth",
            "l0_to_recovery_count",
            "replay_roll_over_count",
            "nak_sent_count",
            "nak_received_count",
            "current_bandwidth_sent",
            "current_bandwidth_received",
            "max_packet_size",
            "lc_perf_other_end_recovery",
        )
    }
    | {("ecc", k) for k in ("total_deferred_count", "cache_correctable_count", "cache_uncorrectable_count")}
    | {("throttle", f"{_SMI_CAUSE.get(c, c)}_violation_status") for c in RESIDENCY_CAUSES}
)
_NOT_NUMBERS: Final = {"gpu", "timestamp"}
_MI: Final = re.compile(r"\bMI\d{3}[A-Z]?\b", re.IGNORECASE)


class UnitMismatch(ValueError):
    """A value in a unit its field does not come in."""


def documents(text: str) -> list[dict[str, Any]]:
    """The per-GPU records of an ``amd-smi ... --json`` output: a list (ROCm 6.x), or ``{"gpu_data": [...]}``
    (ROCm 7); warnings amd-smi prints before the JSON (``WARNING: ... render group``) are skipped."""
    start = min((i for i in (text.find("["), text.find("{")) if i >= 0), default=-1)
    if start < 0:
        raise DecodeError("malformed", "no JSON in amd-smi's output")
    try:
        data = json.loads(text[start:])
    except json.JSONDecodeError as exc:
        raise DecodeError("malformed", f"amd-smi's output is not JSON: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("gpu_data"), list):
        data = data["gpu_data"]
    if not isinstance(data, list) or not all(isinstance(g, dict) and isinstance(g.get("gpu"), int) for g in data):
        raise DecodeError("malformed", "amd-smi's JSON is not a list of GPUs with a 'gpu' index")
    return data


def reading(value: Any, units: Mapping[str, float]) -> float | None:
    """A value as amd-smi prints it (``{"value": v, "unit": u}``, a bare number, or ``"N/A"``) in its field's
    unit; None when there is none; :class:`UnitMismatch` when its unit is not one the field comes in."""
    unit = ""
    if isinstance(value, dict):
        value, unit = value.get("value"), str(value.get("unit", ""))
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    factor = units.get(unit)
    if factor is None:
        raise UnitMismatch(unit)
    return float(value) * factor


@dataclass(frozen=True, slots=True)
class StaticGpu:
    """What ``amd-smi static --json`` says of one GPU."""

    labels: dict[str, str]
    #: schema fields the driver's limits give (they take the place of the catalogue's)
    limits: dict[str, float]
    #: the exporter's pcie_max_speed (GT/s)
    pcie_max_gt_s: float | None = None

    @property
    def whole(self) -> bool:
        """Not a compute partition (whose power cap and PCIe link are its GPU's)."""
        return self.labels.get("gpu_compute_partition_type", "").lower() in WHOLE


def static_gpus(records: Sequence[dict[str, Any]], node: str) -> dict[int, StaticGpu]:
    """Per GPU index: its labels in the exporter's names and the limits in force."""
    out: dict[int, StaticGpu] = {}
    for g in records:
        index = g["gpu"]
        asic, board = _section(g, "asic"), _section(g, "board")
        limit, bus, partition = _section(g, "limit"), _section(g, "bus"), _section(g, "partition")
        market = str(asic.get("market_name", ""))
        models = _MI.findall(market)  # the last: "Aldebaran/MI200 [Instinct MI210" is an MI210
        labels = {"gpu_id": str(index), "hostname": node}
        labels["card_series"] = f"AMD Instinct {models[-1].upper()}" if models else (market or "AMD GPU")
        serial = str(board.get("product_serial", "") or asic.get("asic_serial", ""))
        labels["gpu_uuid"] = f"{serial}/{index}" if serial not in ("", "0", "N/A") else f"amd-smi:{node}:{index}"
        compute = partition.get("compute_partition")
        if isinstance(compute, str) and compute not in ("N/A", ""):
            labels["gpu_compute_partition_type"] = compute
        out[index] = StaticGpu(labels, _limits(limit, bus), reading(bus.get("max_pcie_speed"), _GT_S))
    return out


def _limits(limit: Mapping[str, Any], bus: Mapping[str, Any]) -> dict[str, float]:
    """The schema's limits from ``static``'s: the power cap in force; the hotspot's slowdown and shutdown where it
    has them (the GPU temperature is the hotspot's where there is one), else the edge's; the PCIe width."""
    out: dict[str, float] = {}
    cap = reading(limit.get("socket_power"), _WATTS) or reading(limit.get("max_power"), _WATTS)
    if cap:
        out["power_limit_watts"] = cap
    sensor = "hotspot" if reading(limit.get("slowdown_hotspot_temperature"), _CELSIUS) else "edge"
    for what in ("slowdown", "shutdown"):
        value = reading(limit.get(f"{what}_{sensor}_temperature"), _CELSIUS)
        if value:
            out[f"temperature_{what}_celsius"] = value
    width = reading(bus.get("max_pcie_width"), _COUNT)
    if width:
        out["pcie_link_width_max"] = width
    return out


def _section(record: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = record.get(name)
    return value if isinstance(value, dict) else {}


def _leaves(record: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(section, key, value) of a metric record; a section that is not a dict (``"N/A"``) yields nothing."""
    for section, body in record.items():
        if section in _NOT_NUMBERS:
            continue
        if not isinstance(body, dict):
            yield section, "", body
            continue
        for key, value in body.items():
            yield section, key, value


def prom_samples(
    records: Sequence[dict[str, Any]], static: Mapping[int, StaticGpu], node: str, stats: ScrapeStats
) -> list[PromSample]:
    """amd-smi's metric records as the exporter's series (see the module docstring)."""
    out: list[PromSample] = []
    for g in records:
        index = g["gpu"]
        known = static.get(index)
        labels = dict(known.labels) if known else {"gpu_id": str(index), "hostname": node}
        labels.setdefault("gpu_uuid", f"amd-smi:{node}:{index}")
        if known is not None and known.pcie_max_gt_s:
            out.append(PromSample("pcie_max_speed", labels, known.pcie_max_gt_s, 0))
        for section, key, value in _leaves(g):
            out.extend(_series(section, key, value, labels, stats))
    return out


def _series(section: str, key: str, value: Any, labels: dict[str, str], stats: ScrapeStats) -> list[PromSample]:
    """One leaf of a metric record as the exporter's series (none, one, or a clock's two)."""
    if section == "clock":
        domain, _, number = key.rpartition("_")
        clock_type = CLOCK_TYPES.get(domain)
        if clock_type is None or not isinstance(value, dict):
            return _unread(stats, "unmapped")  # video, data-fabric and SoC clocks
        out = []
        for part, name in _CLOCK_KEYS.items():
            try:
                v = reading(value.get(part), _MHZ)
            except UnitMismatch as exc:
                _mismatch(stats, f"clock.{key}.{part}", str(exc))
                continue
            if v is not None:
                out.append(PromSample(name, {**labels, "clock_type": clock_type, "clock_index": number}, v, 0))
        return out
    path = PATHS.get((section, key))
    if path is None:
        if section in UNMAPPED_SECTIONS or (section, key) in UNMAPPED_KEYS:
            return _unread(stats, "unmapped")
        what = f"{section}.{key}"
        return _unread(stats, "unknown", stats.unknown_names, what, f"{what} is not a field this version knows")
    name, units = path
    try:
        v = reading(value, units)
    except UnitMismatch as exc:
        _mismatch(stats, f"{section}.{key}", str(exc))
        return []
    return [] if v is None else [PromSample(name, labels, v, 0)]


def _mismatch(stats: ScrapeStats, what: str, unit: str) -> None:
    _unread(stats, "unconvertible", stats.told, f"{what}:{unit}", f"{what} came in {unit!r}, not a unit it is read in")


def _unread(
    stats: ScrapeStats, kind: str, said: set[str] | None = None, name: str = "", why: str = ""
) -> list[PromSample]:
    """A value amd-smi printed that becomes no series, counted as the exporter mapping counts its series
    (``samples`` and its ``kind``: unmapped, unknown or unconvertible); named once in the log where ``said`` is
    given (the names already told)."""
    stats.samples += 1
    setattr(stats, kind, getattr(stats, kind) + 1)
    if said is not None and name not in said:
        said.add(name)
        log.info("amd-smi: %s; counted, not %s", why, "converted" if kind == "unconvertible" else "mapped")
    return []


def with_limits(batches: list[SampleBatch], static: Mapping[int, StaticGpu]) -> list[SampleBatch]:
    """The driver's limits in place of the catalogue's, for whole GPUs."""
    out = []
    for batch in batches:
        samples = tuple(
            replace(s, metrics={**s.metrics, **known.limits})
            if (known := static.get(s.gpu_index)) is not None and known.whole
            else s
            for s in batch.samples
        )
        out.append(replace(batch, samples=samples))
    return out


@dataclass(frozen=True, slots=True)
class AmdSmiConfig:
    """The ``amd-smi`` source's settings."""

    #: the amd-smi command (a name on PATH or a path)
    binary: str = "amd-smi"
    cluster: str = from_section(Settings, "cluster")
    #: the node the samples carry; empty: this host's name
    node: str = ""
    timeout_s: float = from_section(CollectorSettings, "scrape_timeout_s")


class AmdSmiSource:
    """Runs ``amd-smi metric --json`` once per round (``run`` is injectable; a subprocess by default)."""

    name = "amd-smi"
    fields = FIELDS
    Config = AmdSmiConfig

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> AmdSmiConfig:
        c = settings.collector
        config = AmdSmiConfig(cluster=settings.cluster, node=c.node or "", timeout_s=c.scrape_timeout_s)
        return with_options(config, options, "the amd-smi source")

    @classmethod
    def validate(cls, config: AmdSmiConfig) -> None:
        """A command to run, a positive timeout, names that fit a Kafka key; nothing is run."""
        if not config.binary.strip():
            raise ConfigError("invalid configuration: amd-smi source: --binary is empty")
        if not config.timeout_s > 0:
            raise ConfigError(f"invalid configuration: amd-smi timeout must be > 0 s, got {config.timeout_s}")
        check_names(cls.name, config.cluster, config.node)

    @classmethod
    def from_config(cls, config: AmdSmiConfig, run: Runner | None = None) -> AmdSmiSource:
        node = config.node or socket.gethostname().split(".", 1)[0]
        return cls(config.binary, config.cluster, node, timeout_s=config.timeout_s, run=run)

    def __init__(
        self,
        binary: str,
        cluster: str,
        node: str,
        *,
        timeout_s: float = 5.0,
        run: Runner | None = None,
    ) -> None:
        self.binary, self.cluster, self.node = binary, cluster, node
        self._timeout = timeout_s
        self._run = run or run_command
        self._real = run is None
        self._state = ExporterState()
        self._static: dict[int, StaticGpu] = {}
        self._gpus: tuple[TopologyGpu, ...] = ()
        #: every value read, as the exporter mapping counts them
        self.scrape_stats = ScrapeStats()

    def open(self) -> None:
        """Reads ``amd-smi static --json`` once; amd-smi missing is a start error, in one line."""
        if self._real and shutil.which(self.binary) is None:
            raise ConfigError(f"amd-smi source: {self.binary!r} is not a command here (install amd-smi, or --binary)")
        self._static = static_gpus(self._documents("static"), self.node)

    def _documents(self, command: str) -> list[dict[str, Any]]:
        text = self._run([self.binary, command, "--json"], self._timeout)
        try:
            return documents(text)
        except DecodeError as exc:
            raise BadSourceData(exc.reason, exc.detail, text.encode(), f"{self.binary} {command}") from exc

    def collect(self, ts_ns: int) -> list[SampleBatch]:
        samples = prom_samples(self._documents("metric"), self._static, self.node, self.scrape_stats)
        batches = to_batches(samples, self.cluster, self.node, ts_ns, self._state, self.scrape_stats)
        batches = with_limits(batches, self._static)
        self._gpus = tuple(TopologyGpu(s.gpu_uuid, s.gpu_index, s.gpu_model, "") for b in batches for s in b.samples)
        return batches

    def topologies(self, ts_ns: int) -> list[NodeTopology]:
        """The GPUs of the last round (XGMI peers and PCI paths are not read yet)."""
        return [NodeTopology(self.cluster, self.node, ts_ns, self._gpus)] if self._gpus else []

    def stats(self) -> dict[str, int]:
        s = self.scrape_stats
        return {
            "mapped_values": s.mapped,
            "unmapped_values": s.unmapped,
            "unknown_values": s.unknown,
            "blank_values": s.blank,
            "unconvertible_values": s.unconvertible,
        }

    def close(self) -> None:
        """Nothing held between rounds."""
