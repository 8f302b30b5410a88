"""Wire encoding of the schema: MessagePack, one message per node per sampling round.

Why MessagePack (``bench/codec.py``, numbers in the README): it keeps int64 timestamps and float64 values exact,
can carry NaN (so a NaN from a broken sensor reaches validation and the dead-letter topic instead of vanishing
as JSON ``null``), carries binary buffers, and is ~12% smaller than JSON after lz4. It is not faster than orjson
(encode ties, parsing is ~1.5x slower); that cost is small next to what the schema buys.

Raw samples are row-wise maps (easy for any producer to write, absent fields simply missing). Interpreted
batches, written and read only by hermeneut stages, are column-wise: the numeric columns travel as float64
buffers, so neither the processor nor the sink builds a Python object per value.

Decoding is defensive: a message whose envelope is broken raises :class:`DecodeError` (the whole message is
dead-lettered); a message with some broken samples decodes into the good ones plus a :class:`Rejected` entry
per broken sample, so one bad GPU does not cost its node's other readings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

import msgpack
import numpy as np

from pipeline.errors import DecodeError, InvalidEvent
from pipeline.events import (
    METRIC_INDEX,
    METRIC_NAMES,
    RELATIVE_FIELDS,
    SCHEMA_VERSION,
    UNIT_ALIASES,
    GpuSample,
    InterpretedBatch,
    SampleBatch,
    Verdict,
    Workload,
)

CONTENT_TYPE: Final = b"application/vnd.hermeneut.v1+msgpack"
_KNOWN_METRICS: Final = frozenset(METRIC_INDEX) | frozenset(UNIT_ALIASES)
_VERDICTS: Final = {v.value: v for v in Verdict}


@dataclass(frozen=True, slots=True)
class Rejected:
    """One sample (or whole message, when ``position`` is None) that failed decoding or validation."""

    reason: str
    detail: str
    position: int | None = None
    gpu_uuid: str | None = None


def _sample_dict(s: GpuSample) -> dict[str, Any]:
    return {"uuid": s.gpu_uuid, "index": s.gpu_index, "model": s.gpu_model, "ts_ns": s.ts_ns, "m": s.metrics}


def encode_samples(batch: SampleBatch) -> bytes:
    out: bytes = msgpack.packb(
        {
            "v": batch.schema_version,
            "cluster": batch.cluster,
            "node": batch.node,
            "samples": [_sample_dict(s) for s in batch.samples],
        },
        use_bin_type=True,
    )
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
    """Names known and values numbers (bool is not); set operations keep this off a per-field Python loop.
    NaN and infinities are plausibility, checked vectorized by the processor."""
    if type(metrics) is not dict:
        return InvalidEvent("wrong_type", "'m' (metrics) must be a map")
    if not _NUMBER_TYPES.issuperset(map(type, metrics.values())):
        name, value = next((k, v) for k, v in metrics.items() if type(v) not in _NUMBER_TYPES)
        return InvalidEvent("wrong_type", f"{name} must be a number, got {type(value).__name__}")
    if not _KNOWN_METRICS.issuperset(metrics):
        unknown = sorted(set(metrics) - _KNOWN_METRICS)
        return InvalidEvent("unknown_field", f"unknown metric {unknown[0]!r}")
    return None


def _decode_sample(raw: Any, cluster: str, node: str) -> GpuSample:
    if type(raw) is not dict:
        raise InvalidEvent("wrong_type", "a sample must be a map")
    uuid, index, model, ts_ns = raw.get("uuid"), raw.get("index"), raw.get("model"), raw.get("ts_ns")
    if type(uuid) is not str or not uuid:
        raise InvalidEvent("wrong_type", "'uuid' must be a non-empty string")
    if type(index) is not int or index < 0:
        raise InvalidEvent("wrong_type", "'index' must be a non-negative integer")
    if type(model) is not str:
        raise InvalidEvent("wrong_type", "'model' must be a string")
    if type(ts_ns) is not int:
        raise InvalidEvent("wrong_type", "'ts_ns' must be an integer (UTC epoch nanoseconds)")
    metrics = raw.get("m")
    problem = _check_metrics(metrics)
    if problem is not None:
        raise problem
    return GpuSample(cluster, node, uuid, index, model, ts_ns, cast("dict[str, float]", metrics))


def decode_samples(payload: bytes) -> tuple[SampleBatch, list[Rejected]]:
    """Decode one raw message; raises DecodeError when the envelope itself is unusable."""
    obj = _unpack(payload)
    raw_samples = obj.get("samples")
    if type(raw_samples) is not list:
        raise DecodeError("wrong_type", "'samples' must be a list")
    cluster, node = obj["cluster"], obj["node"]
    good: list[GpuSample] = []
    rejected: list[Rejected] = []
    for position, raw in enumerate(raw_samples):
        try:
            good.append(_decode_sample(raw, cluster, node))
        except InvalidEvent as exc:
            uuid = raw.get("uuid") if isinstance(raw, dict) and type(raw.get("uuid")) is str else None
            rejected.append(Rejected(exc.reason, exc.detail, position, uuid))
    return SampleBatch(cluster, node, tuple(good)), rejected


def _f64(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values, dtype="<f8").tobytes()


def encode_interpreted(batch: InterpretedBatch) -> bytes:
    """Column-wise: identity lists, and the numeric columns as little-endian float64/int64 buffers."""
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
            "wl": [
                None if w is None else [w.application, w.job_id, w.user, w.source, w.confidence] for w in batch.workload
            ],
            "score": _f64(batch.score),
            "verdict": [v.value for v in batch.verdict],
            "baseline": batch.baseline,
            "expl": batch.explanation,
        },
        use_bin_type=True,
    )
    return out


def _columns(raw: bytes, names: list[str], ours: tuple[str, ...], n: int) -> np.ndarray:
    """A float64 matrix in our column order from a sender's buffer and column names (which may differ)."""
    m = np.frombuffer(raw, dtype="<f8").reshape(n, len(names))
    if tuple(names) == ours:
        return m
    out = np.full((n, len(ours)), np.nan)
    index = {name: i for i, name in enumerate(names)}
    for j, name in enumerate(ours):
        if name in index:
            out[:, j] = m[:, index[name]]
    return out


