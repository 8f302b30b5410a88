"""Wire encoding of the schema: MessagePack, one message per node per sampling round.

Why MessagePack (``bench/codec.py``, numbers in the README): it keeps int64 timestamps and float64 values exact,
can carry NaN (so a NaN from a broken sensor reaches validation and the dead-letter topic instead of vanishing
as JSON ``null``), carries binary buffers, and is ~12% smaller than JSON after lz4. It is not faster than orjson
(encode ties, parsing is ~1.5x slower); that cost is small next to what the schema buys.

Raw samples come in two forms, both schema version 1. hermeneut's own producers write them *column-wise*: one
list per identity field (``uuid``, ``index``, ``model``, ``ts_ns``), the message's metric names once in ``fields``,
the readings in ``m`` as one little-endian float64 buffer (a row per sample, a column per name) and, only when
some sample lacks some field, ``unsent``: a byte per cell, non-zero where the field was not sent (a NaN that was
sent stays a reading). Anyone else may write them *row-wise*, a map per sample under ``samples`` (easy to write,
absent fields simply missing). The columns spare the processor a map, a key string and an object per value and an
object per sample: it builds its matrix straight from the buffers (:func:`decode_raw`, ``processors.normalize``),
and the message is 40% of the size. Interpreted
batches, written and read only by hermeneut stages, are column-wise too, with the numeric columns as float64
buffers, so neither the processor nor the sink builds a Python object per value.

Decoding is defensive: a message whose envelope is broken raises :class:`DecodeError` (the whole message is
dead-lettered); a message with some broken samples decodes into the good ones plus a :class:`Rejected` entry
per broken sample (or event, or NIC reading), so one bad GPU does not cost its node's other readings.

Low-rate records (workload context, topology, findings, ground truth) use :func:`encode_record` /
:func:`decode_record`: the dataclass's fields as a map, checked against its type hints on the way in.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from itertools import chain
from typing import Any, Final, TypeVar, cast

import msgpack
import numpy as np

from pipeline.errors import DecodeError, InvalidEvent
from pipeline.events import (
    METRIC_INDEX,
    METRIC_NAMES,
    NIC_NAMES,
    RELATIVE_FIELDS,
    SCHEMA_VERSION,
    UNIT_ALIASES,
    Driver,
    EventKind,
    GpuEvent,
    GpuProcess,
    GpuSample,
    InterpretedBatch,
    NicSample,
    NvLinkSample,
    SampleBatch,
    Verdict,
    Workload,
)

CONTENT_TYPE: Final = b"application/vnd.hermeneut.v1+msgpack"
#: integers the pipeline holds in int64 columns (timestamps, counters) must fit one; msgpack carries up to 2**64-1
INT64_MAX: Final = 2**63 - 1
#: a GPU index (MIG instances included) and a NIC port number are small; bounded so no column overflows
_INDEX_MAX: Final = 2**31 - 1
#: NVLink numbers: NVML has at most 18 per GPU today; the schema allows up to nvlink_links_max's 64
_LINKS_MAX: Final = 64
_KNOWN_METRICS: Final = frozenset(METRIC_INDEX) | frozenset(UNIT_ALIASES)
_VERDICTS: Final = {v.value: v for v in Verdict}
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


def _link_row(link: NvLinkSample) -> list[Any]:
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


def _proc_row(p: GpuProcess) -> list[Any]:
    return [p.pid, p.name, p.used_memory_bytes, p.kind]


def _sample_dict(s: GpuSample) -> dict[str, Any]:
    out = {"uuid": s.gpu_uuid, "index": s.gpu_index, "model": s.gpu_model, "ts_ns": s.ts_ns, "m": dict(s.metrics)}
    if s.links is not None:
        out["links"] = [_link_row(link) for link in s.links]
    if s.processes is not None:
        out["procs"] = [_proc_row(p) for p in s.processes]
    return out


def _event_row(e: GpuEvent) -> list[Any]:
    return [e.gpu_uuid, e.gpu_index, e.ts_ns, e.kind.value, e.code, e.detail]


def _nic_row(n: NicSample) -> list[Any]:
    return [n.device, n.port, n.ts_ns, n.metrics]


def sample_rows(batch: SampleBatch) -> dict[str, Any]:
    """The map a node message packs in the row-wise form: what other producers may write (module docstring)."""
    body: dict[str, Any] = {
        "v": batch.schema_version,
        "cluster": batch.cluster,
        "node": batch.node,
        "samples": [_sample_dict(s) for s in batch.samples],
    }
    return body | _extras(batch)


def _extras(batch: SampleBatch) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    if batch.events:
        extras["events"] = [_event_row(e) for e in batch.events]
    if batch.nics:
        extras["nics"] = [_nic_row(n) for n in batch.nics]
    return extras


def sample_columns(batch: SampleBatch) -> dict[str, Any]:
    """The map a node message packs, its samples column-wise (module docstring)."""
    samples = batch.samples
    fields = list(dict.fromkeys(chain.from_iterable(s.metrics for s in samples)))
    rows = [list(map(s.metrics.get, fields)) for s in samples]  # None where a sample lacks a field: NaN below
    body: dict[str, Any] = {
        "v": batch.schema_version,
        "cluster": batch.cluster,
        "node": batch.node,
        "uuid": [s.gpu_uuid for s in samples],
        "index": [s.gpu_index for s in samples],
        "model": [s.gpu_model for s in samples],
        "ts_ns": [s.ts_ns for s in samples],
        "fields": fields,
        "m": np.array(rows, dtype="<f8").tobytes(),
    }
    if any(len(s.metrics) != len(fields) for s in samples):
        body["unsent"] = np.array([[v is None for v in row] for row in rows], dtype=np.uint8).tobytes()
    if any(s.links is not None for s in samples):
        body["links"] = [None if s.links is None else [_link_row(link) for link in s.links] for s in samples]
    if any(s.processes is not None for s in samples):
        body["procs"] = [None if s.processes is None else [_proc_row(p) for p in s.processes] for s in samples]
    return body | _extras(batch)


def encode_samples(batch: SampleBatch) -> bytes:
    """A node message as hermeneut's producers send it: column-wise."""
    out: bytes = msgpack.packb(sample_columns(batch), use_bin_type=True)
    return out


