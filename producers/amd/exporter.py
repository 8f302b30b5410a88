"""AMD's device-metrics-exporter as a source: its ``/metrics`` turned into the same SampleBatches as NVIDIA's.

An MI2xx/MI3xx cluster that runs AMD's exporter (v1.x, Apache-2.0, port 5000 by default) feeds hermeneut with no
new agent. Emits one :class:`SampleBatch` per node (``hostname`` label, else the configured node) per scrape, with
the METRIC_FIELDS below in the schema's units, and an ``afid`` :class:`GpuEvent` per new RAS event.

What maps to what (the exporter prints each documented field lower-case, optionally prefixed, e.g. ``amd_``):

    gpu_gfx_activity / gpu_umc_activity      utilization_gpu_percent / utilization_memory_percent (0-100)
    gpu_total_vram / gpu_used_vram (MB)      memory_total_bytes / memory_used_bytes (x 2^20; total falls back
                                             to used + gpu_free_vram)
    gpu_junction_temperature (MI3xx),        temperature_gpu_celsius: junction (the hotspot, what throttling acts
    gpu_edge_temperature (MI2xx)             on) where there is one, else the edge sensor
    gpu_memory_temperature                   temperature_memory_celsius
    gpu_package_power (MI3xx),               power_watts: current socket power, else the power usage, else the
    gpu_power_usage, gpu_average_package_power   average (MI2xx)
    gpu_energy_consumed (uJ)                 energy_joules (x 1e-6)
    gpu_clock{clock_type=system|memory}      sm_clock_mhz (mean over the XCDs' clocks) / memory_clock_mhz
    gpu_max_clock{clock_type=system|memory}  sm_clock_max_mhz and graphics_clock_max_mhz / memory_clock_max_mhz
    pcie_speed / pcie_max_speed (GT/s)       pcie_link_gen / pcie_link_gen_max (2.5 -> 1 ... 64 -> 6)
    pcie_replay_count                        pcie_replay_total
    gpu_ecc_correct_total / _uncorrect_total ecc_corrected_total / ecc_uncorrected_total
    gpu_violation_*_residency_percentage,    throttle_reasons_mask, throttling by cause in NVML's bits (one
    or the *_residency_accumulated counters  vocabulary across vendors): PPT -> SwPowerCap, socket thermal and
    over gpu_violation_current_accumulated_  HBM thermal -> SwThermalSlowdown, VR thermal -> HwThermalSlowdown,
    counter between two scrapes              PROCHOT -> HwSlowdown; a cause is set when it held the clocks for
                                             any part of the interval
    gpu_afid_errors{severity}                an ``afid`` event (code: the AFID) when the GPU's set of AFIDs
                                             changes; detail from :mod:`pipeline.afid`

Limits the exporter does not report (power limit: it has no power-cap field; thresholds, PCIe width) come from
the GPU catalogue by model (``AMD Instinct MI300X`` etc.), for whole GPUs only. Every other documented field is
counted as ``unmapped`` with its reason in :data:`NOT_MAPPED`; a field not in the exporter's documented list is
counted as ``unknown`` and named once in the log. GPU-to-GPU (XGMI) throughput is not mapped yet (cumulative KB
per link; the schema's link fields are NVLink's).

- Identity: ``gpu_uuid``, else the board's ``serial_number`` with ``gpu_id`` (an MI250X's two dies share a
  serial); ``gpu_id`` is the index. Label names are read case-insensitively (old releases printed
  ``GPU_UUID``). Model: the ``MI\\d{3}`` generation in ``card_series`` (``AMD Instinct MI300X OAM``, ``Aqua
  Vanjaram [Instinct MI300X VF]``) as ``AMD Instinct MI300X``: the vendor is the model's first word. A compute
  partition (``gpu_compute_partition_type`` CPX/DPX/QPX) carries it in the model (``AMD Instinct MI300X CPX``).
- No value: NaN, infinities and amd-smi's "not available" markers (65535, 2^32 - 1, 2^64 - 1) are absent, never
  numbers; so are a temperature of 0 (an MI3xx prints its missing edge sensor as 0, issue #171) and a power of 0
  (partitions other than the first, guest VMs and iGPUs have no power sensor and print 0).
"""

from __future__ import annotations

