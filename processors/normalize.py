"""Validate and normalize raw sample messages: pure functions over numpy batches, no I/O.

``process_raw`` takes a batch of consumed Kafka messages and returns the normalized batches to interpret and
forward (one per source partition) and the dead letters to publish. Per message it decodes into columns
(``pipeline.codec.decode_raw``; a broken envelope dead-letters the whole message). The values of all samples of
the batch become one matrix, one conversion per distinct list of field names rather than a map per sample, and
over all of them at once it converts unit aliases, rounds byte counts that carry a fraction (a unit conversion or
an anonymised trace: the meaning is clear, so the value is converted, not rejected), checks plausibility (NaN,
negative, out of range, not a whole number, inconsistent fields, future or ancient timestamps) and computes values
relative to each GPU's own limits. GPU events and NIC readings are checked one by one (a few per node).

A message published by ``hermeneut import`` (header ``hermeneut-import``: the import run) is *backfill*: its
timestamps may be as old as ``validation.backfill_max_age_s`` (unset: the raw retention less its margin) instead
of the live ``max_age_s``, and its dead letters carry the same header, so the import can count its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache, partial
from typing import Final, TypeVar

import numpy as np

from pipeline.codec import RawSamples, Rejected, decode_raw
from pipeline.config import ValidationSettings
from pipeline.deadletter import IMPORT, DeadLetter, dead_letter
from pipeline.errors import DecodeError
from pipeline.events import (
    METRIC_FIELDS,
    METRIC_HIGH,
    METRIC_INDEX,
    METRIC_INTEGER,
    METRIC_LOW,
    METRIC_NAMES,
    NIC_FIELDS,
    UNIT_ALIASES,
    GpuEvent,
    GpuProcess,
    InterpretedBatch,
    NicSample,
    NvLinkSample,
    relative_values,
)
from pipeline.identity import BAD_IDENTITY, identity_problem
from pipeline.vocab import format_duration

STAGE = "processor"
_Item = TypeVar("_Item", GpuEvent, NicSample)
_Value = TypeVar("_Value")
#: the value blocks of a take's messages that follow one list of field names, their ``unsent`` masks, the rows
_Group = tuple[list[np.ndarray], list[np.ndarray | None], list[int]]


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


def _identity_problem(named: tuple[tuple[str, str], ...]) -> tuple[str, str] | None:
    """The first of ``(what, value)`` that cannot be stored as an identity (:mod:`pipeline.identity`)."""
    for what, value in named:
        detail = identity_problem(value, what)
        if detail is not None:
            return BAD_IDENTITY, detail
    return None


def event_problem(
    event: GpuEvent, now_ns: int, limits: ValidationSettings, backfill: bool = False
) -> tuple[str, str] | None:
    """Plausibility of a discrete event (its types were checked when it was decoded): identity and timestamp."""
    named = (("cluster", event.cluster), ("node", event.node), ("uuid", event.gpu_uuid))
    return _identity_problem(named) or _timestamp_problem(event.ts_ns, now_ns, limits, backfill)


def nic_problem(
    nic: NicSample, now_ns: int, limits: ValidationSettings, backfill: bool = False
) -> tuple[str, str] | None:
    """Plausibility of a NIC reading: identity, timestamp, and every value finite and inside its field's range."""
    named = (("cluster", nic.cluster), ("node", nic.node), ("device", nic.device))
    problem = _identity_problem(named) or _timestamp_problem(nic.ts_ns, now_ns, limits, backfill)
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
        # every cell masked (or an empty map): a point of interpretation only, with nothing it interprets
        ("no_reading", ~present.any(axis=1), None),
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
    if reason == "no_reading":
        return reason, "the sample holds no reading: every field is missing"
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
    """A value in a dead letter's detail: whole numbers without a fraction, others as Python prints them. A NIC
    reading may be an int (MessagePack keeps the type): Python 3.11's int has no ``is_integer``."""
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)