def _unpack(payload: bytes, identity: bool = True) -> dict[str, Any]:
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


_NUMBER_TYPES: Final = frozenset({float, int})


def _check_metrics(metrics: Any) -> InvalidEvent | None:
    """Names known and values numbers (bool is not), each field once; set operations keep this off a per-field
    Python loop. NaN and infinities are plausibility, checked vectorized by the processor."""
    if type(metrics) is not dict:
        return InvalidEvent("wrong_type", "'m' (metrics) must be a map")
    if not _NUMBER_TYPES.issuperset(map(type, metrics.values())):
        name, value = next((k, v) for k, v in metrics.items() if type(v) not in _NUMBER_TYPES)
        return InvalidEvent("wrong_type", f"{name!r} must be a number, got {type(value).__name__}")
    return _unknown_metric(metrics) or _duplicate(metrics)


def _unknown_metric(names: Collection[Any]) -> InvalidEvent | None:
    """The first name outside the schema (and its unit aliases), if any."""
    if _KNOWN_METRICS.issuperset(names):
        return None
    # keys may be str or bytes (MessagePack allows both): name the first unknown one without sorting them
    unknown = next(k for k in names if k not in _KNOWN_METRICS)
    return InvalidEvent("unknown_field", f"unknown metric {unknown!r}")


def _duplicate(names: Collection[str]) -> InvalidEvent | None:
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


def _int_in(value: Any, low: int, high: int) -> bool:
    """An int (bool is not) with ``low <= value <= high``."""
    return type(value) is int and low <= value <= high


def _opt(value: Any, kind: type, what: str) -> Any:
    if value is None or type(value) is kind or (kind is float and type(value) is int):
        return value
    raise InvalidEvent("wrong_type", f"{what} must be {kind.__name__} or nil, got {type(value).__name__}")


def _decode_links(raw: Any) -> tuple[NvLinkSample, ...] | None:
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


def _decode_processes(raw: Any) -> tuple[GpuProcess, ...] | None:
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


def _decode_event(raw: Any, cluster: str, node: str) -> GpuEvent:
    if type(raw) is not list or len(raw) != 6:
        raise InvalidEvent("wrong_type", "an event must be [uuid, index, ts_ns, kind, code, detail]")
    uuid, index, ts_ns, kind, code, detail = raw
    if type(uuid) is not str or not uuid or type(index) is not int or type(ts_ns) is not int:
        raise InvalidEvent("wrong_type", "an event needs a uuid string, an integer index and integer ts_ns")
    if not (0 <= index <= _INDEX_MAX and 0 <= ts_ns <= INT64_MAX):
        raise InvalidEvent("out_of_range", f"event index {index} or ts_ns {ts_ns} out of range")
    # a map or list is not hashable: test the type before looking the kind up
    if type(kind) is not str or kind not in _EVENT_KINDS:
        raise InvalidEvent("unknown_field", f"unknown event kind {kind!r}"[:200])
    if not _int_in(code, 0, INT64_MAX) or type(detail) is not str:
        raise InvalidEvent("wrong_type", "an event's code must be a non-negative int64 and detail a string")
    return GpuEvent(cluster, node, uuid, index, ts_ns, _EVENT_KINDS[kind], code, detail[:500])