def decode_interpreted(payload: bytes) -> InterpretedBatch:
    """Decode one interpreted message (written by our processor); raises DecodeError if it is not one."""
    obj = _unpack(payload, identity=False)
    try:
        uuids = tuple(obj["uuid"])
        n = len(uuids)
        batch = InterpretedBatch(
            cluster=tuple(obj["cluster"]),
            node=tuple(obj["node"]),
            gpu_uuid=uuids,
            gpu_index=tuple(obj["index"]),
            gpu_model=tuple(obj["model"]),
            ts_ns=np.frombuffer(obj["ts_ns"], dtype="<i8"),
            metrics=_columns(obj["m"], obj["fields"], METRIC_NAMES, n),
            relative=_columns(obj["rel"], obj["rel_fields"], RELATIVE_FIELDS, n),
            workload=tuple(None if w is None else Workload(*w) for w in obj["wl"]),
            score=np.frombuffer(obj["score"], dtype="<f8"),
            verdict=tuple(_VERDICTS[v] for v in obj["verdict"]),
            baseline=tuple(obj["baseline"]),
            explanation=tuple(obj["expl"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError("malformed", f"not an interpreted batch ({type(exc).__name__}: {exc})"[:200]) from exc
    lengths = {len(c) for c in (batch.cluster, batch.node, batch.gpu_index, batch.gpu_model, batch.ts_ns)}
    lengths |= {len(c) for c in (batch.score, batch.workload, batch.verdict, batch.baseline, batch.explanation)}
    if lengths - {n}:
        raise DecodeError("malformed", "interpreted batch columns differ in length")
    return batch