@dataclass
class _Rows:
    """Every sample of a take that decoded, column-wise, in the order of its messages: filled message by message,
    then cut into one batch per source partition. ``groups`` gathers the messages' value blocks by the field names
    they follow, so the matrix is built with one conversion per distinct list of names, not per sample."""

    owner: list[int] = field(default_factory=list)  # index of the sample's message in the take
    position: list[int] = field(default_factory=list)  # its place in that message
    cluster: list[str] = field(default_factory=list)
    node: list[str] = field(default_factory=list)
    uuid: list[str] = field(default_factory=list)
    index: list[int] = field(default_factory=list)
    model: list[str] = field(default_factory=list)
    ts_ns: list[int] = field(default_factory=list)
    links: list[tuple[NvLinkSample, ...] | None] = field(default_factory=list)
    processes: list[tuple[GpuProcess, ...] | None] = field(default_factory=list)
    groups: dict[tuple[str, ...], _Group] = field(default_factory=dict)

    def add(self, message: int, raw: RawSamples) -> None:
        base, count = len(self.uuid), len(raw.uuid)
        self.owner.extend([message] * count)
        self.position.extend(raw.position)
        self.cluster.extend([raw.cluster] * count)
        self.node.extend([raw.node] * count)
        self.uuid.extend(raw.uuid)
        self.index.extend(raw.index)
        self.model.extend(raw.model)
        self.ts_ns.extend(raw.ts_ns)
        self.links.extend(raw.links)
        self.processes.extend(raw.processes)
        for group in raw.groups:
            blocks, unsent, ids = self.groups.setdefault(group.names, ([], [], []))
            blocks.append(group.values)
            unsent.append(group.unsent)
            ids.extend(map(base.__add__, group.rows))

    def batch(
        self, rows: list[int], ts_ns: np.ndarray, m: np.ndarray, events: list[GpuEvent], nics: list[NicSample]
    ) -> InterpretedBatch:
        """The rows ``rows`` (and a partition's node-level extras) as a batch to interpret, with values relative
        to each GPU's own limits."""
        metrics = m[rows]
        return InterpretedBatch.unscored(
            cluster=_pick(self.cluster, rows),
            node=_pick(self.node, rows),
            gpu_uuid=_pick(self.uuid, rows),
            gpu_index=_pick(self.index, rows),
            gpu_model=_pick(self.model, rows),
            ts_ns=ts_ns[rows],
            metrics=metrics,
            relative=relative_values(metrics),
            links=_pick(self.links, rows),
            processes=_pick(self.processes, rows),
            gpu_events=tuple(events),
            nics=tuple(nics),
        )


def identity_problems(rows: _Rows) -> dict[int, str]:
    """Per row whose identity (cluster, node, uuid, model) cannot be stored (:mod:`pipeline.identity`), why: each
    distinct value is judged once, so a take's thousand rows of a few nodes cost a few checks."""
    out: dict[int, str] = {}
    for what, column, optional in (
        ("cluster", rows.cluster, False),
        ("node", rows.node, False),
        ("uuid", rows.uuid, False),
        ("model", rows.model, True),
    ):
        bad = {v: d for v in set(column) if (d := identity_problem(v, what, optional)) is not None}
        if bad:
            for row, value in enumerate(column):
                if value in bad and row not in out:
                    out[row] = bad[value]
    return out


def _pick(column: list[_Value], rows: list[int]) -> tuple[_Value, ...]:
    """``column`` at ``rows`` (ascending, each once) as a tuple."""
    return tuple(column) if len(rows) == len(column) else tuple(map(column.__getitem__, rows))


@lru_cache(maxsize=1024)
def _layout(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | None]:
    """The METRIC_NAMES column of each sent name, and the factor to its canonical unit (None: all 1)."""
    canonical = [UNIT_ALIASES.get(name, (name, 1.0)) for name in names]
    columns = np.array([METRIC_INDEX[name] for name, _ in canonical], dtype=np.intp)
    factor = np.array([f for _, f in canonical], dtype=np.float64)
    return columns, factor if (factor != 1.0).any() else None