def _decode_nic(raw: Any, cluster: str, node: str) -> NicSample:
    if type(raw) is not list or len(raw) != 4:
        raise InvalidEvent("wrong_type", "a NIC reading must be [device, port, ts_ns, metrics]")
    device, port, ts_ns, metrics = raw
    if type(device) is not str or not device or type(port) is not int or type(ts_ns) is not int:
        raise InvalidEvent("wrong_type", "a NIC reading needs a device name, an integer port and integer ts_ns")
    if not (0 <= port <= _INDEX_MAX and 0 <= ts_ns <= INT64_MAX):
        raise InvalidEvent("out_of_range", f"NIC port {port} or ts_ns {ts_ns} out of range")
    if type(metrics) is not dict or not _NUMBER_TYPES.issuperset(map(type, metrics.values())):
        raise InvalidEvent("wrong_type", "NIC metrics must be a map of numbers")
    if not _KNOWN_NIC_METRICS.issuperset(metrics):
        unknown = next(k for k in metrics if k not in _KNOWN_NIC_METRICS)
        raise InvalidEvent("unknown_field", f"unknown NIC metric {unknown!r}")
    return NicSample(cluster, node, device, port, ts_ns, metrics)


def _decode_sample(raw: Any, cluster: str, node: str) -> GpuSample:
    if type(raw) is not dict:
        raise InvalidEvent("wrong_type", "a sample must be a map")
    uuid, index, model, ts_ns = raw.get("uuid"), raw.get("index"), raw.get("model"), raw.get("ts_ns")
    if type(uuid) is not str or not uuid:
        raise InvalidEvent("wrong_type", "'uuid' must be a non-empty string")
    if type(index) is not int or index < 0:
        raise InvalidEvent("wrong_type", "'index' must be a non-negative integer")
    if index > _INDEX_MAX:
        raise InvalidEvent("out_of_range", f"'index' {index} is beyond {_INDEX_MAX}")
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
    links = _decode_links(raw.get("links"))
    processes = _decode_processes(raw.get("procs"))
    return GpuSample(cluster, node, uuid, index, model, ts_ns, cast("dict[str, float]", metrics), links, processes)


def _optional_list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key, [])
    if type(value) is not list:
        raise DecodeError("wrong_type", f"'{key}' must be a list")
    return value


@dataclass(frozen=True, slots=True)
class ValueGroup:
    """The readings of those samples of a message that send the same field names: ``values`` has a row per sample
    (``rows``: their index in :class:`RawSamples`' lists, ascending) and a column per name, as sent (unit aliases
    included); NaN where not sent or sent as NaN. ``unsent`` is True where not sent (None: all were sent)."""

    names: tuple[str, ...]
    rows: Sequence[int]
    values: np.ndarray
    unsent: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class RawSamples:
    """What one raw message holds that decoded, column-wise: every per-sample list has one entry per good sample,
    in the message's order, ``position`` its place in the message. ``groups`` hold the readings: one group for a
    column-wise message, one per distinct list of field names for a row-wise one."""

    cluster: str
    node: str
    uuid: list[str]
    index: list[int]
    model: list[str]
    ts_ns: list[int]
    groups: list[ValueGroup]
    links: list[tuple[NvLinkSample, ...] | None]
    processes: list[tuple[GpuProcess, ...] | None]
    position: list[int]
    events: tuple[GpuEvent, ...] = ()
    nics: tuple[NicSample, ...] = ()

    def samples(self) -> tuple[GpuSample, ...]:
        """The samples as objects (the metrics map holds what was sent, under the names it was sent as)."""
        metrics: list[dict[str, float]] = [{}] * len(self.uuid)
        for group in self.groups:
            names, values = group.names, group.values.tolist()
            unsent = [None] * len(values) if group.unsent is None else group.unsent.tolist()
            for row, sent, gone in zip(group.rows, values, unsent, strict=True):
                metrics[row] = dict(zip(names, sent, strict=True)) if gone is None else _sent(names, sent, gone)
        columns = (self.uuid, self.index, self.model, self.ts_ns, metrics, self.links, self.processes)
        return tuple(
            GpuSample(self.cluster, self.node, uuid, index, model, ts_ns, sent, links, processes)
            for uuid, index, model, ts_ns, sent, links, processes in zip(*columns, strict=True)
        )