import logging
import math
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline import catalogue
from pipeline.afid import describe
from pipeline.config import CollectorSettings, Settings
from pipeline.errors import BadSourceData, ConfigError, DecodeError, SourceUnavailable
from pipeline.events import EventKind, GpuEvent, GpuSample, SampleBatch
from pipeline.registry import from_section, with_options
from pipeline.topology import NodeTopology, TopologyGpu
from pipeline.vocab import CLOCK_REASONS
from producers.dcgm_exporter import PromSample, parse_exposition
from producers.source import check_names

log = logging.getLogger(__name__)

_MIB: Final = float(2**20)
#: exporter field -> (schema field, factor, rank): of several fields for one schema field the lowest rank wins
METRICS: Final[dict[str, tuple[str, float, int]]] = {
    "gpu_gfx_activity": ("utilization_gpu_percent", 1.0, 0),
    "gpu_umc_activity": ("utilization_memory_percent", 1.0, 0),
    "gpu_total_vram": ("memory_total_bytes", _MIB, 0),
    "gpu_used_vram": ("memory_used_bytes", _MIB, 0),
    "gpu_junction_temperature": ("temperature_gpu_celsius", 1.0, 0),
    "gpu_edge_temperature": ("temperature_gpu_celsius", 1.0, 1),
    "gpu_memory_temperature": ("temperature_memory_celsius", 1.0, 0),
    "gpu_package_power": ("power_watts", 1.0, 0),
    "gpu_power_usage": ("power_watts", 1.0, 1),
    "gpu_average_package_power": ("power_watts", 1.0, 2),
    "gpu_energy_consumed": ("energy_joules", 1e-6, 0),
    "pcie_replay_count": ("pcie_replay_total", 1.0, 0),
    "gpu_ecc_correct_total": ("ecc_corrected_total", 1.0, 0),
    "gpu_ecc_uncorrect_total": ("ecc_uncorrected_total", 1.0, 0),
}
#: (exporter field, clock_type label) -> schema fields; current clocks are averaged over the clock's indices (one
#: per XCD on an MI300X), maximum clocks take the highest
CLOCKS: Final[dict[tuple[str, str], tuple[str, ...]]] = {
    ("gpu_clock", "system"): ("sm_clock_mhz",),
    ("gpu_clock", "memory"): ("memory_clock_mhz",),
    ("gpu_max_clock", "system"): ("sm_clock_max_mhz", "graphics_clock_max_mhz"),
    ("gpu_max_clock", "memory"): ("memory_clock_max_mhz",),
}
#: PCIe transfer rate (GT/s) -> generation
PCIE_GENERATIONS: Final[dict[float, int]] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}
PCIE_SPEEDS: Final[dict[str, str]] = {"pcie_speed": "pcie_link_gen", "pcie_max_speed": "pcie_link_gen_max"}

_BITS: Final = {r.name: r.bit for r in CLOCK_REASONS}
#: violation cause (as in gpu_violation_<cause>_residency_*) -> the NVML clocks-event reason it is
RESIDENCY_CAUSES: Final[dict[str, int]] = {
    "ppt": _BITS["SwPowerCap"],  # package power tracking: the power limit
    "socket_thermal": _BITS["SwThermalSlowdown"],
    "hbm_thermal": _BITS["SwThermalSlowdown"],  # memory over its limit: NVIDIA counts it as SW thermal too
    "vr_thermal": _BITS["HwThermalSlowdown"],  # voltage regulators: board-level, outside the GPU's own control
    "processor_hot": _BITS["HwSlowdown"],  # PROCHOT: the hardware slow-down signal
}
_RESIDENCY: Final = re.compile(r"^gpu_violation_(\w+?)_residency_(percentage|accumulated)$")
ACCUMULATION: Final = "gpu_violation_current_accumulated_counter"
AFID: Final = "gpu_afid_errors"
_FREE: Final = "gpu_free_vram"

