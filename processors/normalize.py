"""Validate and normalize raw sample messages: pure functions over numpy batches, no I/O.

``process_raw`` takes a batch of consumed Kafka messages and returns the normalized batches to interpret and
forward (one per source partition) and the dead letters to publish. Per message it decodes (a broken envelope
dead-letters the whole message); over all samples of the batch at once it converts unit aliases, checks
plausibility (NaN, negative, out of range, inconsistent fields, future or ancient timestamps) and computes
values relative to each GPU's own limits. GPU events and NIC readings are checked one by one (a few per node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from pipeline.codec import Rejected, decode_samples
from pipeline.config import ValidationSettings
from pipeline.deadletter import DeadLetter, dead_letter
from pipeline.errors import DecodeError
from pipeline.events import (
    METRIC_FIELDS,
    METRIC_HIGH,
    METRIC_INDEX,
    METRIC_INTEGER,
    METRIC_LOW,
    NIC_FIELDS,
    UNIT_ALIASES,
    GpuEvent,
    GpuSample,
    InterpretedBatch,
    NicSample,
    metric_matrix,
    relative_values,
)

STAGE = "processor"
_Item = TypeVar("_Item", GpuEvent, NicSample)


@dataclass(frozen=True, slots=True)
class RawMessage:
    key: bytes | None
    value: bytes
    source: str  # topic/partition/offset, for the dead-letter record
    partition: int = 0


@dataclass
class Origins:
    """Where each row and node-level extra of a forwarded batch came from: (index of its message in the input,
    position in that message's list), in the batch's order. A row that cannot be written is dead-lettered with
    its message and position."""

    rows: list[tuple[int, int]] = field(default_factory=list)
    events: list[tuple[int, int]] = field(default_factory=list)
    nics: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Outcome:
    #: (source partition, InterpretedBatch of everything that came from it, in order)
    forward: list[tuple[int, InterpretedBatch]] = field(default_factory=list)
    dead: list[DeadLetter] = field(default_factory=list)
    samples_ok: int = 0
    #: per source partition, where the rows and extras of its forwarded batch came from
    origins: dict[int, Origins] = field(default_factory=dict)


def _timestamp_problem(ts_ns: int, now_ns: int, limits: ValidationSettings) -> tuple[str, str] | None:
    if ts_ns > now_ns + int(limits.max_future_skew_s * 1e9):
        return "future_timestamp", f"ts_ns {ts_ns} is {(ts_ns - now_ns) / 1e9:+.0f}s from now"
    if ts_ns < now_ns - int(limits.max_age_s * 1e9):
        return "ancient_timestamp", f"ts_ns {ts_ns} is {(ts_ns - now_ns) / 1e9:+.0f}s from now"
    return None


def event_problem(event: GpuEvent, now_ns: int, limits: ValidationSettings) -> tuple[str, str] | None:
    """Plausibility of a discrete event (its types were checked when it was decoded)."""
    return _timestamp_problem(event.ts_ns, now_ns, limits)


def nic_problem(nic: NicSample, now_ns: int, limits: ValidationSettings) -> tuple[str, str] | None:
    """Plausibility of a NIC reading: timestamp, and every value finite and inside its field's range."""
    problem = _timestamp_problem(nic.ts_ns, now_ns, limits)
    if problem is not None:
        return problem
    for spec in NIC_FIELDS:
        value = nic.metrics.get(spec.name)
        if value is None:
            continue
        if value != value:  # noqa: PLR0124 (NaN test)
            return "nan", f"{spec.name} is NaN"
        if not spec.low <= value <= spec.high:
            return "out_of_range", f"{spec.name}={value!r} outside [{spec.low:g}, {spec.high:g}]"
    return None


def canonical_units(sample: GpuSample) -> GpuSample:
    """Rename alias fields (e.g. ``memory_used_mib``) to their canonical unit. A sample that carries a field both
    ways never gets here: decoding refuses it (``duplicate_field``)."""
    if UNIT_ALIASES.keys().isdisjoint(sample.metrics):
        return sample
    metrics = {}
    for name, value in sample.metrics.items():
        if name in UNIT_ALIASES:
            canonical, factor = UNIT_ALIASES[name]
            metrics[canonical] = value * factor
        else:
            metrics[name] = value
    return GpuSample(
        sample.cluster,
        sample.node,
        sample.gpu_uuid,
        sample.gpu_index,
        sample.gpu_model,
        sample.ts_ns,
        metrics,
        sample.links,
        sample.processes,
    )


def _col(m: np.ndarray, name: str) -> np.ndarray:
    return m[:, METRIC_INDEX[name]]


# (reason, numerator field, denominator field, max plausible ratio)
_CONSISTENCY = (
    ("inconsistent", "memory_used_bytes", "memory_total_bytes", 1.0),
    ("inconsistent", "power_watts", "power_limit_watts", 2.0),
    ("inconsistent", "sm_clock_mhz", "sm_clock_max_mhz", 1.5),
    ("inconsistent", "pcie_link_gen", "pcie_link_gen_max", 1.0),
    ("inconsistent", "pcie_link_width", "pcie_link_width_max", 1.0),
)


def validate(
    m: np.ndarray, ts_ns: np.ndarray, now_ns: int, limits: ValidationSettings
) -> tuple[np.ndarray, list[tuple[int, str, str]]]:
    """Vectorized plausibility checks; returns the mask of good rows and (row, reason, detail) for bad ones."""
    n = m.shape[0]
    present = ~np.isnan(m)
    with np.errstate(invalid="ignore"):
        negative = present & (m < 0) & (METRIC_LOW >= 0)
        out_of_range = present & ((m < METRIC_LOW) | (m > METRIC_HIGH))
        not_integer = present & METRIC_INTEGER & np.isfinite(m) & (m != np.floor(m))
    checks: list[tuple[str, np.ndarray, np.ndarray | None]] = [
        ("future_timestamp", ts_ns > now_ns + int(limits.max_future_skew_s * 1e9), None),
        ("ancient_timestamp", ts_ns < now_ns - int(limits.max_age_s * 1e9), None),
        ("negative", negative.any(axis=1), negative),
        ("out_of_range", out_of_range.any(axis=1), out_of_range),
        ("not_integer", not_integer.any(axis=1), not_integer),
    ]
    with np.errstate(invalid="ignore", divide="ignore"):
        for reason, num, den, limit in _CONSISTENCY:
            ratio = _col(m, num) / _col(m, den)
            checks.append((f"{reason}:{num}>{den}", ratio > limit, None))
    bad_any = np.zeros(n, dtype=bool)
    problems: list[tuple[int, str, str]] = []
    for reason, rows, cells in checks:
        new = rows & ~bad_any
        for row in np.flatnonzero(new):
            problems.append((int(row), *_explain(reason, int(row), m, ts_ns, now_ns, cells)))
        bad_any |= rows
    return ~bad_any, problems


def _explain(
    reason: str, row: int, m: np.ndarray, ts_ns: np.ndarray, now_ns: int, cells: np.ndarray | None
) -> tuple[str, str]:
    if reason.endswith("_timestamp"):
        return reason, f"ts_ns {int(ts_ns[row])} is {(int(ts_ns[row]) - now_ns) / 1e9:+.0f}s from now"
    if cells is not None:
        col = int(np.flatnonzero(cells[row])[0])
        spec = METRIC_FIELDS[col]
        return reason, f"{spec.name}={m[row, col]!r} outside [{spec.low:g}, {spec.high:g}]"
    code, _, pair = reason.partition(":")
    num, den = pair.split(">")
    return code, f"{num}={_col(m, num)[row]:g} implausible against {den}={_col(m, den)[row]:g}"


def _nan_reason(sample: GpuSample) -> tuple[str, str]:
    name = min(k for k, v in sample.metrics.items() if v != v)  # noqa: PLR0124 (NaN test)
    return "nan", f"{name} is NaN"


def process_raw(messages: list[RawMessage], now_ns: int, limits: ValidationSettings) -> Outcome:
    """Decode, validate and normalize a batch of raw messages (see module docstring)."""
    out = Outcome()
    owners: list[int] = []  # message index of every decoded sample, ascending
    positions: list[int] = []
    samples: list[GpuSample] = []
    extras: dict[int, tuple[list[GpuEvent], list[NicSample]]] = {}  # per source partition, in order
    for i, msg in enumerate(messages):
        try:
            batch, rejected = decode_samples(msg.value)
        except DecodeError as exc:
            out.dead.append(dead_letter(msg.key, msg.value, exc.reason, exc.detail, STAGE, msg.source))
            continue
        out.dead.extend(_rejects(msg, rejected))
        bad_positions = {r.position for r in rejected if r.part == "sample"}
        sample_count = len(batch.samples) + len(bad_positions)
        kept = [p for p in range(sample_count) if p not in bad_positions]
        owners.extend([i] * len(batch.samples))
        positions.extend(kept)
        samples.extend(canonical_units(s) for s in batch.samples)
        if batch.events or batch.nics:
            events, nics = extras.setdefault(msg.partition, ([], []))
            origins = out.origins.setdefault(msg.partition, Origins())
            for position, event in _checked(msg, batch.events, "event", lambda e: event_problem(e, now_ns, limits),
                                            out, rejected):  # fmt: skip
                events.append(event)
                origins.events.append((i, position))
            for position, nic in _checked(msg, batch.nics, "nic", lambda n: nic_problem(n, now_ns, limits),
                                          out, rejected):  # fmt: skip
                nics.append(nic)
                origins.nics.append((i, position))
    if not samples:
        for part, (events, nics) in sorted(extras.items()):
            if events or nics:
                out.forward.append((part, _batch([], np.empty(0, np.int64), metric_matrix([]), events, nics)))
        return out
    m = metric_matrix(samples)
    ts = np.fromiter((s.ts_ns for s in samples), dtype=np.int64, count=len(samples))
    # a present field that is NaN shows up as fewer non-NaN cells than the sample has fields
    sent = np.fromiter((len(s.metrics) for s in samples), dtype=np.int64, count=len(samples))
    nan_rows = (~np.isnan(m)).sum(axis=1) != sent
    good, problems = validate(m, ts, now_ns, limits)
    problems = [(int(r), *_nan_reason(samples[r])) for r in np.flatnonzero(nan_rows)] + [
        p for p in problems if not nan_rows[p[0]]
    ]
    good &= ~nan_rows
    for row, reason, detail in problems:
        msg = messages[owners[row]]
        out.dead.append(
            dead_letter(msg.key, msg.value, reason, detail, STAGE, msg.source, samples[row].gpu_uuid, positions[row])
        )
    partition = np.fromiter((messages[o].partition for o in owners), dtype=np.int64, count=len(owners))
    for part in sorted(set(partition[good].tolist()) | set(extras)):
        rows = np.flatnonzero(good & (partition == part))  # ascending: the order the samples arrived in
        events, nics = extras.get(part, ([], []))
        if len(rows) or events or nics:
            out.forward.append((part, _batch([samples[r] for r in rows.tolist()], ts[rows], m[rows], events, nics)))
            out.origins.setdefault(part, Origins()).rows = [(owners[r], positions[r]) for r in rows.tolist()]
    out.samples_ok = int(np.count_nonzero(good))
    return out


def _decoded_position(rejected: list[Rejected], part: str, position: int) -> int:
    """The position in the message's own list of the ``position``-th item that decoded (rejected ones skipped)."""
    if not rejected:
        return position
    for bad in sorted(r.position for r in rejected if r.part == part and r.position is not None):
        if bad <= position:
            position += 1
    return position


def _batch(
    samples: list[GpuSample], ts_ns: np.ndarray, m: np.ndarray, events: list[GpuEvent], nics: list[NicSample]
) -> InterpretedBatch:
    """Validated samples (and their node-level extras) as a batch to interpret, with values relative to each GPU's
    own limits."""
    return InterpretedBatch.from_samples(
        samples, relative_values(m), ts_ns=ts_ns, metrics=m, gpu_events=tuple(events), nics=tuple(nics)
    )


def _checked(
    msg: RawMessage,
    items: tuple[_Item, ...],
    part: str,
    problem: Callable[[_Item], tuple[str, str] | None],
    out: Outcome,
    rejected: list[Rejected],
) -> list[tuple[int, _Item]]:
    """The items without a problem, with their position in the message; a dead letter for each one with a
    problem."""
    kept = []
    for decoded, item in enumerate(items):
        found = problem(item)
        position = _decoded_position(rejected, part, decoded)
        if found is None:
            kept.append((position, item))
        else:
            uuid = getattr(item, "gpu_uuid", None)
            out.dead.append(dead_letter(msg.key, msg.value, *found, STAGE, msg.source, uuid, position, part))
    return kept


def _rejects(msg: RawMessage, rejected: list[Rejected]) -> list[DeadLetter]:
    return [
        dead_letter(msg.key, msg.value, r.reason, r.detail, STAGE, msg.source, r.gpu_uuid, r.position, r.part)
        for r in rejected
    ]