def _sent(names: tuple[str, ...], values: list[float], unsent: list[bool]) -> dict[str, float]:
    return {name: value for name, value, gone in zip(names, values, unsent, strict=True) if not gone}


def decode_raw(payload: bytes) -> tuple[RawSamples, list[Rejected]]:
    """Decode one raw message, either form; raises DecodeError when the envelope itself is unusable."""
    obj = _unpack(payload)
    raw_events, raw_nics = _optional_list(obj, "events"), _optional_list(obj, "nics")
    cluster, node = obj["cluster"], obj["node"]
    extras: list[Rejected] = []
    events: list[GpuEvent] = []
    for position, raw in enumerate(raw_events):
        try:
            events.append(_decode_event(raw, cluster, node))
        except InvalidEvent as exc:
            uuid = raw[0] if isinstance(raw, list) and raw and type(raw[0]) is str else None
            extras.append(Rejected(exc.reason, exc.detail, position, uuid, "event"))
    nics: list[NicSample] = []
    for position, raw in enumerate(raw_nics):
        try:
            nics.append(_decode_nic(raw, cluster, node))
        except InvalidEvent as exc:
            extras.append(Rejected(exc.reason, exc.detail, position, None, "nic"))
    node_level = (tuple(events), tuple(nics))
    if "uuid" in obj:
        if "samples" in obj:
            raise DecodeError("malformed", "samples both column-wise ('uuid', ...) and row-wise ('samples')")
        columns, rejected = _column_samples(obj, cluster, node, node_level)
    else:
        raw_samples = obj.get("samples")
        if type(raw_samples) is not list:
            raise DecodeError("wrong_type", "'samples' must be a list")
        columns, rejected = _row_samples(raw_samples, cluster, node, node_level)
    return columns, rejected + extras


def decode_samples(payload: bytes) -> tuple[SampleBatch, list[Rejected]]:
    """Decode one raw message into objects; raises DecodeError when the envelope itself is unusable."""
    raw, rejected = decode_raw(payload)
    return SampleBatch(raw.cluster, raw.node, raw.samples(), raw.events, raw.nics), rejected


_NodeLevel = tuple[tuple[GpuEvent, ...], tuple[NicSample, ...]]


def _row_samples(
    raw_samples: list[Any], cluster: str, node: str, node_level: _NodeLevel
) -> tuple[RawSamples, list[Rejected]]:
    good: list[GpuSample] = []
    position: list[int] = []
    rejected: list[Rejected] = []
    for at, raw in enumerate(raw_samples):
        try:
            good.append(_decode_sample(raw, cluster, node))
            position.append(at)
        except InvalidEvent as exc:
            rejected.append(_rejected(exc, at, raw.get("uuid") if isinstance(raw, dict) else None))
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, s in enumerate(good):
        groups.setdefault(tuple(s.metrics), []).append(i)
    values = [
        ValueGroup(names, rows, np.array([list(good[i].metrics.values()) for i in rows], dtype=np.float64))
        for names, rows in groups.items()
    ]
    columns = RawSamples(
        cluster, node, [s.gpu_uuid for s in good], [s.gpu_index for s in good], [s.gpu_model for s in good],
        [s.ts_ns for s in good], values, [s.links for s in good], [s.processes for s in good], position, *node_level,
    )  # fmt: skip
    return columns, rejected


_INT: Final = frozenset({int})
_COLUMNS: Final = ("index", "model", "ts_ns")