def metric_matrix_of(groups: dict[tuple[str, ...], _Group], n: int) -> tuple[np.ndarray, dict[int, str]]:
    """A take's samples as a float64 matrix (rows: samples, columns: METRIC_NAMES, NaN: not sent) in canonical
    units, from the messages' value blocks gathered by their field names (one conversion per distinct list of
    names); and, for each row that sent a NaN, the first such field by name."""
    m = np.full((n, len(METRIC_NAMES)), np.nan)
    nan_field: dict[int, str] = {}
    for names, (blocks, unsent, ids) in groups.items():
        columns, factor = _layout(names)
        block = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        if factor is not None:
            block = block * factor
        m[np.asarray(ids, dtype=np.intp)[:, None], columns] = block
        nan = np.isnan(block)
        if not nan.any():
            continue
        if any(u is not None for u in unsent):  # a NaN where a field was not sent is no reading, not a NaN one
            gaps = [np.zeros(b.shape, dtype=bool) if u is None else u for b, u in zip(blocks, unsent, strict=True)]
            nan &= ~np.concatenate(gaps)
        for k in np.flatnonzero(nan.any(axis=1)).tolist():
            nan_field[ids[k]] = min(UNIT_ALIASES.get(names[j], (names[j],))[0] for j in np.flatnonzero(nan[k]))
    return m, nan_field


def process_raw(messages: list[RawMessage], now_ns: int, limits: ValidationSettings) -> Outcome:
    """Decode, validate and normalize a batch of raw messages (see module docstring)."""
    out = Outcome()
    rows = _Rows()
    extras: dict[int, tuple[list[GpuEvent], list[NicSample]]] = {}  # per source partition, in order
    for i, msg in enumerate(messages):
        try:
            raw, rejected = decode_raw(msg.value)
        except DecodeError as exc:
            out.dead.append(
                dead_letter(msg.key, msg.value, exc.reason, exc.detail, STAGE, msg.source, import_run=msg.import_run)
            )
            continue
        out.dead.extend(_rejects(msg, rejected))
        rows.add(i, raw)
        if raw.events or raw.nics:
            backfill = msg.import_run is not None
            events, nics = extras.setdefault(msg.partition, ([], []))
            origins = out.origins.setdefault(msg.partition, Origins())
            event_check = partial(event_problem, now_ns=now_ns, limits=limits, backfill=backfill)
            for position, event in _checked(msg, raw.events, "event", event_check, out, rejected):
                events.append(event)
                origins.events.append((i, position))
            nic_check = partial(nic_problem, now_ns=now_ns, limits=limits, backfill=backfill)
            for position, nic in _checked(msg, raw.nics, "nic", nic_check, out, rejected):
                nics.append(nic)
                origins.nics.append((i, position))
    n = len(rows.uuid)
    m, nan_field = metric_matrix_of(rows.groups, n)
    m = round_byte_counts(m)
    ts = np.array(rows.ts_ns, dtype=np.int64)
    owners = np.array(rows.owner, dtype=np.intp)
    backfilled = np.array([msg.import_run is not None for msg in messages], dtype=bool)[owners]
    good, problems = validate(m, ts, now_ns, limits, backfilled)
    # an identity the store cannot hold, then a NaN sent, come before what validate found in the same row
    first = {row: (BAD_IDENTITY, detail) for row, detail in identity_problems(rows).items()}
    for row in sorted(nan_field):
        first.setdefault(row, ("nan", f"{nan_field[row]} is NaN"))
    problems = [(r, *first[r]) for r in sorted(first)] + [p for p in problems if p[0] not in first]
    good[list(first)] = False
    for row, reason, detail in problems:
        msg = messages[rows.owner[row]]
        out.dead.append(
            dead_letter(
                msg.key,
                msg.value,
                reason,
                detail,
                STAGE,
                msg.source,
                rows.uuid[row],
                rows.position[row],
                import_run=msg.import_run,
            )
        )
    partition = np.array([msg.partition for msg in messages], dtype=np.int64)[owners]
    for part in sorted(set(partition[good].tolist()) | set(extras)):
        picked = np.flatnonzero(good & (partition == part)).tolist()  # ascending: the order the samples arrived in
        events, nics = extras.get(part, ([], []))
        if picked or events or nics:
            out.forward.append((part, rows.batch(picked, ts, m, events, nics)))
            out.origins.setdefault(part, Origins()).rows = list(
                zip(_pick(rows.owner, picked), _pick(rows.position, picked), strict=True)
            )
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
