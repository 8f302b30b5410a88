"""Interpreted batches on the wire: column-wise, the numeric columns as float64 buffers, written and read only by
hermeneut stages.
"""

from __future__ import annotations

from typing import Any, cast

import msgpack
import numpy as np

from pipeline.codec.records import record, to_wire
from pipeline.codec.rows import (
    INDEX_MAX,
    NUMBER_TYPES,
    OPTIONAL_STR,
    STR,
    VERDICTS,
    decode_event,
    decode_links,
    decode_nic,
    decode_processes,
    event_row,
    int_in,
    link_row,
    nic_row,
    proc_row,
    unpack,
)
from pipeline.errors import DecodeError, InvalidEvent
from pipeline.events import (
    METRIC_NAMES,
    RELATIVE_FIELDS,
    Driver,
    GpuEvent,
    InterpretedBatch,
    NicSample,
    Workload,
)


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
            "wls": [to_wire(w) for w in table],
            "wl": refs,
            "score": _f64(batch.score),
            "verdict": [v.value for v in batch.verdict],
            "baseline": batch.baseline,
            "expl": batch.explanation,
            "phase": batch.phase,
            "drivers": [[[d.feature, d.observed, d.expected, d.low, d.high] for d in ds] for ds in batch.drivers],
            "links": [None if ls is None else [link_row(link) for link in ls] for ls in batch.links],
            "procs": [None if ps is None else [proc_row(p) for p in ps] for ps in batch.processes],
            "events": [[e.cluster, e.node, *event_row(e)] for e in batch.gpu_events],
            "nics": [[n.cluster, n.node, *nic_row(n)] for n in batch.nics],
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
    allowed = OPTIONAL_STR if optional else STR
    if type(column) is not list or not allowed.issuperset(map(type, column)):
        raise DecodeError("malformed", f"interpreted batch: '{what}' must be a list of strings")
    return tuple(column)


def _buffer(raw: Any, dtype: str, what: str) -> np.ndarray:
    if type(raw) is not bytes or len(raw) % 8:
        raise DecodeError("malformed", f"interpreted batch: '{what}' must be a buffer of 8-byte values")
    return np.frombuffer(raw, dtype=dtype)


def _driver(row: Any) -> Driver:
    if (
        type(row) is not list
        or len(row) != 5
        or type(row[0]) is not str
        or not NUMBER_TYPES.issuperset(map(type, row[1:]))
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
    distinct = _per_row(table, "wls", lambda w: record(Workload, w, "workload"))

    def one(ref: Any) -> Workload:
        if type(ref) is int and 0 <= ref < len(distinct):
            return cast(Workload, distinct[ref])
        if type(ref) is dict:
            return record(Workload, ref, "workload")
        raise InvalidEvent("wrong_type", f"a workload must be a position in 'wls', got {ref!r}"[:200])

    return _per_row(refs, "wl", one)


def _extra_event(row: Any) -> GpuEvent:
    if type(row) is not list or len(row) != 8 or not (type(row[0]) is str and type(row[1]) is str):
        raise InvalidEvent("wrong_type", "an event must be [cluster, node, uuid, index, ts_ns, kind, code, detail]")
    return decode_event(row[2:], row[0], row[1])


def _extra_nic(row: Any) -> NicSample:
    if type(row) is not list or len(row) != 6 or not (type(row[0]) is str and type(row[1]) is str):
        raise InvalidEvent("wrong_type", "a NIC reading must be [cluster, node, device, port, ts_ns, metrics]")
    return decode_nic(row[2:], row[0], row[1])


def decode_interpreted(payload: bytes) -> InterpretedBatch:
    """Decode one interpreted message (written by our processor); raises DecodeError if it is not one.

    Every column is checked for its type (a list of strings, a buffer of 8-byte values...), so whatever bytes
    arrive, the result is a batch the sink can turn into points or a DecodeError, never another exception."""
    obj = unpack(payload, identity=False)
    try:
        uuids = _strs(obj.get("uuid"), "uuid")
        n = len(uuids)
        index = obj.get("index")
        if type(index) is not list or not all(int_in(i, 0, INDEX_MAX) for i in index):
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
            verdict=tuple(VERDICTS[v] for v in _strs(obj.get("verdict"), "verdict")),
            baseline=_strs(obj.get("baseline"), "baseline", optional=True),
            explanation=_strs(obj.get("expl"), "expl"),
            phase=_strs(obj.get("phase"), "phase", optional=True),
            drivers=_per_row(obj.get("drivers"), "drivers", lambda ds: tuple(map(_driver, _list(ds)))),
            links=_per_row(obj.get("links"), "links", decode_links),
            processes=_per_row(obj.get("procs"), "procs", decode_processes),
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