def _column_samples(
    obj: dict[str, Any], cluster: str, node: str, node_level: _NodeLevel
) -> tuple[RawSamples, list[Rejected]]:
    """The column-wise form: checked column by column with set operations; only a message with a broken identity
    goes sample by sample, through the row-wise checks, to reject just the samples that carry one. The readings
    are a float64 buffer, so they cannot be of a wrong type: NaN and ranges are the processor's checks."""
    uuid = obj["uuid"]
    if type(uuid) is not list:
        raise DecodeError("wrong_type", "'uuid' must be a list (one per sample)")
    n = len(uuid)
    for key in _COLUMNS:
        if type(obj.get(key)) is not list or len(obj[key]) != n:
            raise DecodeError("malformed", f"'{key}' must be a list of {n} entries, one per 'uuid'")
    raw_links, raw_procs = obj.get("links"), obj.get("procs")
    for key, column in (("links", raw_links), ("procs", raw_procs)):
        if column is not None and (type(column) is not list or len(column) != n):
            raise DecodeError("malformed", f"'{key}' must be a list of {n} entries (or absent)")
    fields = obj.get("fields")
    if type(fields) is not list or not _STR.issuperset(map(type, fields)):
        raise DecodeError("wrong_type", "'fields' must be a list of metric names")
    names = tuple(fields)
    cells = n * len(names)
    buffer, gaps = obj.get("m"), obj.get("unsent")
    if type(buffer) is not bytes or len(buffer) != 8 * cells:
        raise DecodeError("malformed", f"'m' must be a buffer of {n} x {len(names)} float64 values")
    if gaps is not None and (type(gaps) is not bytes or len(gaps) != cells):
        raise DecodeError("malformed", f"'unsent' must be a buffer of {n} x {len(names)} bytes (or absent)")
    index, model, ts_ns = obj["index"], obj["model"], obj["ts_ns"]
    problem = _field_problem(names)
    if problem is not None:
        nothing = RawSamples(cluster, node, [], [], [], [], [], [], [], [], *node_level)
        return nothing, [_rejected(problem, at, uuid[at]) for at in range(n)]
    clean = n == 0 or (
        _STR.issuperset(map(type, uuid))
        and all(uuid)
        and _INT.issuperset(map(type, index))
        and _STR.issuperset(map(type, model))
        and _INT.issuperset(map(type, ts_ns))
        and min(index) >= 0
        and max(index) <= _INDEX_MAX
        and min(ts_ns) >= 0
        and max(ts_ns) <= INT64_MAX
    )
    links: list[Any] = [None] * n
    procs: list[Any] = [None] * n
    bad: dict[int, InvalidEvent] = {}
    for at in range(n) if not clean else ():
        try:
            _decode_sample({"uuid": uuid[at], "index": index[at], "model": model[at], "ts_ns": ts_ns[at], "m": {}},
                           cluster, node)  # fmt: skip
        except InvalidEvent as exc:
            bad[at] = exc
    for column, decode, into in ((raw_links, _decode_links, links), (raw_procs, _decode_processes, procs)):
        for at, raw in enumerate(column or ()):
            if raw is not None and at not in bad:
                try:
                    into[at] = decode(raw)
                except InvalidEvent as exc:
                    bad[at] = exc
    values = np.frombuffer(buffer, dtype="<f8").reshape(n, len(names))
    unsent = None if gaps is None else np.frombuffer(gaps, dtype=np.uint8).reshape(n, len(names)) != 0
    if unsent is not None:
        values = np.where(unsent, np.nan, values)  # whatever a producer left in a cell it did not send
    keep = list(range(n))
    kept: tuple[list[Any], ...] = (uuid, index, model, ts_ns, links, procs)
    if bad:
        keep = [at for at in range(n) if at not in bad]
        kept = tuple([column[at] for at in keep] for column in kept)
        values, unsent = values[keep], None if unsent is None else unsent[keep]
    u, i, mo, ts, ls, ps = kept
    group = ValueGroup(names, range(len(keep)), values, unsent)
    columns = RawSamples(cluster, node, u, i, mo, ts, [group], ls, ps, keep, *node_level)
    return columns, [_rejected(bad[at], at, uuid[at]) for at in sorted(bad)]


def _rejected(problem: InvalidEvent, at: int, uuid: Any) -> Rejected:
    return Rejected(problem.reason, problem.detail, at, uuid if type(uuid) is str else None)


@lru_cache(maxsize=1024)
def _field_problem(fields: tuple[str, ...]) -> InvalidEvent | None:
    """A column-wise message's metric names: each known and sent once (an alias counts as its canonical name).
    Cached: a source sends the same names every round."""
    problem = _unknown_metric(fields)
    if problem is None and len(set(fields)) != len(fields):
        twice = next(f for i, f in enumerate(fields) if f in fields[:i])
        problem = InvalidEvent("duplicate_field", f"{twice} sent twice in 'fields'")
    return problem or _duplicate(fields)


