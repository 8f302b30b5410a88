"""dcgm-exporter as a source: its ``/metrics`` (Prometheus text exposition) turned into the same SampleBatches.

A cluster that already runs NVIDIA's dcgm-exporter can feed hermeneut without a new agent on the GPU nodes.
Emits one :class:`SampleBatch` per node (``hostname`` or ``Hostname`` label, else the configured node) per scrape,
with the METRIC_FIELDS the exporter's counters map to, and an ``XID`` :class:`GpuEvent` whenever the last XID seen
(``DCGM_FI_DEV_XID_ERROR``, before 4.9.0 ``..._XID_ERRORS``) changes. The names of every exporter generation and
their units (legacy MHz, mJ, percent, MiB; 4.9.0's Hz, J, 0-1 ratios, bytes; 4.10.0's ``*_BYTES_PER_SECOND``) are
one table, :mod:`producers.dcgm_names`, recognised per series: a scrape mid-upgrade may hold both, and where one
GPU reports a quantity under two names the newest is kept and the other counted (``duplicate_series``).

- Labels: ``gpu`` (index), ``UUID``, ``modelName``, ``pci_bus_id``, ``hostname``/``Hostname``, the driver
  version (``DCGM_FI_SYSTEM_DRIVER_VERSION``, before 4.9.0 ``DCGM_FI_DRIVER_VERSION``: the topology's
  ``driver_version``), and the workload labels ``pod``, ``namespace``, ``container``, ``hpc_job``, which importers
  read (:func:`workload_labels`); a MIG instance carries ``GPU_I_PROFILE`` and ``GPU_I_ID`` and becomes its own
  sample with uuid ``MIG-<parent uuid>/<instance id>`` (dcgm-exporter does not expose NVML's MIG uuid) and model
  ``<model> MIG <profile>``.
- DCGM's "blank" values (``DCGM_INT64_BLANK`` = 0x7ffffffffffffff0 and up, ``DCGM_FP64_BLANK`` = 2^47 and up,
  e.g. the 9223372036854775794 = NOT_SUPPORTED that dcgm-exporter prints for an HBM temperature a board lacks)
  and NaN mean "no value": the field is absent, never a huge number or zero.
- Limits the default counters do not carry (power limit, max clocks, thresholds, max PCIe link) come from the
  GPU catalogue by model, only where the exporter does not report them; memory total is the exporter's (4.9.0
  collects ``DCGM_FI_DEV_FB_CAPACITY_BYTES``), else used + free + reserved.
- Metrics we do not map are counted (``unmapped_series``): those the table knows to have no place in the schema
  (encoder load, the vGPU licence, ...) as ``ignored_series``, any other name is named once in the log and
  counted in ``unknown_fields``. Text that is not valid exposition format is an error naming the line
  (``BadSourceData``, which the agent dead-letters with the original bytes).

The parser is a small strict one written here (one regex per sample line, escapes per the format spec): a new
dependency for one function was not worth it, and it gives line numbers and rejects what a lenient parser
would guess at.
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
from pipeline.config import CollectorSettings, Settings
from pipeline.errors import BadSourceData, ConfigError, DecodeError, SourceUnavailable
from pipeline.events import METRIC_FIELDS, EventKind, GpuEvent, GpuSample, SampleBatch
from pipeline.registry import from_section, with_options
from pipeline.topology import NodeTopology, TopologyGpu
from producers.dcgm_names import DRIVER_LABELS, FREE, HOST_LABELS, IGNORED, NAMES, XID, Name, first_label
from producers.nvml.readings import sysfs_bus_id
from producers.source import check_names

log = logging.getLogger(__name__)

_INT64_BLANK: Final = float(0x7FFFFFFFFFFFFFF0)
_FP64_BLANK: Final = 140737488355328.0
_INT32_BLANK: Final = 0x7FFFFFF0
_TYPES: Final = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})

#: every metric name the mapping reads, of every generation (what an import asks a Prometheus server for)
READ_METRICS: Final = tuple(NAMES)
#: what the counters map to, and the limits the GPU catalogue fills in where the exporter does not report them
FIELDS: Final = frozenset(n.field for n in NAMES.values() if n.field not in (XID, FREE)) | frozenset(
    f.name for f in METRIC_FIELDS if f.limit
)


@dataclass(frozen=True, slots=True)
class PromSample:
    """One sample line of an exposition: name, labels, value, the line it came from, and its timestamp (ms since
    the epoch) when the line carries one."""

    name: str
    labels: dict[str, str]
    value: float
    line: int
    ts_ms: int | None = None


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE: Final = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL: Final = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES: Final = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _float(text: str) -> float:
    if text in ("+Inf", "Inf"):
        return math.inf
    if text == "-Inf":
        return -math.inf
    if text == "NaN":
        return math.nan
    # one way to split the digits (not \d+\.?\d*, which backtracks quadratically on a long run of digits)
    if not re.fullmatch(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?", text):
        raise ValueError(text)
    return float(text)


def _labels(text: str, number: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    position = 0
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None:
            raise DecodeError("malformed", f"line {number}: bad label set {{{text[:80]}}}")
        name = match.group(1)
        if name in labels:
            raise DecodeError("malformed", f"line {number}: label {name} given twice")
        labels[name] = re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], match.group(2))
        position = match.end()
        if not match.group(3):
            break
    if text[position:].strip():
        raise DecodeError("malformed", f"line {number}: unexpected text after the labels")
    return labels


def parse_exposition(text: str) -> list[PromSample]:
    """Samples of a Prometheus text exposition; raises DecodeError("malformed", "line N: ...")."""
    out: list[PromSample] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 2 and parts[1] in ("HELP", "TYPE"):
                if len(parts) < 3 or not re.fullmatch(_NAME, parts[2]):
                    raise DecodeError("malformed", f"line {number}: # {parts[1]} needs a metric name")
                if parts[1] == "TYPE" and (len(parts) < 4 or parts[3].strip() not in _TYPES):
                    raise DecodeError("malformed", f"line {number}: unknown metric type in {line[:80]!r}")
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise DecodeError("malformed", f"line {number}: not a sample: {line[:80]!r}")
        labels = _labels(match.group(2) or "", number)
        try:
            value = _float(match.group(3))
        except ValueError:
            raise DecodeError("malformed", f"line {number}: {match.group(3)[:40]!r} is not a number") from None
        series = (match.group(1), tuple(sorted(labels.items())))
        if series in seen:
            raise DecodeError("malformed", f"line {number}: {match.group(1)} repeats a series already given")
        seen.add(series)
        stamp = match.group(4)
        out.append(PromSample(match.group(1), labels, value, number, None if stamp is None else int(stamp)))
    return out


def is_blank(value: float) -> bool:
    """DCGM's "no value" markers (BLANK, NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED), NaN and infinities."""
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        return True
    if value >= _FP64_BLANK:  # covers DCGM_INT64_BLANK and up as well
        return True
    return value.is_integer() and _INT32_BLANK <= value < _INT32_BLANK + 16


