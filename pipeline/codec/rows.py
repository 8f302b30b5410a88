"""One sample, GPU event, NIC reading, NVLink and process as the wire holds them, both ways, and the checks every
decoder applies: a broken item is a :class:`Rejected`, never an exception for its neighbours.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Final, cast

import msgpack

from pipeline.errors import DecodeError, InvalidEvent
from pipeline.events import (
    METRIC_INDEX,
    NIC_NAMES,
    SCHEMA_VERSION,
    UNIT_ALIASES,
    EventKind,
    GpuEvent,
    GpuProcess,
    GpuSample,
    NicSample,
    NvLinkSample,
    Verdict,
)

CONTENT_TYPE: Final = b"application/vnd.hermeneut.v1+msgpack"


#: integers the pipeline holds in int64 columns (timestamps, counters) must fit one; msgpack carries up to 2**64-1
INT64_MAX: Final = 2**63 - 1


#: a GPU index (MIG instances included) and a NIC port number are small; bounded so no column overflows
INDEX_MAX: Final = 2**31 - 1


#: NVLink numbers: NVML has at most 18 per GPU today; the schema allows up to nvlink_links_max's 64
_LINKS_MAX: Final = 64


_KNOWN_METRICS: Final = frozenset(METRIC_INDEX) | frozenset(UNIT_ALIASES)


VERDICTS: Final = {v.value: v for v in Verdict}


_EVENT_KINDS: Final = {k.value: k for k in EventKind}


_KNOWN_NIC_METRICS: Final = frozenset(NIC_NAMES)


@dataclass(frozen=True, slots=True)
class Rejected:
    """One sample (or event, or NIC reading; the whole message when ``position`` is None) that failed decoding
    or validation. ``part`` says which list of the node message ``position`` indexes."""

    reason: str
    detail: str
    position: int | None = None
    gpu_uuid: str | None = None
    part: str = "sample"


def link_row(link: NvLinkSample) -> list[Any]:
    return [
        link.link,
        link.active,
        link.tx_bytes_per_second,
        link.rx_bytes_per_second,
        link.crc_errors_total,
        link.replay_errors_total,
        link.recovery_errors_total,
        link.remote_pci_bus_id,
    ]


def proc_row(p: GpuProcess) -> list[Any]:
    return [p.pid, p.name, p.used_memory_bytes, p.kind]


def sample_dict(s: GpuSample) -> dict[str, Any]:
    out = {"uuid": s.gpu_uuid, "index": s.gpu_index, "model": s.gpu_model, "ts_ns": s.ts_ns, "m": dict(s.metrics)}
    if s.links is not None:
        out["links"] = [link_row(link) for link in s.links]
    if s.processes is not None:
        out["procs"] = [proc_row(p) for p in s.processes]
    return out


def event_row(e: GpuEvent) -> list[Any]:
    return [e.gpu_uuid, e.gpu_index, e.ts_ns, e.kind.value, e.code, e.detail]


def nic_row(n: NicSample) -> list[Any]:
    return [n.device, n.port, n.ts_ns, n.metrics]


def unpack(payload: bytes, identity: bool = True) -> dict[str, Any]:
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for broken input
        raise DecodeError("malformed", f"not MessagePack ({type(exc).__name__}: {exc})"[:200]) from exc
    if not isinstance(obj, dict):
        raise DecodeError("malformed", f"expected a map, got {type(obj).__name__}")
    version = obj.get("v")
    if type(version) is not int:
        raise DecodeError("malformed", "schema version 'v' missing or not an integer")
    if version != SCHEMA_VERSION:
        raise DecodeError("unknown_schema_version", f"schema version {version}, this processor knows {SCHEMA_VERSION}")
    for key in ("cluster", "node") if identity else ():
        value = obj.get(key)
        if type(value) is not str or not value:
            raise DecodeError("wrong_type", f"'{key}' must be a non-empty string")
    return obj


NUMBER_TYPES: Final = frozenset({float, int})


def _check_metrics(metrics: Any) -> InvalidEvent | None:
    """Names known and values numbers (bool is not), each field once; set operations keep this off a per-field
    Python loop. NaN and infinities are plausibility, checked vectorized by the processor."""
    if type(metrics) is not dict:
        return InvalidEvent("wrong_type", "'m' (metrics) must be a map")
    if not NUMBER_TYPES.issuperset(map(type, metrics.values())):
        name, value = next((k, v) for k, v in metrics.items() if type(v) not in NUMBER_TYPES)
        return InvalidEvent("wrong_type", f"{name!r} must be a number, got {type(value).__name__}")
    return unknown_metric(metrics) or duplicate(metrics)


def unknown_metric(names: Collection[Any]) -> InvalidEvent | None:
    """The first name outside the schema (and its unit aliases), if any."""
    if _KNOWN_METRICS.issuperset(names):
        return None
    # keys may be str or bytes (MessagePack allows both): name the first unknown one without sorting them
    unknown = next(k for k in names if k not in _KNOWN_METRICS)
    return InvalidEvent("unknown_field", f"unknown metric {unknown!r}")


def duplicate(names: Collection[str]) -> InvalidEvent | None:
    """A field sent in its canonical unit and as an alias (or as two aliases): which value is meant cannot be
    told, so the sample is refused rather than one value silently winning."""
    aliases = UNIT_ALIASES.keys() & names
    seen: dict[str, str] = {}
    for alias in sorted(aliases):
        canonical = UNIT_ALIASES[alias][0]
        other = canonical if canonical in names else seen.get(canonical)
        if other is not None:
            return InvalidEvent("duplicate_field", f"{canonical} sent twice: as {other!r} and as {alias!r}")
        seen[canonical] = alias
    return None


def int_in(value: Any, low: int, high: int) -> bool:
    """An int (bool is not) with ``low <= value <= high``."""
    return type(value) is int and low <= value <= high


def _opt(value: Any, kind: type, what: str) -> Any:
    if value is None or type(value) is kind or (kind is float and type(value) is int):
        return value
    raise InvalidEvent("wrong_type", f"{what} must be {kind.__name__} or nil, got {type(value).__name__}")


def decode_links(raw: Any) -> tuple[NvLinkSample, ...] | None:
    if raw is None:
        return None
    if type(raw) is not list:
        raise InvalidEvent("wrong_type", "'links' must be a list")
    links = []
    for row in raw:
        if type(row) is not list or len(row) != 8 or type(row[0]) is not int or type(row[1]) is not bool:
            raise InvalidEvent("wrong_type", "a link must be [link, active, tx, rx, crc, replay, recovery, remote]")
        if not 0 <= row[0] < _LINKS_MAX:
            raise InvalidEvent("out_of_range", f"link number {row[0]} outside [0, {_LINKS_MAX})")
        tx, rx = (_opt(v, float, "link throughput") for v in row[2:4])
        crc, replay, recovery = (_opt(v, int, "link error counter") for v in row[4:7])
        for value in (tx, rx, crc, replay, recovery):
            if value is not None and not 0 <= value <= INT64_MAX:
                raise InvalidEvent("out_of_range", f"link {row[0]} value {value!r} is not a non-negative number")
        links.append(NvLinkSample(row[0], row[1], tx, rx, crc, replay, recovery, _opt(row[7], str, "link remote")))
    return tuple(links)


def decode_processes(raw: Any) -> tuple[GpuProcess, ...] | None:
    if raw is None:
        return None
    if type(raw) is not list:
        raise InvalidEvent("wrong_type", "'procs' must be a list")
    procs = []
    for row in raw:
        if type(row) is not list or len(row) != 4 or type(row[0]) is not int or type(row[1]) is not str:
            raise InvalidEvent("wrong_type", "a process must be [pid, name, used_memory_bytes, kind]")
        memory = _opt(row[2], int, "process memory")
        if row[0] < 0 or (memory is not None and memory < 0):
            raise InvalidEvent("negative", f"process {row[0]} has a negative pid or memory")
        if row[0] > INT64_MAX or (memory is not None and memory > INT64_MAX):
            raise InvalidEvent("out_of_range", f"process {row[0]}: pid or memory beyond int64")
        procs.append(GpuProcess(row[0], row[1], memory, _opt(row[3], str, "process kind") or "compute"))
    return tuple(procs)


def decode_event(raw: Any, cluster: str, node: str) -> GpuEvent:
    if type(raw) is not list or len(raw) != 6:
        raise InvalidEvent("wrong_type", "an event must be [uuid, index, ts_ns, kind, code, detail]")
    uuid, index, ts_ns, kind, code, detail = raw
    if type(uuid) is not str or not uuid or type(index) is not int or type(ts_ns) is not int:
        raise InvalidEvent("wrong_type", "an event needs a uuid string, an integer index and integer ts_ns")
    if not (0 <= index <= INDEX_MAX and 0 <= ts_ns <= INT64_MAX):
        raise InvalidEvent("out_of_range", f"event index {index} or ts_ns {ts_ns} out of range")
    # a map or list is not hashable: test the type before looking the kind up
    if type(kind) is not str or kind not in _EVENT_KINDS:
        raise InvalidEvent("unknown_field", f"unknown event kind {kind!r}"[:200])
    if not int_in(code, 0, INT64_MAX) or type(detail) is not str:
        raise InvalidEvent("wrong_type", "an event's code must be a non-negative int64 and detail a string")
    return GpuEvent(cluster, node, uuid, index, ts_ns, _EVENT_KINDS[kind], code, detail[:500])


def decode_nic(raw: Any, cluster: str, node: str) -> NicSample:
    if type(raw) is not list or len(raw) != 4:
        raise InvalidEvent("wrong_type", "a NIC reading must be [device, port, ts_ns, metrics]")
    device, port, ts_ns, metrics = raw
    if type(device) is not str or not device or type(port) is not int or type(ts_ns) is not int:
        raise InvalidEvent("wrong_type", "a NIC reading needs a device name, an integer port and integer ts_ns")
    if not (0 <= port <= INDEX_MAX and 0 <= ts_ns <= INT64_MAX):
        raise InvalidEvent("out_of_range", f"NIC port {port} or ts_ns {ts_ns} out of range")
    if type(metrics) is not dict or not NUMBER_TYPES.issuperset(map(type, metrics.values())):
        raise InvalidEvent("wrong_type", "NIC metrics must be a map of numbers")
    if not _KNOWN_NIC_METRICS.issuperset(metrics):
        unknown = next(k for k in metrics if k not in _KNOWN_NIC_METRICS)
        raise InvalidEvent("unknown_field", f"unknown NIC metric {unknown!r}")
    return NicSample(cluster, node, device, port, ts_ns, metrics)


def decode_sample(raw: Any, cluster: str, node: str) -> GpuSample:
    if type(raw) is not dict:
        raise InvalidEvent("wrong_type", "a sample must be a map")
    uuid, index, model, ts_ns = raw.get("uuid"), raw.get("index"), raw.get("model"), raw.get("ts_ns")
    if type(uuid) is not str or not uuid:
        raise InvalidEvent("wrong_type", "'uuid' must be a non-empty string")
    if type(index) is not int or index < 0:
        raise InvalidEvent("wrong_type", "'index' must be a non-negative integer")
    if index > INDEX_MAX:
        raise InvalidEvent("out_of_range", f"'index' {index} is beyond {INDEX_MAX}")
    if type(model) is not str:
        raise InvalidEvent("wrong_type", "'model' must be a string")
    if type(ts_ns) is not int:
        raise InvalidEvent("wrong_type", "'ts_ns' must be an integer (UTC epoch nanoseconds)")
    # held in int64 columns from here on: a larger value must be refused here, not overflow a whole batch later
    if not 0 <= ts_ns <= INT64_MAX:
        raise InvalidEvent("out_of_range", f"'ts_ns' {ts_ns} is not an int64 epoch time in nanoseconds")
    metrics = raw.get("m")
    problem = _check_metrics(metrics)
    if problem is not None:
        raise problem
    links = decode_links(raw.get("links"))
    processes = decode_processes(raw.get("procs"))
    return GpuSample(cluster, node, uuid, index, model, ts_ns, cast("dict[str, float]", metrics), links, processes)


def optional_list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key, [])
    if type(value) is not list:
        raise DecodeError("wrong_type", f"'{key}' must be a list")
    return value


STR: Final = frozenset({str})


OPTIONAL_STR: Final = frozenset({str, type(None)})