def _f64(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<f8").tobytes()


def encode_interpreted(batch: InterpretedBatch) -> bytes:
    """Column-wise: identity lists, and the numeric columns as little-endian float64/int64 buffers."""
    # a GPU's rows (and a job's GPUs) share their workload: each distinct one travels once in "wls" and a row
    # names it by position (walking and decoding one map per row was a third of the sink's time in py-spy)
    table: dict[Workload, int] = {}
    refs = [None if w is None else table.setdefault(w, len(table)) for w in batch.workload]
    out: bytes = msgpack.packb(
        {
            "v": batch.schema_version,
            "cluster": batch.cluster,
            "node": batch.node,
            "uuid": batch.gpu_uuid,
            "index": batch.gpu_index,
            "model": batch.gpu_model,
            "ts_ns": np.ascontiguousarray(batch.ts_ns, dtype="<i8").tobytes(),
            "fields": METRIC_NAMES,
            "m": _f64(batch.metrics),
            "rel_fields": RELATIVE_FIELDS,
            "rel": _f64(batch.relative),
            "wls": [_to_wire(w) for w in table],
            "wl": refs,
            "score": _f64(batch.score),
            "verdict": [v.value for v in batch.verdict],
            "baseline": batch.baseline,
            "expl": batch.explanation,
            "phase": batch.phase,
            "drivers": [[[d.feature, d.observed, d.expected, d.low, d.high] for d in ds] for ds in batch.drivers],
            "links": [None if ls is None else [_link_row(link) for link in ls] for ls in batch.links],
            "procs": [None if ps is None else [_proc_row(p) for p in ps] for ps in batch.processes],
            "events": [[e.cluster, e.node, *_event_row(e)] for e in batch.gpu_events],
            "nics": [[n.cluster, n.node, *_nic_row(n)] for n in batch.nics],
        },
        use_bin_type=True,
    )
    return out


def _columns(raw: np.ndarray, names: tuple[str, ...], ours: tuple[str, ...], n: int) -> np.ndarray:
    """A float64 matrix in our column order from a sender's buffer and column names (which may differ)."""
    if len(raw) != n * len(names):
        raise DecodeError("malformed", f"interpreted batch: a buffer of {len(raw)} values for {n} rows")
    m = raw.reshape(n, len(names))
    if tuple(names) == ours:
        return m
    out = np.full((n, len(ours)), np.nan)
    index = {name: i for i, name in enumerate(names)}
    for j, name in enumerate(ours):
        if name in index:
            out[:, j] = m[:, index[name]]
    return out


def _strs(column: Any, what: str, optional: bool = False) -> tuple[Any, ...]:
    """A list column of strings (``optional``: or nil) as a tuple; DecodeError for anything else."""
    allowed = _OPTIONAL_STR if optional else _STR
    if type(column) is not list or not allowed.issuperset(map(type, column)):
        raise DecodeError("malformed", f"interpreted batch: '{what}' must be a list of strings")
    return tuple(column)


_STR: Final = frozenset({str})
_OPTIONAL_STR: Final = frozenset({str, type(None)})


def _buffer(raw: Any, dtype: str, what: str) -> np.ndarray:
    if type(raw) is not bytes or len(raw) % 8:
        raise DecodeError("malformed", f"interpreted batch: '{what}' must be a buffer of 8-byte values")
    return np.frombuffer(raw, dtype=dtype)


def _driver(row: Any) -> Driver:
    if (
        type(row) is not list
        or len(row) != 5
        or type(row[0]) is not str
        or not _NUMBER_TYPES.issuperset(map(type, row[1:]))
    ):
        raise InvalidEvent("wrong_type", "a driver must be [feature, observed, expected, low, high]")
    return Driver(row[0], float(row[1]), float(row[2]), float(row[3]), float(row[4]))


def _per_row(column: Any, what: str, decode: Any) -> tuple[Any, ...]:
    """A list column whose entries are nil or decoded by ``decode`` (which raises InvalidEvent)."""
    if type(column) is not list:
        raise DecodeError("malformed", f"interpreted batch: '{what}' must be a list")
    try:
        return tuple(None if v is None else decode(v) for v in column)
    except InvalidEvent as exc:
        raise DecodeError("malformed", f"interpreted batch: {what}: {exc.detail}") from exc


def _workloads(table: Any, refs: Any) -> tuple[Workload | None, ...]:
    """The workload column: each distinct workload decoded once, a row naming one by its position in the table
    (a row holding the map itself, as messages written before the table did, is decoded as it stands)."""
    distinct = _per_row(table, "wls", lambda w: _record(Workload, w, "workload"))

    def one(ref: Any) -> Workload:
        if type(ref) is int and 0 <= ref < len(distinct):
            return cast(Workload, distinct[ref])
        if type(ref) is dict:
            return _record(Workload, ref, "workload")
        raise InvalidEvent("wrong_type", f"a workload must be a position in 'wls', got {ref!r}"[:200])

    return _per_row(refs, "wl", one)


def _extra_event(row: Any) -> GpuEvent:
    if type(row) is not list or len(row) != 8 or not (type(row[0]) is str and type(row[1]) is str):
        raise InvalidEvent("wrong_type", "an event must be [cluster, node, uuid, index, ts_ns, kind, code, detail]")
    return _decode_event(row[2:], row[0], row[1])


def _extra_nic(row: Any) -> NicSample:
    if type(row) is not list or len(row) != 6 or not (type(row[0]) is str and type(row[1]) is str):
        raise InvalidEvent("wrong_type", "a NIC reading must be [cluster, node, device, port, ts_ns, metrics]")
    return _decode_nic(row[2:], row[0], row[1])


def decode_interpreted(payload: bytes) -> InterpretedBatch:
    """Decode one interpreted message (written by our processor); raises DecodeError if it is not one.

    Every column is checked for its type (a list of strings, a buffer of 8-byte values...), so whatever bytes
    arrive, the result is a batch the sink can turn into points or a DecodeError, never another exception."""
    obj = _unpack(payload, identity=False)
    try:
        uuids = _strs(obj.get("uuid"), "uuid")
        n = len(uuids)
        index = obj.get("index")
        if type(index) is not list or not all(_int_in(i, 0, _INDEX_MAX) for i in index):
            raise DecodeError("malformed", "interpreted batch: 'index' must be a list of GPU indices")
        fields, rel_fields = obj.get("fields"), obj.get("rel_fields")
        if type(fields) is not list or type(rel_fields) is not list:
            raise DecodeError("malformed", "interpreted batch: 'fields' and 'rel_fields' must be lists")
        batch = InterpretedBatch(
            cluster=_strs(obj.get("cluster"), "cluster"),
            node=_strs(obj.get("node"), "node"),
            gpu_uuid=uuids,
            gpu_index=tuple(index),
            gpu_model=_strs(obj.get("model"), "model"),
            ts_ns=_buffer(obj.get("ts_ns"), "<i8", "ts_ns"),
            metrics=_columns(_buffer(obj.get("m"), "<f8", "m"), _strs(fields, "fields"), METRIC_NAMES, n),
            relative=_columns(
                _buffer(obj.get("rel"), "<f8", "rel"), _strs(rel_fields, "rel_fields"), RELATIVE_FIELDS, n
            ),
            workload=_workloads(obj.get("wls", []), obj.get("wl")),
            score=_buffer(obj.get("score"), "<f8", "score"),
            verdict=tuple(_VERDICTS[v] for v in _strs(obj.get("verdict"), "verdict")),
            baseline=_strs(obj.get("baseline"), "baseline", optional=True),
            explanation=_strs(obj.get("expl"), "expl"),
            phase=_strs(obj.get("phase"), "phase", optional=True),
            drivers=_per_row(obj.get("drivers"), "drivers", lambda ds: tuple(map(_driver, _list(ds)))),
            links=_per_row(obj.get("links"), "links", _decode_links),
            processes=_per_row(obj.get("procs"), "procs", _decode_processes),
            gpu_events=_per_row(obj.get("events"), "events", _extra_event),
            nics=_per_row(obj.get("nics"), "nics", _extra_nic),
        )
    except KeyError as exc:
        raise DecodeError("malformed", f"interpreted batch: unknown verdict {exc}"[:200]) from exc
    if None in batch.gpu_events or None in batch.nics or None in batch.drivers:
        raise DecodeError("malformed", "interpreted batch: nil where an event, NIC reading or driver list belongs")
    lengths = {len(c) for c in (batch.cluster, batch.node, batch.gpu_index, batch.gpu_model, batch.ts_ns)}
    lengths |= {len(c) for c in (batch.score, batch.workload, batch.verdict, batch.baseline, batch.explanation)}
    lengths |= {len(c) for c in (batch.phase, batch.drivers, batch.links, batch.processes)} if n else set()
    if lengths - {n}:
        raise DecodeError("malformed", "interpreted batch columns differ in length")
    return batch


def _list(value: Any) -> list[Any]:
    if type(value) is not list:
        raise InvalidEvent("wrong_type", "expected a list")
    return value


# --- low-rate records: dataclasses as maps, checked against their type hints --------------------------------

R = TypeVar("R")
#: a decoder per type hint: ``(value, where) -> decoded``, raising InvalidEvent with ``where`` in its detail
Decoder = Callable[[Any, str], Any]
_DECODERS: dict[Any, Decoder] = {}
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def _to_wire(value: Any) -> Any:
    if type(value) in _SCALARS:
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


def _decoder(hint: Any) -> Decoder:
    """The decoder of ``hint``, built once: walking the type hints for every value was most of what decoding a
    workload cost (the sink decodes one per distinct workload of every interpreted message)."""
    decode = _DECODERS.get(hint)
    if decode is None:
        decode = _DECODERS[hint] = _build(hint)
    return decode


def _build(hint: Any) -> Decoder:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        decode_inner = _decoder(inner)
        if type(None) not in typing.get_args(hint):
            return decode_inner
        return lambda value, where: None if value is None else decode_inner(value, where)
    if origin is tuple:
        return _tuple_of(_decoder(typing.get_args(hint)[0]))
    if origin is dict:
        return _dict_of(*map(_decoder, typing.get_args(hint)))
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _enum(hint)
    if dataclasses.is_dataclass(hint):
        return _dataclass(cast(type, hint))
    if hint is float:
        return _float
    if hint is Any:
        return lambda value, where: value
    return _exactly(hint)


def _tuple_of(item: Decoder) -> Decoder:
    def decode(value: Any, where: str) -> tuple[Any, ...]:
        if type(value) is not list:
            raise InvalidEvent("wrong_type", f"{where} must be a list")
        return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))

    return decode