#: documented fields deliberately not mapped, and why (tests check the exporter's whole field list is covered)
NOT_MAPPED: Final[tuple[tuple[re.Pattern[str], str], ...]] = tuple(
    (re.compile(pattern), reason)
    for pattern, reason in (
        (r"^gpu_nodes_total$", "node-level count, no GPU"),
        (r"^gpu_health$", "the exporter's own verdict; hermeneut judges from the readings and AFIDs"),
        (r"^gpu_hbm_temperature$", "per-stack list; gpu_memory_temperature is the memory's reading"),
        (r"^gpu_(mma|vcn|jpeg)_activity$", "deprecated by AMD, emitted on no platform"),
        (r"^gpu_(gfx|vcn|jpeg)_busy_instantaneous$", "per-XCD/engine instant; gpu_gfx_activity is the GPU's"),
        (r"^gpu_process_cu_occupancy$", "per process; no per-process field in the schema"),
        (r"^gpu_(gfx_|memory_)?voltage$", "deprecated by AMD, emitted on no platform"),
        (r"^pcie_(bandwidth|bidirectional_bandwidth)$", "both directions together; the schema has tx and rx"),
        (r"^pcie_(recovery|replay_rollover|nack_sent|nack_received)_count$", "no field in the schema yet"),
        (r"^pcie_(rx|tx)$", "announced by AMD, not emitted yet"),
        (r"^gpu_min_clock$", "the floor of the clock range; the schema keeps the maximum"),
        (r"^gpu_(total|used|free)_visible_vram$", "the CPU-visible window, a part of the VRAM"),
        (r"^gpu_vram_max_bandwidth$", "a constant of the board"),
        (r"^gpu_(total|used|free)_gtt$", "host memory mapped for the GPU, not the GPU's memory"),
        (r"^gpu_ecc_deferred_total$", "deferred errors: no field in the schema yet"),
        (r"^gpu_ecc_(correct|uncorrect|deferred)_(?!total$)\w+$", "per-block breakdown of the totals"),
        (r"^gpu_xgmi_\w+$", "XGMI link traffic: not mapped in this slice"),
        (
            r"^gpu_violation_(low_utilization|gfx_clock_below_host_limit_\w+?)_(percentage|accumulated)$",
            "a consequence (clock below the host's limit, low utilization), not a cause of throttling",
        ),
        (r"^gpu_prof_\w+$", "profiler counters (off by default; they block application profiling)"),
    )
)
#: what the source may emit: the mapped fields, and the limits the catalogue fills in
FIELDS: Final = (
    frozenset(name for name, _, _ in METRICS.values())
    | frozenset(name for names in CLOCKS.values() for name in names)
    | frozenset(PCIE_SPEEDS.values())
    | {"throttle_reasons_mask"}
    | frozenset(
        {
            "power_limit_watts",
            "power_default_limit_watts",
            "temperature_slowdown_celsius",
            "temperature_shutdown_celsius",
            "pcie_link_width_max",
        }
    )
)
_NA: Final = frozenset({65535.0, 4294967295.0, 18446744073709551615.0})
_NO_ZERO: Final = frozenset({"temperature_gpu_celsius", "temperature_memory_celsius", "power_watts"})
#: the compute partition types that are a whole GPU
WHOLE: Final = frozenset({"", "spx", "none", "na"})
_MI: Final = re.compile(r"\bMI\d{3}[A-Z]?\b", re.IGNORECASE)


def canonical(name: str) -> str:
    """The exporter field a metric name prints (lower-case, without a configured ``amd_`` prefix)."""
    name = name.lower()
    return name.removeprefix("amd_")


def not_mapped_reason(name: str) -> str | None:
    """Why a documented field is not mapped; None when it is not one of those."""
    return next((reason for pattern, reason in NOT_MAPPED if pattern.match(name)), None)


def is_mapped(name: str) -> bool:
    """Whether an exporter field (canonical name) feeds the schema."""
    return (
        name in METRICS
        or name in PCIE_SPEEDS
        or name in {c for c, _ in CLOCKS}
        or name in (ACCUMULATION, AFID, _FREE)
        or _residency_cause(name) is not None
    )


def _residency_cause(name: str) -> str | None:
    """The cause of a ``gpu_violation_<cause>_residency_*`` field that names a throttling cause."""
    found = _RESIDENCY.match(name)
    return found[1] if found is not None and found[1] in RESIDENCY_CAUSES else None


def is_blank(value: float) -> bool:
    """amd-smi's "not available" markers (all bits set in 16, 32 or 64 bits), NaN and infinities."""
    return math.isnan(value) or math.isinf(value) or value in _NA


def model_of(labels: dict[str, str]) -> str:
    """``AMD Instinct MI300X`` from ``card_series`` (or ``card_model``); the series as printed where it names no
    Instinct generation; a compute partition's type is appended (``AMD Instinct MI300X CPX``)."""
    series = labels.get("card_series", "")
    # the last generation named: "Aldebaran/MI200 [Instinct MI210" (amd-smi's market name) is an MI210
    found = _MI.findall(series) or _MI.findall(labels.get("card_model", ""))
    model = f"AMD Instinct {found[-1].upper()}" if found else (series or "AMD GPU")
    partition = labels.get("gpu_compute_partition_type", "").lower()
    return model if partition in WHOLE else f"{model} {partition.upper()}"