@dataclass
class ScrapeStats:
    """What the series of the scrapes became; ``samples`` is the sum of the other counts and the values used."""

    samples: int = 0
    #: series whose metric the mapping does not read: ``ignored`` (known, no place in the schema) or not known
    unmapped: int = 0
    ignored: int = 0
    blank: int = 0
    #: series without a UUID or gpu label (cannot be tied to a GPU)
    anonymous: int = 0
    #: a quantity the same GPU also reported under a preferred name (a scrape mid-upgrade has both)
    duplicate: int = 0
    #: the metric names not known, each named once in the log
    unknown: set[str] = field(default_factory=set)


@dataclass
class _Gpu:
    node: str
    uuid: str
    index: int
    model: str
    parent_uuid: str | None
    #: (field, part) -> (rank of the name it came from, value in the schema's unit)
    readings: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)

    def take(self, name: Name, value: float) -> bool:
        """Keeps ``value`` unless a preferred name of the same quantity gave one; False when a value is dropped
        (this one, or the one it replaces). Series of one name add up in a summed field's part."""
        key = (name.field, name.part)
        held = self.readings.get(key)
        converted = value * name.factor
        if held is None:
            self.readings[key] = (name.rank, converted)
            return True
        if held[0] < name.rank:
            return False
        if held[0] == name.rank and name.part:
            self.readings[key] = (name.rank, held[1] + converted)
            return True
        self.readings[key] = (name.rank, converted)
        return False

    def metrics(self) -> tuple[dict[str, float], float | None, float | None]:
        """The schema fields (parts summed), free memory in bytes and the last XID."""
        out: dict[str, float] = {}
        for (name, _), (_, value) in self.readings.items():
            out[name] = out.get(name, 0.0) + value
        return out, out.pop(FREE, None), out.pop(XID, None)


