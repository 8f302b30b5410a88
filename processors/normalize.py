"""Validate and normalize raw sample messages: pure functions over numpy batches, no I/O.

``process_raw`` takes a batch of consumed Kafka messages and returns the normalized batches to interpret and
forward (one per source partition) and the dead letters to publish. Per message it decodes (a broken envelope
dead-letters the whole message); over all samples of the batch at once it converts unit aliases, rounds byte
counts that carry a fraction (a unit conversion or an anonymised trace: the meaning is clear, so the value is
converted, not rejected), checks plausibility (NaN, negative, out of range, not a whole number, inconsistent
fields, future or ancient timestamps) and computes values relative to each GPU's own limits. GPU events and NIC
readings are checked one by one (a few per node).

A message published by ``hermeneut import`` (header ``hermeneut-import``: the import run) is *backfill*: its
timestamps may be as old as ``validation.backfill_max_age_s`` (the raw bucket's retention unless set) instead of
the live ``max_age_s``, and its dead letters carry the same header, so the import can count its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Final, TypeVar

import numpy as np

from pipeline.codec import Rejected, decode_samples
from pipeline.config import ValidationSettings
from pipeline.deadletter import IMPORT, DeadLetter, dead_letter
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
from pipeline.vocab import format_duration

STAGE = "processor"
_Item = TypeVar("_Item", GpuEvent, NicSample)


#: the header that marks a raw message as backfill, naming the import run that published it
IMPORT_HEADER: Final = IMPORT


@dataclass(frozen=True, slots=True)
class RawMessage:
    key: bytes | None
    value: bytes
    source: str  # topic/partition/offset, for the dead-letter record
    partition: int = 0
    #: the import run that published it (header ``hermeneut-import``); None: live data
    import_run: str | None = None


def import_run_of(headers: object) -> str | None:
    """The ``hermeneut-import`` header of a consumed message (a list of pairs or a mapping), None when absent."""
    pairs = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in pairs:  # type: ignore[attr-defined]
        if name == IMPORT_HEADER and value:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None


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


def max_age_ns(limits: ValidationSettings, backfill: bool) -> int:
    """How old a timestamp may be: the live bound, or the backfill bound for imported history."""
    if backfill and limits.backfill_max_age_s is not None:
        return int(limits.backfill_max_age_s * 1e9)
    return int(limits.max_age_s * 1e9)


def _age_detail(ts_ns: int, now_ns: int, bound_ns: int, backfill: bool) -> str:
    bound = "the backfill bound (validation.backfill_max_age_s)" if backfill else "validation.max_age_s"
    return f"{_utc(ts_ns)} is {_seconds(now_ns - ts_ns)} old, beyond {bound} of {_seconds(bound_ns)}"


def _future_detail(ts_ns: int, now_ns: int, limits: ValidationSettings) -> str:
    skew = _seconds(int(limits.max_future_skew_s * 1e9))
    return f"{_utc(ts_ns)} is {_seconds(ts_ns - now_ns)} ahead of now (validation.max_future_skew_s: {skew})"


def _seconds(ns: int) -> str:
    """A duration to the second, ``2w3d4h`` style."""
    return format_duration(max(ns, 0) // 10**9 * 10**9)


def _utc(ts_ns: int) -> str:
    """A timestamp as people read it (UTC, to the millisecond); the raw ns when it is off the calendar."""
    try:
        return datetime.fromtimestamp(ts_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return f"ts_ns {ts_ns}"


def _timestamp_problem(
    ts_ns: int, now_ns: int, limits: ValidationSettings, backfill: bool = False
) -> tuple[str, str] | None:
    if ts_ns > now_ns + int(limits.max_future_skew_s * 1e9):
        return "future_timestamp", _future_detail(ts_ns, now_ns, limits)
    bound = max_age_ns(limits, backfill)
    if ts_ns < now_ns - bound:
        return "ancient_timestamp", _age_detail(ts_ns, now_ns, bound, backfill)
    return None


def event_problem(
    event: GpuEvent, now_ns: int, limits: ValidationSettings, backfill: bool = False
) -> tuple[str, str] | None:
    """Plausibility of a discrete event (its types were checked when it was decoded)."""
    return _timestamp_problem(event.ts_ns, now_ns, limits, backfill)


def nic_problem(
    nic: NicSample, now_ns: int, limits: ValidationSettings, backfill: bool = False
) -> tuple[str, str] | None:
    """Plausibility of a NIC reading: timestamp, and every value finite and inside its field's range."""
    problem = _timestamp_problem(nic.ts_ns, now_ns, limits, backfill)
    if problem is not None:
        return problem
    for spec in NIC_FIELDS:
        value = nic.metrics.get(spec.name)
        if value is None:
            continue
        if value != value:  # noqa: PLR0124 (NaN test)
            return "nan", f"{spec.name} is NaN"
        if not spec.low <= value <= spec.high:
            return "out_of_range", f"{spec.name}={_number(value)} outside [{spec.low:g}, {spec.high:g}]"
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


