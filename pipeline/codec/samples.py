"""Raw samples on the wire, row-wise and column-wise (the two forms :mod:`pipeline.codec` describes): encoding,
and decoding into the good samples plus a :class:`~pipeline.codec.rows.Rejected` per broken one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from typing import Any, Final

import msgpack
import numpy as np

from pipeline.codec.rows import (
    INDEX_MAX,
    INT64_MAX,
    STR,
    Rejected,
    decode_event,
    decode_links,
    decode_nic,
    decode_processes,
    decode_sample,
    duplicate,
    event_row,
    link_row,
    nic_row,
    optional_list,
    proc_row,
    sample_dict,
    unknown_metric,
    unpack,
)
from pipeline.errors import DecodeError, InvalidEvent
from pipeline.events import (
    GpuEvent,
    GpuProcess,
    GpuSample,
    NicSample,
    NvLinkSample,
    SampleBatch,
)


def sample_rows(batch: SampleBatch) -> dict[str, Any]:
    """The map a node message packs in the row-wise form: what other producers may write (module docstring)."""
    body: dict[str, Any] = {
        "v": batch.schema_version,
        "cluster": batch.cluster,
        "node": batch.node,
        "samples": [sample_dict(s) for s in batch.samples],
    }
    return body | _extras(batch)


def _extras(batch: SampleBatch) -> dict[str, Any]:
    extras: dict[str, Any] = {}
    if batch.events:
        extras["events"] = [event_row(e) for e in batch.events]
    if batch.nics:
        extras["nics"] = [nic_row(n) for n in batch.nics]
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
        body["links"] = [None if s.links is None else [link_row(link) for link in s.links] for s in samples]
    if any(s.processes is not None for s in samples):
        body["procs"] = [None if s.processes is None else [proc_row(p) for p in s.processes] for s in samples]
    return body | _extras(batch)


def encode_samples(batch: SampleBatch) -> bytes:
    """A node message as hermeneut's producers send it: column-wise."""
    out: bytes = msgpack.packb(sample_columns(batch), use_bin_type=True)
    return out


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
    obj = unpack(payload)
    raw_events, raw_nics = optional_list(obj, "events"), optional_list(obj, "nics")
    cluster, node = obj["cluster"], obj["node"]
    extras: list[Rejected] = []
    events: list[GpuEvent] = []
    for position, raw in enumerate(raw_events):
        try:
            events.append(decode_event(raw, cluster, node))
        except InvalidEvent as exc:
            uuid = raw[0] if isinstance(raw, list) and raw and type(raw[0]) is str else None
            extras.append(Rejected(exc.reason, exc.detail, position, uuid, "event"))
    nics: list[NicSample] = []
    for position, raw in enumerate(raw_nics):
        try:
            nics.append(decode_nic(raw, cluster, node))
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
            good.append(decode_sample(raw, cluster, node))
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
        cluster,
        node,
        [s.gpu_uuid for s in good],
        [s.gpu_index for s in good],
        [s.gpu_model for s in good],
        [s.ts_ns for s in good],
        values,
        [s.links for s in good],
        [s.processes for s in good],
        position,
        *node_level,
    )
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
    if type(fields) is not list or not STR.issuperset(map(type, fields)):
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
        STR.issuperset(map(type, uuid))
        and all(uuid)
        and _INT.issuperset(map(type, index))
        and STR.issuperset(map(type, model))
        and _INT.issuperset(map(type, ts_ns))
        and min(index) >= 0
        and max(index) <= INDEX_MAX
        and min(ts_ns) >= 0
        and max(ts_ns) <= INT64_MAX
    )
    links: list[Any] = [None] * n
    procs: list[Any] = [None] * n
    bad: dict[int, InvalidEvent] = {}
    for at in range(n) if not clean else ():
        try:
            decode_sample(
                {"uuid": uuid[at], "index": index[at], "model": model[at], "ts_ns": ts_ns[at], "m": {}}, cluster, node
            )
        except InvalidEvent as exc:
            bad[at] = exc
    for column, decode, into in ((raw_links, decode_links, links), (raw_procs, decode_processes, procs)):
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
    problem = unknown_metric(fields)
    if problem is None and len(set(fields)) != len(fields):
        twice = next(f for i, f in enumerate(fields) if f in fields[:i])
        problem = InvalidEvent("duplicate_field", f"{twice} sent twice in 'fields'")
    return problem or duplicate(fields)