def _identity(labels: dict[str, str], default_node: str) -> tuple[str, str, int, str, str | None] | None:
    uuid, index = labels.get("UUID"), labels.get("gpu")
    if not uuid or index is None or not index.isdigit():
        return None
    model = labels.get("modelName", "")
    node = first_label(labels, HOST_LABELS) or default_node
    profile, instance = labels.get("GPU_I_PROFILE"), labels.get("GPU_I_ID")
    if profile and instance:
        return node, f"MIG-{uuid}/{instance}", int(index), f"{model} MIG {profile}".strip(), uuid
    return node, uuid, int(index), model, None


#: dcgm-exporter's workload labels: Kubernetes (its pod-resources mapping) and HPC (its job-mapping directory)
WORKLOAD_LABELS: Final = ("pod", "namespace", "container", "hpc_job")


def workload_labels(samples: list[PromSample], default_node: str) -> dict[str, dict[str, str]]:
    """Per GPU (as :func:`to_batches` names it), the workload labels its series carry."""
    out: dict[str, dict[str, str]] = {}
    for s in samples:
        found = {k: s.labels[k] for k in WORKLOAD_LABELS if s.labels.get(k)}
        ident = _identity(s.labels, default_node) if found else None
        if ident is not None:
            out.setdefault(ident[1], {}).update(found)
    return out


def _fill_from_catalogue(gpu: _Gpu, metrics: dict[str, float]) -> None:
    spec = catalogue.lookup(gpu.model)
    if spec is None:
        return
    if gpu.parent_uuid is not None:
        found = catalogue.mig_profile(gpu.model)
        if found is not None:
            metrics.setdefault("memory_total_bytes", float(found[0].memory_bytes))
        return
    for name, value in spec.limit_metrics().items():
        metrics.setdefault(name, value)


def _unmapped(metric: str, stats: ScrapeStats) -> None:
    stats.unmapped += 1
    if metric in IGNORED:
        stats.ignored += 1
    elif metric not in stats.unknown:
        stats.unknown.add(metric)
        log.warning("dcgm-exporter: %s is not a field hermeneut knows; its series are counted as unmapped", metric)


def to_batches(
    samples: list[PromSample],
    cluster: str,
    default_node: str,
    ts_ns: int,
    last_xid: dict[str, float],
    stats: ScrapeStats | None = None,
) -> list[SampleBatch]:
    """One SampleBatch per node; ``last_xid`` (uuid -> last XID value seen) is updated in place."""
    stats = stats if stats is not None else ScrapeStats()
    gpus: dict[str, _Gpu] = {}
    for s in samples:
        stats.samples += 1
        name = NAMES.get(s.name)
        if name is None:
            _unmapped(s.name, stats)
            continue
        ident = _identity(s.labels, default_node)
        if ident is None:
            stats.anonymous += 1
            continue
        if is_blank(s.value):
            stats.blank += 1
            continue
        gpu = gpus.get(ident[1])
        if gpu is None:
            gpu = gpus[ident[1]] = _Gpu(*ident)
        if not gpu.take(name, s.value):
            stats.duplicate += 1
    per_node: dict[str, tuple[list[GpuSample], list[GpuEvent]]] = {}
    for gpu in gpus.values():
        m, free_bytes, xid = gpu.metrics()
        if "memory_total_bytes" not in m and free_bytes is not None and "memory_used_bytes" in m:
            m["memory_total_bytes"] = m["memory_used_bytes"] + free_bytes + m.get("memory_reserved_bytes", 0.0)
        _fill_from_catalogue(gpu, m)
        node_samples, node_events = per_node.setdefault(gpu.node, ([], []))
        node_samples.append(GpuSample(cluster, gpu.node, gpu.uuid, gpu.index, gpu.model, ts_ns, m))
        if xid is not None:
            previous = last_xid.get(gpu.uuid)
            last_xid[gpu.uuid] = xid
            if xid > 0 and xid != previous:
                detail = "last XID when the collector started" if previous is None else ""
                node_events.append(
                    GpuEvent(cluster, gpu.node, gpu.uuid, gpu.index, ts_ns, EventKind.XID, int(xid), detail)
                )
    return [SampleBatch(cluster, node, tuple(s), tuple(e)) for node, (s, e) in sorted(per_node.items())]