#: whole-number fields whose fraction has a clear meaning, a unit conversion (MiB, KiB) or an anonymised value:
#: rounded to the byte rather than rejected
_ROUNDED: Final = np.array([f.integer and f.name.endswith("_bytes") for f in METRIC_FIELDS])


def round_byte_counts(m: np.ndarray) -> np.ndarray:
    """``m`` with the byte counts rounded to whole bytes (in place; the matrix is the caller's own)."""
    m[:, _ROUNDED] = np.round(m[:, _ROUNDED])
    return m


# (reason, numerator field, denominator field, max plausible ratio)
_CONSISTENCY = (
    ("inconsistent", "memory_used_bytes", "memory_total_bytes", 1.0),
    ("inconsistent", "power_watts", "power_limit_watts", 2.0),
    ("inconsistent", "sm_clock_mhz", "sm_clock_max_mhz", 1.5),
    ("inconsistent", "pcie_link_gen", "pcie_link_gen_max", 1.0),
    ("inconsistent", "pcie_link_width", "pcie_link_width_max", 1.0),
)


def validate(
    m: np.ndarray,
    ts_ns: np.ndarray,
    now_ns: int,
    limits: ValidationSettings,
    backfill: np.ndarray | None = None,
) -> tuple[np.ndarray, list[tuple[int, str, str]]]:
    """Vectorized plausibility checks; returns the mask of good rows and (row, reason, detail) for bad ones.
    ``backfill`` marks the rows of imported history, judged by the backfill age bound."""
    n = m.shape[0]
    backfill = np.zeros(n, dtype=bool) if backfill is None else backfill
    oldest = now_ns - np.where(backfill, max_age_ns(limits, True), max_age_ns(limits, False))
    present = ~np.isnan(m)
    with np.errstate(invalid="ignore"):
        negative = present & (m < 0) & (METRIC_LOW >= 0)
        out_of_range = present & ((m < METRIC_LOW) | (m > METRIC_HIGH))
        not_integer = present & METRIC_INTEGER & np.isfinite(m) & (m != np.floor(m))
    checks: list[tuple[str, np.ndarray, np.ndarray | None]] = [
        ("future_timestamp", ts_ns > now_ns + int(limits.max_future_skew_s * 1e9), None),
        ("ancient_timestamp", ts_ns < oldest, None),
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
            problems.append((int(row), *_explain(reason, int(row), m, ts_ns, now_ns, cells, limits, backfill)))
        bad_any |= rows
    return ~bad_any, problems


def _explain(
    reason: str,
    row: int,
    m: np.ndarray,
    ts_ns: np.ndarray,
    now_ns: int,
    cells: np.ndarray | None,
    limits: ValidationSettings,
    backfill: np.ndarray,
) -> tuple[str, str]:
    """One readable line: plain numbers (never a numpy repr), the field's range, what the bound is called."""
    ts = int(ts_ns[row])
    if reason == "future_timestamp":
        return reason, _future_detail(ts, now_ns, limits)
    if reason == "ancient_timestamp":
        back = bool(backfill[row])
        return reason, _age_detail(ts, now_ns, max_age_ns(limits, back), back)
    if cells is not None:
        col = int(np.flatnonzero(cells[row])[0])
        spec, value = METRIC_FIELDS[col], float(m[row, col])
        if reason == "not_integer":
            return reason, f"{spec.name}={_number(value)} is not a whole number"
        return reason, f"{spec.name}={_number(value)} outside [{spec.low:g}, {spec.high:g}]"
    code, _, pair = reason.partition(":")
    num, den = pair.split(">")
    a, b = (_number(float(_col(m, name)[row])) for name in (num, den))
    return code, f"{num}={a} implausible against {den}={b}"


def _number(value: float) -> str:
    """A value in a dead letter's detail: whole numbers without a fraction, others as Python prints them."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)


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
            out.dead.append(
                dead_letter(msg.key, msg.value, exc.reason, exc.detail, STAGE, msg.source, import_run=msg.import_run)
            )
            continue
        out.dead.extend(_rejects(msg, rejected))
        backfill = msg.import_run is not None
        bad_positions = {r.position for r in rejected if r.part == "sample"}
        sample_count = len(batch.samples) + len(bad_positions)
        kept = [p for p in range(sample_count) if p not in bad_positions]
        owners.extend([i] * len(batch.samples))
        positions.extend(kept)
        samples.extend(canonical_units(s) for s in batch.samples)
        if batch.events or batch.nics:
            events, nics = extras.setdefault(msg.partition, ([], []))
            origins = out.origins.setdefault(msg.partition, Origins())
            event_check = partial(event_problem, now_ns=now_ns, limits=limits, backfill=backfill)
            for position, event in _checked(msg, batch.events, "event", event_check, out, rejected):
                events.append(event)
                origins.events.append((i, position))
            nic_check = partial(nic_problem, now_ns=now_ns, limits=limits, backfill=backfill)
            for position, nic in _checked(msg, batch.nics, "nic", nic_check, out, rejected):
                nics.append(nic)
                origins.nics.append((i, position))
    if not samples:
        for part, (events, nics) in sorted(extras.items()):
            if events or nics:
                out.forward.append((part, _batch([], np.empty(0, np.int64), metric_matrix([]), events, nics)))
        return out
    m = round_byte_counts(metric_matrix(samples))
    ts = np.fromiter((s.ts_ns for s in samples), dtype=np.int64, count=len(samples))
    backfilled = np.fromiter((messages[o].import_run is not None for o in owners), dtype=bool, count=len(owners))
    # a present field that is NaN shows up as fewer non-NaN cells than the sample has fields
    sent = np.fromiter((len(s.metrics) for s in samples), dtype=np.int64, count=len(samples))
    nan_rows = (~np.isnan(m)).sum(axis=1) != sent
    good, problems = validate(m, ts, now_ns, limits, backfilled)
    problems = [(int(r), *_nan_reason(samples[r])) for r in np.flatnonzero(nan_rows)] + [
        p for p in problems if not nan_rows[p[0]]
    ]
    good &= ~nan_rows
    for row, reason, detail in problems:
        msg = messages[owners[row]]
        out.dead.append(
            dead_letter(
                msg.key, msg.value, reason, detail, STAGE, msg.source, samples[row].gpu_uuid, positions[row],
                import_run=msg.import_run,
            )
        )  # fmt: skip
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
            out.dead.append(
                dead_letter(msg.key, msg.value, *found, STAGE, msg.source, uuid, position, part, msg.import_run)
            )
    return kept


def _rejects(msg: RawMessage, rejected: list[Rejected]) -> list[DeadLetter]:
    return [
        dead_letter(
            msg.key, msg.value, r.reason, r.detail, STAGE, msg.source, r.gpu_uuid, r.position, r.part, msg.import_run
        )
        for r in rejected
    ]