def identity(labels: dict[str, str], default_node: str) -> tuple[str, str, int] | None:
    """(node, uuid, index) of a series; None when nothing names its GPU."""
    index = labels.get("gpu_id", "")
    uuid = labels.get("gpu_uuid", "")
    serial = labels.get("serial_number", "")
    if not uuid and serial and index.isdigit():
        uuid = f"{serial}/{index}"
    if not uuid:
        return None
    return labels.get("hostname") or default_node, uuid, int(index) if index.isdigit() else 0


def pcie_generation(gt_per_s: float) -> int | None:
    """The PCIe generation of a transfer rate in GT/s (an MT/s value, 32000, is read as 32 GT/s)."""
    rate = gt_per_s / 1000.0 if gt_per_s >= 1000.0 else gt_per_s
    return PCIE_GENERATIONS.get(rate)


@dataclass
class ScrapeStats:
    """Counts over every scrape; ``samples`` = mapped + unmapped + unknown + blank + anonymous + unconvertible."""

    samples: int = 0
    mapped: int = 0
    #: documented by AMD, deliberately not mapped (:data:`NOT_MAPPED`)
    unmapped: int = 0
    #: not in the exporter's documented field list (a newer exporter?): counted, named once in the log
    unknown: int = 0
    blank: int = 0
    #: series that name no GPU (no gpu_uuid, no serial_number)
    anonymous: int = 0
    #: values with no meaning in the schema's unit (a PCIe rate that is no generation's)
    unconvertible: int = 0
    unknown_names: set[str] = field(default_factory=set)
    #: other things already said once in the log (amd-smi: a value in a unit its field does not come in)
    told: set[str] = field(default_factory=set)


@dataclass
class ExporterState:
    """What a source remembers between scrapes: each GPU's last AFIDs and its residency counters."""

    afids: dict[str, frozenset[tuple[int, str]]] = field(default_factory=dict)
    #: (uuid, cause) -> (accumulation counter, residency counter) of the previous scrape
    residency: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


@dataclass
class _Gpu:
    node: str
    uuid: str
    index: int
    model: str
    whole: bool
    metrics: dict[str, float] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    clocks: dict[str, list[float]] = field(default_factory=dict)
    percentages: dict[str, float] = field(default_factory=dict)
    accumulated: dict[str, float] = field(default_factory=dict)
    accumulation: float | None = None
    afids: set[tuple[int, str]] = field(default_factory=set)
    free_bytes: float | None = None


def _classify(name: str, stats: ScrapeStats) -> bool:
    """Whether a series feeds the schema; counts and logs the ones that do not."""
    if is_mapped(name):
        return True
    if not_mapped_reason(name) is not None:
        stats.unmapped += 1
    else:
        stats.unknown += 1
        if name not in stats.unknown_names:
            stats.unknown_names.add(name)
            log.info("amd-exporter: %s is not in the exporter's documented field list; counted, not mapped", name)
    return False


def _take(gpu: _Gpu, s: PromSample, name: str, labels: dict[str, str], stats: ScrapeStats) -> None:
    """One series' value into its GPU's readings."""
    value = s.value
    if name in METRICS:
        target, factor, rank = METRICS[name]
        if target in _NO_ZERO and value == 0:
            stats.blank += 1
            return
        if rank <= gpu.ranks.get(target, rank):  # else a preferred field already gave it
            gpu.metrics[target], gpu.ranks[target] = value * factor, rank
    elif name in PCIE_SPEEDS:
        generation = pcie_generation(value)
        if generation is None:
            stats.unconvertible += 1
            return
        gpu.metrics[PCIE_SPEEDS[name]] = float(generation)
    elif name in ("gpu_clock", "gpu_max_clock"):
        targets = CLOCKS.get((name, labels.get("clock_type", "").lower()))
        if targets is None:  # the data fabric's, video, SoC clocks: no field in the schema
            stats.unmapped += 1
            return
        for target in targets:
            gpu.clocks.setdefault(target, []).append(value)
    elif name == _FREE:
        gpu.free_bytes = value * _MIB
    elif name == ACCUMULATION:
        gpu.accumulation = value
    elif name == AFID:
        if value > 0:
            gpu.afids.add((int(value), labels.get("severity", "unknown")))
    else:
        found = _RESIDENCY.match(name)
        assert found is not None  # is_mapped said so
        (gpu.percentages if found[2] == "percentage" else gpu.accumulated)[found[1]] = value
    stats.mapped += 1


