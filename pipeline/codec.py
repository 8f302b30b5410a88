"""Wire encoding of the schema: MessagePack, one message per node per sampling round.

Why MessagePack: it keeps int64 timestamps and float64 values exact, can carry NaN (so a NaN from a broken
sensor reaches validation and the dead-letter topic instead of vanishing as ``null``), and with the C extension
it encoded and decoded our batches faster than orjson in ``bench/codec.py`` (numbers in the README).

Decoding is defensive: a message whose envelope is broken raises :class:`DecodeError` (the whole message is
dead-lettered); a message with some broken samples decodes into the good ones plus a :class:`Rejected` entry
per broken sample, so one bad GPU does not cost its node's other readings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, cast

import msgpack

from pipeline.errors import DecodeError, InvalidEvent
from pipeline.events import (
    METRIC_INDEX,
    SCHEMA_VERSION,
    UNIT_ALIASES,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
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


def _unpack(payload: bytes) -> dict[str, Any]:
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
    for key in ("cluster", "node"):
        value = obj.get(key)
        if type(value) is not str or not value:
            raise DecodeError("wrong_type", f"'{key}' must be a non-empty string")
    return obj


def _check_metrics(metrics: Any) -> InvalidEvent | None:
    if type(metrics) is not dict:
        return InvalidEvent("wrong_type", "'m' (metrics) must be a map")
    for name, value in metrics.items():
        kind = type(value)
        if kind is not float and kind is not int:
            return InvalidEvent("wrong_type", f"{name} must be a number, got {kind.__name__}")
        if name not in _KNOWN_METRICS:
            return InvalidEvent("unknown_field", f"unknown metric {name!r}")
        if kind is float and math.isnan(value):
            return InvalidEvent("nan", f"{name} is NaN")
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


def encode_interpreted(batch: InterpretedBatch) -> bytes:
    events = []
    for e in batch.events:
        wl = e.workload
        event = _sample_dict(e.sample)
        event.update(
            rel=e.relative,
            wl=None if wl is None else [wl.application, wl.job_id, wl.user, wl.source, wl.confidence],
            score=e.score,
            verdict=e.verdict.value,
            baseline=e.baseline,
            expl=e.explanation,
        )
        events.append(event)
    out: bytes = msgpack.packb(
        {"v": batch.schema_version, "cluster": batch.cluster, "node": batch.node, "events": events},
        use_bin_type=True,
    )
    return out


def decode_interpreted(payload: bytes) -> InterpretedBatch:
    """Decode one interpreted message (written by our processor); raises DecodeError if it is not one."""
    obj = _unpack(payload)
    cluster, node = obj["cluster"], obj["node"]
    try:
        events = []
        for raw in obj["events"]:
            wl = raw["wl"]
            events.append(
                InterpretedEvent(
                    sample=_decode_sample(raw, cluster, node),
                    relative=dict(raw["rel"]),
                    workload=None if wl is None else Workload(*wl),
                    score=raw["score"],
                    verdict=_VERDICTS[raw["verdict"]],
                    baseline=raw["baseline"],
                    explanation=raw["expl"],
                )
            )
    except (KeyError, TypeError, ValueError, InvalidEvent) as exc:
        raise DecodeError("malformed", f"not an interpreted batch ({type(exc).__name__}: {exc})"[:200]) from exc
    return InterpretedBatch(cluster, node, tuple(events))