def drivers(samples: list[PromSample], default_node: str) -> dict[str, str]:
    """Per node, the driver version its series carry as a label (either generation's name)."""
    out: dict[str, str] = {}
    for s in samples:
        version = first_label(s.labels, DRIVER_LABELS)
        if version:
            out.setdefault(first_label(s.labels, HOST_LABELS) or default_node, version)
    return out


def _http_get(url: str, timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise SourceUnavailable(f"cannot scrape {url}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class DcgmExporterConfig:
    """The ``dcgm-exporter`` source's settings."""

    url: str = from_section(CollectorSettings, "dcgm_exporter_url")
    cluster: str = from_section(Settings, "cluster")
    #: the node of series without a ``hostname``/``Hostname`` label; empty: this host's name
    node: str = ""
    timeout_s: float = from_section(CollectorSettings, "scrape_timeout_s")


class DcgmExporterSource:
    """Scrapes one dcgm-exporter per round (``fetch`` is injectable; plain HTTP GET by default)."""

    name = "dcgm-exporter"
    fields = FIELDS
    Config = DcgmExporterConfig

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> DcgmExporterConfig:
        c = settings.collector
        config = DcgmExporterConfig(c.dcgm_exporter_url, settings.cluster, c.node or "", c.scrape_timeout_s)
        return with_options(config, options, "the dcgm-exporter source")

    @classmethod
    def validate(cls, config: DcgmExporterConfig) -> None:
        """An http(s) URL, a positive timeout, names that fit a Kafka key; nothing is scraped."""
        if not config.url.startswith(("http://", "https://")):
            raise ConfigError(f"invalid configuration: --url must be an http:// or https:// URL, got {config.url!r}")
        if not config.timeout_s > 0:
            raise ConfigError(f"invalid configuration: dcgm-exporter timeout must be > 0 s, got {config.timeout_s}")
        check_names(cls.name, config.cluster, config.node)

    @classmethod
    def from_config(
        cls, config: DcgmExporterConfig, fetch: Callable[[str, float], bytes] | None = None
    ) -> DcgmExporterSource:
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
        self._last_xid: dict[str, float] = {}
        self._gpus: dict[str, tuple[TopologyGpu, ...]] = {}
        self._drivers: dict[str, str] = {}
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
        batches = to_batches(samples, self.cluster, self.node, ts_ns, self._last_xid, self.scrape_stats)
        buses = {s.labels["UUID"]: s.labels.get("pci_bus_id", "") for s in samples if "UUID" in s.labels}
        self._gpus = {b.node: self._topology_gpus(b, buses) for b in batches}
        self._drivers = drivers(samples, self.node)
        return batches

    @staticmethod
    def _topology_gpus(batch: SampleBatch, buses: dict[str, str]) -> tuple[TopologyGpu, ...]:
        out = []
        for s in batch.samples:
            parent = s.gpu_uuid.split("/", 1)[0].removeprefix("MIG-") if s.gpu_uuid.startswith("MIG-") else None
            bus = sysfs_bus_id(buses.get(parent or s.gpu_uuid, ""))
            out.append(TopologyGpu(s.gpu_uuid, s.gpu_index, s.gpu_model, bus, parent_uuid=parent))
        return tuple(out)

    def topologies(self, ts_ns: int) -> list[NodeTopology]:
        """Only the GPUs (dcgm-exporter exposes no interconnect), for the node of the last scrape."""
        gpus = self._gpus.get(self.node) or next(iter(self._gpus.values()), None)
        if not gpus:
            return []
        node = self.node if self.node in self._gpus else next(iter(self._gpus))
        return [NodeTopology(self.cluster, node, ts_ns, gpus, driver_version=self._drivers.get(node, ""))]

    def stats(self) -> dict[str, int]:
        s = self.scrape_stats
        return {
            "scraped_series": s.samples,
            "unmapped_series": s.unmapped,
            "ignored_series": s.ignored,
            "unknown_fields": len(s.unknown),
            "duplicate_series": s.duplicate,
            "blank_values": s.blank,
        }

    def close(self) -> None:
        """Nothing held between scrapes."""