def throttle_mask(gpu: _Gpu, state: ExporterState) -> int | None:
    """The clocks-event reasons that held this GPU's clocks during the interval; None where the exporter gives no
    residency at all (not the same as "none": that is 0). Percentages where printed (bare metal), else the
    accumulated residency counters' growth against the accumulation counter's since the previous scrape."""
    known = False
    mask = 0
    for cause, bit in RESIDENCY_CAUSES.items():
        if cause in gpu.percentages:
            known = True
            mask |= bit if gpu.percentages[cause] > 0 else 0
            continue
        if cause not in gpu.accumulated or gpu.accumulation is None:
            continue
        key = (gpu.uuid, cause)
        previous = state.residency.get(key)
        state.residency[key] = (gpu.accumulation, gpu.accumulated[cause])
        if previous is None or gpu.accumulation <= previous[0] or gpu.accumulated[cause] < previous[1]:
            continue  # first scrape, or the counters were reset: the interval's residency is unknown
        known = True
        mask |= bit if gpu.accumulated[cause] > previous[1] else 0
    return mask if known else None


def _finish(gpu: _Gpu, state: ExporterState) -> dict[str, float]:
    """The GPU's fields: clocks folded, memory total filled, throttling, the catalogue's limits."""
    m = gpu.metrics
    for target, values in gpu.clocks.items():
        m[target] = max(values) if target.endswith("_max_mhz") else sum(values) / len(values)
    if "memory_total_bytes" not in m and gpu.free_bytes is not None and "memory_used_bytes" in m:
        m["memory_total_bytes"] = m["memory_used_bytes"] + gpu.free_bytes
    mask = throttle_mask(gpu, state)
    if mask is not None:
        m["throttle_reasons_mask"] = float(mask)
    spec = catalogue.lookup(gpu.model) if gpu.whole else None
    if spec is not None:
        for name, value in spec.limit_metrics().items():
            if name != "nvlink_links_max":  # nothing reports active links: no NVLink-style count to compare with
                m.setdefault(name, value)
    return m


def _events(gpu: _Gpu, cluster: str, ts_ns: int, state: ExporterState) -> list[GpuEvent]:
    """An ``afid`` event per AFID that was not among the GPU's AFIDs at the previous scrape."""
    now = frozenset(gpu.afids)
    previous = state.afids.get(gpu.uuid)
    state.afids[gpu.uuid] = now
    started = " (seen when the collector started)" if previous is None else ""
    return [
        GpuEvent(cluster, gpu.node, gpu.uuid, gpu.index, ts_ns, EventKind.AFID, code, describe(code, label) + started)
        for code, label in sorted(now - (previous or frozenset()))
    ]


def to_batches(
    samples: list[PromSample],
    cluster: str,
    default_node: str,
    ts_ns: int,
    state: ExporterState,
    stats: ScrapeStats | None = None,
) -> list[SampleBatch]:
    """One SampleBatch per node of a scrape; ``state`` carries AFIDs and residency counters to the next one."""
    stats = stats if stats is not None else ScrapeStats()
    gpus: dict[str, _Gpu] = {}
    for s in samples:
        stats.samples += 1
        name = canonical(s.name)
        if not _classify(name, stats):
            continue
        labels = {k.lower(): v for k, v in s.labels.items()}
        ident = identity(labels, default_node)
        if ident is None:
            stats.anonymous += 1
            continue
        if is_blank(s.value):
            stats.blank += 1
            continue
        gpu = gpus.get(ident[1])
        if gpu is None:
            partition = labels.get("gpu_compute_partition_type", "").lower()
            gpu = gpus[ident[1]] = _Gpu(*ident, model_of(labels), partition in WHOLE)
        _take(gpu, s, name, labels, stats)
    per_node: dict[str, tuple[list[GpuSample], list[GpuEvent]]] = {}
    for gpu in gpus.values():
        node_samples, node_events = per_node.setdefault(gpu.node, ([], []))
        node_events.extend(_events(gpu, cluster, ts_ns, state))
        if not (gpu.metrics or gpu.clocks or gpu.percentages or gpu.accumulated):
            continue  # nothing read (its only series had no value): the catalogue's limits alone say nothing
        metrics = _finish(gpu, state)
        node_samples.append(GpuSample(cluster, gpu.node, gpu.uuid, gpu.index, gpu.model, ts_ns, metrics))
    return [SampleBatch(cluster, node, tuple(s), tuple(e)) for node, (s, e) in sorted(per_node.items()) if s or e]