def _dict_of(key: Decoder, val: Decoder) -> Decoder:
    def decode(value: Any, where: str) -> dict[Any, Any]:
        if type(value) is not dict:
            raise InvalidEvent("wrong_type", f"{where} must be a map")
        return {key(k, where): val(v, f"{where}.{k}") for k, v in value.items()}

    return decode


def _enum(cls: type[Enum]) -> Decoder:
    def decode(value: Any, where: str) -> Enum:
        try:
            return cls(value)
        except ValueError as exc:
            raise InvalidEvent("unknown_field", f"{where}: {value!r} is not a known {cls.__name__}") from exc

    return decode


def _float(value: Any, where: str) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise InvalidEvent("wrong_type", f"{where} must be float, got {type(value).__name__}")


def _exactly(hint: Any) -> Decoder:
    name = getattr(hint, "__name__", hint)

    def decode(value: Any, where: str) -> Any:
        if type(value) is hint:
            return value
        raise InvalidEvent("wrong_type", f"{where} must be {name}, got {type(value).__name__}")

    return decode


def _dataclass(cls: type) -> Decoder:
    """A map of the dataclass's fields: unknown keys ignored (a newer sender may add fields), missing required ones
    and values of the wrong type refused."""
    hints = typing.get_type_hints(cls)
    plan = [
        (f.name, f".{f.name}", f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        for f in dataclasses.fields(cls)
    ]
    # the fields' decoders are resolved on first use, so a dataclass may hold its own type; two threads racing
    # there each append a whole list, and the first is used
    resolved: list[list[tuple[str, str, bool, Decoder]]] = []

    def decode(value: Any, where: str) -> Any:
        if not resolved:
            resolved.append([(name, suffix, required, _decoder(hints[name])) for name, suffix, required in plan])
        if type(value) is not dict:
            raise InvalidEvent("wrong_type", f"{where} must be a map")
        kwargs = {}
        for name, suffix, required, field_decoder in resolved[0]:
            if name in value:
                kwargs[name] = field_decoder(value[name], where + suffix)
            elif required:
                raise InvalidEvent("wrong_type", f"{where}{suffix} is missing")
        return cls(**kwargs)

    return decode


def _record(cls: type[R], value: Any, where: str) -> R:
    return cast(R, _decoder(cls)(value, where))


def encode_record(record: Any) -> bytes:
    """A dataclass record (context, topology, finding, ground truth...) as one MessagePack message."""
    out: bytes = msgpack.packb(
        {"v": SCHEMA_VERSION, "type": type(record).__name__, "d": _to_wire(record)}, use_bin_type=True
    )
    return out


def decode_record(cls: type[R], payload: bytes) -> R:
    """Decode a record of type ``cls``; raises DecodeError (with a reason) when it is not one.

    Unknown keys are ignored (a newer sender may add fields); missing required ones and wrong types are errors.
    """
    obj = _unpack(payload, identity=False)
    if obj.get("type") != cls.__name__:
        raise DecodeError("wrong_type", f"expected a {cls.__name__} record, got {obj.get('type')!r}")
    try:
        return _record(cls, obj.get("d"), cls.__name__)
    except InvalidEvent as exc:
        raise DecodeError(exc.reason, exc.detail) from exc
    except (TypeError, ValueError) as exc:  # a record's own checks (__post_init__) refusing the values
        raise DecodeError("wrong_type", f"{cls.__name__}: {exc}"[:200]) from exc