def _http_get(url: str, timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise SourceUnavailable(f"cannot scrape {url}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class AmdExporterConfig:
    """The ``amd-exporter`` source's settings."""

    url: str = "http://127.0.0.1:5000/metrics"
    cluster: str = from_section(Settings, "cluster")
    #: the node of series without a ``hostname`` label; empty: this host's name
    node: str = ""
    timeout_s: float = from_section(CollectorSettings, "scrape_timeout_s")


class AmdExporterSource:
    """Scrapes one AMD device-metrics-exporter per round (``fetch`` is injectable; plain HTTP GET by default)."""

    name = "amd-exporter"
    fields = FIELDS
    Config = AmdExporterConfig

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> AmdExporterConfig:
        c = settings.collector
        config = AmdExporterConfig(cluster=settings.cluster, node=c.node or "", timeout_s=c.scrape_timeout_s)
        return with_options(config, options, "the amd-exporter source")

    @classmethod
    def validate(cls, config: AmdExporterConfig) -> None:
        """An http(s) URL, a positive timeout, names that fit a Kafka key; nothing is scraped."""
        if not config.url.startswith(("http://", "https://")):
            raise ConfigError(f"invalid configuration: --url must be an http:// or https:// URL, got {config.url!r}")
        if not config.timeout_s > 0:
            raise ConfigError(f"invalid configuration: amd-exporter timeout must be > 0 s, got {config.timeout_s}")
        check_names(cls.name, config.cluster, config.node)

    @classmethod
    def from_config(
        cls, config: AmdExporterConfig, fetch: Callable[[str, float], bytes] | None = None
    ) -> AmdExporterSource:
        node = config.node or socket.gethostname()
        return cls(config.url, config.cluster, node, timeout_s=config.timeout_s, fetch=fetch or _http_get)

    def __init__(
        self,
        url: str,
        cluster: str,
        node: str,
        *,
        timeout_s: float = 5.0,
        fetch: Callable[[str, float], bytes] = _http_get,
    ) -> None:
        self.url, self.cluster, self.node = url, cluster, node
        self._timeout = timeout_s
        self._fetch = fetch
        self._state = ExporterState()
        self._gpus: dict[str, tuple[TopologyGpu, ...]] = {}
        self.scrape_stats = ScrapeStats()

    def open(self) -> None:
        """Nothing to connect: an unreachable exporter is a transient failure of each round, not a start error."""

    def collect(self, ts_ns: int) -> list[SampleBatch]:
        body = self._fetch(self.url, self._timeout)
        try:
            samples = parse_exposition(body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise BadSourceData("malformed", f"not UTF-8 text: {exc}", body, self.url) from exc
        except DecodeError as exc:
            raise BadSourceData(exc.reason, exc.detail, body, self.url) from exc
        batches = to_batches(samples, self.cluster, self.node, ts_ns, self._state, self.scrape_stats)
        self._gpus = {
            b.node: tuple(TopologyGpu(s.gpu_uuid, s.gpu_index, s.gpu_model, "") for s in b.samples) for b in batches
        }
        return batches

    def topologies(self, ts_ns: int) -> list[NodeTopology]:
        """Only the GPUs (the exporter names no PCI bus and no XGMI peers), for the node of the last scrape."""
        if not self._gpus:
            return []
        node = self.node if self.node in self._gpus else next(iter(self._gpus))
        return [NodeTopology(self.cluster, node, ts_ns, self._gpus[node])]

    def stats(self) -> dict[str, int]:
        s = self.scrape_stats
        return {
            "scraped_series": s.samples,
            "mapped_series": s.mapped,
            "unmapped_series": s.unmapped,
            "unknown_series": s.unknown,
            "blank_values": s.blank,
            "anonymous_series": s.anonymous,
            "unconvertible_values": s.unconvertible,
        }

    def close(self) -> None:
        """Nothing held between scrapes."""
