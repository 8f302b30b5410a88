"""Interpreted events, findings, baselines and feedback as InfluxDB line protocol: pure functions, no I/O
(:mod:`sinks.influxdb.write` sends the lines).

The schema, every measurement with its tags and fields, is :mod:`sinks.influxdb.schema`.

A replayed event has the same measurement, tags and timestamp, so InfluxDB overwrites instead of duplicating.

What a line cannot carry is refused before it becomes one (:func:`refusals`, each row or extra alone): an identity
:mod:`pipeline.identity` refuses, a value that is not finite (InfluxDB refuses ``inf`` and the whole request with
it; NaN is "absent" and left out), a time further ahead than the sink allows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.baselines import BaselineBand, Feedback
from pipeline.events import (
    METRIC_LIMIT,
    METRIC_NAMES,
    METRIC_STATE,
    NIC_NAMES,
    RELATIVE_FIELDS,
    Driver,
    Finding,
    GpuEvent,
    GpuProcess,
    InterpretedBatch,
    NicSample,
    NvLinkSample,
    Verdict,
)
from pipeline.identity import BAD_IDENTITY, identity_problem
from pipeline.notifications import NotificationRecord
from sinks.influxdb.schema import (
    BASELINE,
    FEEDBACK,
    FINDING,
    GPU,
    GPU_EVENT,
    GPU_INFO,
    GPU_PROCESS,
    NIC,
    NOTIFICATION,
    NVLINK,
)

_TAG_ESCAPES = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": "", "\r": ""})


def tag(value: str) -> str:
    """A tag value with line protocol's escapes (commas, equals signs, spaces; no line breaks)."""
    return value.translate(_TAG_ESCAPES)


def string_field(value: str) -> str:
    """A quoted string field value (backslashes and quotes escaped, line breaks as spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


#: readings written every sample, readings written on change (states and counters), limits (``gpu_info``)
_SAMPLE_COLS: Final = np.flatnonzero(~METRIC_LIMIT & ~METRIC_STATE)
_STATE_COLS: Final = np.flatnonzero(METRIC_STATE)
_LIMIT_COLS: Final = np.flatnonzero(METRIC_LIMIT)
_SAMPLE_KEYS: Final = tuple(f"{METRIC_NAMES[c]}=" for c in _SAMPLE_COLS.tolist())
_STATE_KEYS: Final = tuple(f"{METRIC_NAMES[c]}=" for c in _STATE_COLS.tolist())
_LIMIT_KEYS: Final = tuple(f"{METRIC_NAMES[c]}=" for c in _LIMIT_COLS.tolist())
#: what is stored on change is stored again at the first sample of every refresh period, so a short time range
#: always finds the current value (a dashboard's "now", a query's fill-forward)
INFO_REFRESH_NS: Final = 600 * 10**9


def _field_parts(keys: tuple[str, ...], values: np.ndarray) -> list[str]:
    """Per row, ``k=v`` pairs joined by commas, leaving out NaN (absent) values.

    A plain comprehension: measured as fast as numpy's string functions or one format template per row (their
    conversions cost what repr saves), and simpler (docs/performance.md).
    """
    # `v == v` is False only for NaN
    return [",".join([k + repr(v) for k, v in zip(keys, row, strict=True) if v == v]) for row in values.tolist()]  # noqa: PLR0124


def _masked_parts(keys: tuple[str, ...], values: np.ndarray, write: np.ndarray) -> list[str]:
    """Like :func:`_field_parts` for the cells ``write`` marks only (NaN where not written)."""
    return _field_parts(keys, np.where(write, values, np.nan))


def _gpu_tags(cluster: str, uuid: str, index: int, model: str, node: str) -> str:
    # line protocol has no empty tag value (InfluxDB refuses the whole write): a model nobody named is left out
    named = f"gpu_model={tag(model)}," if tag(model) else ""
    return f"cluster={tag(cluster)},gpu={tag(uuid)},gpu_index={index},{named}node={tag(node)}"


def series_tags(cluster: str, node: str, uuid: str, index: int, model: str, application: str | None) -> str:
    """The tags of a ``gpu`` series, in sorted key order (``application`` only when known)."""
    app = f"application={tag(application)}," if application else ""
    return app + _gpu_tags(cluster, uuid, index, model, node)


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cell-wise equality where two absent values (NaN) are the same."""
    with np.errstate(invalid="ignore"):
        same: np.ndarray = (a == b) | (np.isnan(a) & np.isnan(b))
    return same


#: the interpretation of a row that is stored when it changes: phase, baseline, user, source, confidence
_Interpretation = tuple[str | None, str | None, str | None, str | None, float | None]


class InfoTracker:
    """What the sink last wrote per GPU, so that what changes rarely is written when it changes (and at the first
    sample of every refresh period) instead of every second: the limits (``gpu_info``), the state and counter
    readings, the interpretation (phase, baseline, user, who named the application), links and processes.

    Change detection is vectorized over a batch: each row is compared with the previous row of the same GPU (in
    the batch, or the last one written before it). Tag strings are built once per GPU.
    """

    def __init__(self) -> None:
        self._slots: dict[tuple[str, str, str, int, str], int] = {}
        self.tags: list[str] = []
        cap = 1024
        self._state = np.full((cap, len(_STATE_COLS)), np.nan)
        self._limits = np.full((cap, len(_LIMIT_COLS)), np.nan)
        self._ts = np.full(cap, -1, dtype=np.int64)
        self._interp: list[_Interpretation | None] = []
        self._links: dict[int, dict[int, tuple[bool, int | None, int | None, int | None]]] = {}
        self._procs: dict[int, tuple[tuple[int, str], ...]] = {}

    def slots(self, b: InterpretedBatch) -> np.ndarray:
        """Each row's GPU slot (a new GPU gets one, its tag string built here)."""
        out = np.empty(len(b), dtype=np.int64)
        get = self._slots.get
        for i, key in enumerate(zip(b.cluster, b.node, b.gpu_uuid, b.gpu_index, b.gpu_model, strict=True)):
            slot = get(key)
            if slot is None:
                slot = self._slots[key] = len(self.tags)
                self.tags.append(_gpu_tags(key[0], key[2], key[3], key[4], key[1]))
                self._interp.append(None)
                if slot == len(self._ts):
                    self._grow()
            out[i] = slot
        return out

    def _grow(self) -> None:
        n = len(self._ts)
        self._state = np.vstack([self._state, np.full_like(self._state, np.nan)])
        self._limits = np.vstack([self._limits, np.full_like(self._limits, np.nan)])
        self._ts = np.concatenate([self._ts, np.full(n, -1, dtype=np.int64)])

    def changes(self, b: InterpretedBatch, slots: np.ndarray) -> Changes:
        """Which rows and cells of the batch to write, and remember the batch's last row per GPU."""
        n = len(b)
        order = np.argsort(slots, kind="stable")  # rows of one GPU together, in the batch's (time) order
        sorted_slots = slots[order]
        first = np.ones(n, dtype=bool)
        first[1:] = sorted_slots[1:] != sorted_slots[:-1]
        prev = np.empty(n, dtype=np.int64)  # the previous row of the same GPU, -1: the one written before
        prev[order] = np.where(first, -1, np.roll(order, 1))
        before = prev < 0
        state, limits = b.metrics[:, _STATE_COLS], b.metrics[:, _LIMIT_COLS]
        prev_state = np.where(before[:, None], self._state[slots], state[prev])
        prev_limits = np.where(before[:, None], self._limits[slots], limits[prev])
        prev_ts = np.where(before, self._ts[slots], b.ts_ns[prev])
        refresh = (prev_ts < 0) | (b.ts_ns // INFO_REFRESH_NS != prev_ts // INFO_REFRESH_NS)
        write_state = ~np.isnan(state) & (~_same(state, prev_state) | refresh[:, None])
        write_limits = ~np.all(_same(limits, prev_limits), axis=1) | refresh
        last = order[np.r_[first[1:], True]]  # each GPU's last row in the batch
        self._state[slots[last]] = state[last]
        self._limits[slots[last]] = limits[last]
        self._ts[slots[last]] = b.ts_ns[last]
        return Changes(write_state, write_limits & ~np.all(np.isnan(limits), axis=1), refresh, prev)

    def interpretation_changed(self, b: InterpretedBatch, slots: np.ndarray, changes: Changes) -> list[bool]:
        """Per row: is its interpretation different from the previous row of its GPU (or due a refresh)?"""
        out = []
        seen: dict[int, _Interpretation] = {}
        interp = self._interp
        for i, slot in enumerate(slots.tolist()):
            wl = b.workload[i]
            now: _Interpretation = (
                b.phase[i],
                b.baseline[i],
                wl.user if wl else None,
                wl.source if wl else None,
                float(wl.confidence) if wl else None,
            )
            last = seen.get(slot, interp[slot])
            out.append(now != last or bool(changes.refresh[i]))
            seen[slot] = now
        for slot, now in seen.items():
            interp[slot] = now
        return out

    def lines(self, b: InterpretedBatch, slots: np.ndarray, changes: Changes) -> list[str]:
        """``gpu_info`` points for changed limits, ``nvlink`` and ``gpu_process`` points for changed links and
        processes."""
        out = []
        ts_ms = (b.ts_ns // 1_000_000).tolist()
        rows = np.flatnonzero(changes.limits)
        for i, fields in zip(rows.tolist(), _field_parts(_LIMIT_KEYS, b.metrics[rows][:, _LIMIT_COLS]), strict=True):
            out.append(f"{GPU_INFO},{self.tags[slots[i]]} {fields} {ts_ms[i]}")
        refresh = changes.refresh.tolist()
        for i, (links, procs) in enumerate(zip(b.links, b.processes, strict=True)):
            if links:
                out += self._link_lines(int(slots[i]), links, refresh[i], ts_ms[i])
            if procs is not None:
                signature = tuple(sorted((p.pid, p.name) for p in procs))
                slot = int(slots[i])
                if refresh[i] or self._procs.get(slot) != signature:
                    self._procs[slot] = signature
                    out.append(_process_line(self.tags[slot], procs, ts_ms[i]))
        return out

    def _link_lines(self, slot: int, links: tuple[NvLinkSample, ...], refresh: bool, ts_ms: int) -> list[str]:
        known = self._links.setdefault(slot, {})
        out = []
        for link in links:
            signature = (link.active, link.crc_errors_total, link.replay_errors_total, link.recovery_errors_total)
            if refresh or known.get(link.link) != signature:
                known[link.link] = signature
                out.append(_link_line(self.tags[slot], link, ts_ms))
        return out


@dataclass(frozen=True, slots=True, eq=False)
class Changes:
    """What of a batch is written besides every sample's own readings (see :meth:`InfoTracker.changes`)."""

    #: rows x state columns: cells to write
    state: np.ndarray
    #: rows whose limits changed (or are due a refresh)
    limits: np.ndarray
    #: rows that are the first of their GPU in a refresh period
    refresh: np.ndarray
    #: the previous row of the same GPU in the batch (-1: none)
    prev: np.ndarray


def _process_line(gpu_tags: str, procs: tuple[GpuProcess, ...], ts_ms: int) -> str:
    described = "; ".join(
        f"{p.pid} {p.name}" + ("" if p.used_memory_bytes is None else f" {p.used_memory_bytes >> 20}MiB") for p in procs
    )
    return f"{GPU_PROCESS},{gpu_tags} count={float(len(procs))!r},processes={string_field(described)} {ts_ms}"


def _link_line(gpu_tags: str, link: NvLinkSample, ts_ms: int) -> str:
    fields = [f"active={float(link.active)!r}"]
    for name in ("tx_bytes_per_second", "rx_bytes_per_second"):
        value = getattr(link, name)
        if value is not None:
            fields.append(f"{name}={float(value)!r}")
    for name in ("crc_errors_total", "replay_errors_total", "recovery_errors_total"):
        value = getattr(link, name)
        if value is not None:
            fields.append(f"{name}={float(value)!r}")
    return f"{NVLINK},{gpu_tags},link={link.link} {','.join(fields)} {ts_ms}"


def extra_lines(b: InterpretedBatch) -> list[str]:
    """``gpu_event`` and ``nic`` points for the node-level extras of a batch."""
    out = []
    for e in b.gpu_events:
        out.append(
            f"{GPU_EVENT},cluster={tag(e.cluster)},code={e.code},gpu={tag(e.gpu_uuid)},"
            f"gpu_index={e.gpu_index},kind={e.kind.value},node={tag(e.node)} "
            f"detail={string_field(e.detail)},dedup_key={string_field(e.dedup_key)} {e.ts_ns // 1_000_000}"
        )
    for n in b.nics:
        fields = ",".join(f"{k}={float(n.metrics[k])!r}" for k in NIC_NAMES if k in n.metrics)
        if fields:
            out.append(
                f"{NIC},cluster={tag(n.cluster)},device={tag(n.device)},node={tag(n.node)},"
                f"port={n.port} {fields} {n.ts_ns // 1_000_000}"
            )
    return out


def batch_lines(batches: Iterable[InterpretedBatch], info: InfoTracker | None = None) -> list[str]:
    """Line protocol for every event of the batches, straight from their columns (the sink's hot path).

    Every sample writes its moving readings, ``verdict``, ``score`` and ``job_id`` to ``gpu`` (relative values are
    not stored: the query layer divides a reading by the limit in ``gpu_info`` per point, the rollups keep them).
    With an ``info`` tracker (the sink), what changes rarely is written when it changes and at every refresh:
    state and counter readings, the interpretation (``phase``, ``baseline``, ``user``, ``app_source``,
    ``app_confidence``), limits (``gpu_info``), links and processes; a row that is not normal always carries its
    whole interpretation (``explanation``, ``drivers``, ``baseline``, ``phase``), so each anomalous point stands on
    its own. Without a tracker every row writes everything. Tags are in sorted key order, as InfluxDB prefers;
    absent values (NaN) are left out; every metric is a float field, so a field never changes type.
    """
    lines: list[str] = []
    append = lines.append
    tracker = info or InfoTracker()
    for b in batches:
        if not len(b):
            lines.extend(extra_lines(b))
            continue
        slots = tracker.slots(b)
        if info is None:
            refresh = np.ones(len(b), dtype=bool)
            changes = Changes(~np.isnan(b.metrics[:, _STATE_COLS]), refresh, refresh, np.full(len(b), -1))
            interp_due = [True] * len(b)
        else:
            changes = tracker.changes(b, slots)
            interp_due = tracker.interpretation_changed(b, slots, changes)
        readings = _field_parts(_SAMPLE_KEYS, b.metrics[:, _SAMPLE_COLS])
        state_rows = np.flatnonzero(changes.state.any(axis=1))
        states = dict(
            zip(
                state_rows.tolist(),
                _masked_parts(_STATE_KEYS, b.metrics[state_rows][:, _STATE_COLS], changes.state[state_rows]),
                strict=True,
            )
        )
        ts_ms = (b.ts_ns // 1_000_000).tolist()
        scores = b.score.tolist()
        tags = tracker.tags
        for i, slot in enumerate(slots.tolist()):
            wl = b.workload[i]
            app = f"application={tag(wl.application)}," if wl and wl.application else ""
            fields = [readings[i]] if readings[i] else []
            if i in states:
                fields.append(states[i])
            verdict = b.verdict[i]
            fields.append(f"verdict={string_field(verdict.value)}")
            if scores[i] == scores[i]:
                fields.append(f"score={scores[i]!r}")
            if wl and wl.job_id:
                fields.append(f"job_id={string_field(wl.job_id)}")
            unusual = verdict is Verdict.UNUSUAL or verdict is Verdict.ANOMALOUS
            if interp_due[i] or unusual:
                phase, baseline = b.phase[i], b.baseline[i]
                if phase:
                    fields.append(f"phase={string_field(phase)}")
                if baseline:
                    fields.append(f"baseline={string_field(baseline)}")
            if interp_due[i] and wl:
                if wl.user:
                    fields.append(f"user={string_field(wl.user)}")
                fields.append(f"app_source={string_field(wl.source)},app_confidence={float(wl.confidence)!r}")
            if b.explanation[i]:
                fields.append(f"explanation={string_field(b.explanation[i])}")
            if b.drivers[i]:
                fields.append(f"drivers={string_field(drivers_text(b.drivers[i]))}")
            append(f"{GPU},{app}{tags[slot]} {','.join(fields)} {ts_ms[i]}")
        if info is not None:
            lines.extend(info.lines(b, slots, changes))
        lines.extend(extra_lines(b))
    return lines


#: a refused item of an interpreted batch: (index in its list, reason, detail)
Refused = tuple[int, str, str]


def _identities(named: tuple[tuple[str, tuple[str, ...], bool], ...], n: int) -> dict[int, str]:
    """Per index whose identity (``(what, column, optional)``) cannot be stored, why; each distinct value judged
    once."""
    out: dict[int, str] = {}
    for what, column, optional in named:
        bad = {v: d for v in set(column) if (d := identity_problem(v, what, optional)) is not None}
        for i in range(n) if bad else ():
            if column[i] in bad and i not in out:
                out[i] = bad[column[i]]
    return out


_FINITE_NAMES: Final = (*METRIC_NAMES, *RELATIVE_FIELDS, "score")


def _not_finite(values: np.ndarray, names: tuple[str, ...]) -> dict[int, str]:
    """Per row holding an infinite value (NaN is an absent one), which."""
    inf = np.isinf(values)
    return {
        int(r): f"{names[int(np.flatnonzero(inf[r])[0])]}={float(values[r][inf[r]][0])!r} is not finite"
        for r in np.flatnonzero(inf.any(axis=1))
    }


def _future(ts_ns: np.ndarray, newest_ns: int) -> dict[int, str]:
    return {
        int(r): f"ts_ns {int(ts_ns[r])} is {(int(ts_ns[r]) - newest_ns) / 1e9:.0f} s beyond the newest time "
        "the sink accepts (twice validation.max_future_skew_s ahead of its clock)"
        for r in np.flatnonzero(ts_ns > newest_ns)
    }


def refusals(b: InterpretedBatch, newest_ns: int) -> tuple[list[Refused], list[Refused], list[Refused]]:
    """The rows, GPU events and NIC readings of an interpreted batch that cannot become lines, each with its reason
    and detail: an identity that line protocol or the bucket cannot hold (``bad_identity``), a value that is not
    finite (``not_finite``), a time after ``newest_ns`` (``future_timestamp``: it would open a rollup minute
    years ahead and leave every real row late). Vectorized over the rows; identities judged once per value."""
    n = len(b)
    apps = tuple((w.application or "") if w else "" for w in b.workload)
    named = (
        ("cluster", b.cluster, False),
        ("node", b.node, False),
        ("uuid", b.gpu_uuid, False),
        ("model", b.gpu_model, True),
        ("application", apps, True),
    )
    found: dict[int, tuple[str, str]] = {i: (BAD_IDENTITY, d) for i, d in _identities(named, n).items()}
    inf = np.isinf(b.metrics).any(axis=1) | np.isinf(b.relative).any(axis=1) | np.isinf(b.score)
    bad = np.flatnonzero(inf)  # the columns are put together for those rows only: a copy per message costs
    values = np.column_stack([b.metrics[bad], b.relative[bad], b.score[bad]])
    for reason, rows in (
        ("not_finite", {int(bad[k]): d for k, d in _not_finite(values, _FINITE_NAMES).items()}),
        ("future_timestamp", _future(b.ts_ns, newest_ns)),
    ):
        for i, detail in rows.items():
            found.setdefault(i, (reason, detail))
    rows_out = [(i, *found[i]) for i in sorted(found)]
    events = [(i, *p) for i, e in enumerate(b.gpu_events) if (p := _event_problem(e, newest_ns)) is not None]
    nics = [(i, *p) for i, x in enumerate(b.nics) if (p := _nic_problem(x, newest_ns)) is not None]
    return rows_out, events, nics


def _event_problem(e: GpuEvent, newest_ns: int) -> tuple[str, str] | None:
    return _extra_problem((("cluster", e.cluster), ("node", e.node), ("uuid", e.gpu_uuid)), e.ts_ns, {}, newest_ns)


def _nic_problem(x: NicSample, newest_ns: int) -> tuple[str, str] | None:
    named = (("cluster", x.cluster), ("node", x.node), ("device", x.device))
    return _extra_problem(named, x.ts_ns, x.metrics, newest_ns)


def _extra_problem(
    named: tuple[tuple[str, str], ...], ts_ns: int, metrics: dict[str, float], newest_ns: int
) -> tuple[str, str] | None:
    """Why a GPU event or NIC reading cannot become a line (None: it can)."""
    for what, value in named:
        detail = identity_problem(value, what)
        if detail is not None:
            return BAD_IDENTITY, detail
    for name, reading in metrics.items():
        if not math.isfinite(reading):  # a NIC reading is written as it is: NaN is not "absent" there
            return "not_finite", f"{name}={reading!r} is not finite"
    if ts_ns > newest_ns:
        return (
            "future_timestamp",
            f"ts_ns {ts_ns} is {(ts_ns - newest_ns) / 1e9:.0f} s beyond the newest time the sink accepts",
        )
    return None


def drivers_text(drivers: tuple[Driver, ...]) -> str:
    """Drivers as one string field: ``feature=observed (p50 expected, p5..p95 low..high)`` joined by ``; ``."""
    return "; ".join(
        f"{d.feature}={d.observed:.4g} (p50 {d.expected:.4g}, p5..p95 {d.low:.4g}..{d.high:.4g})" for d in drivers
    )


def baseline_band_line(band: BaselineBand) -> str:
    """One ``baseline`` point (see module docstring)."""
    fields = ",".join(
        f"{name}={float(getattr(band, name))!r}" for name in ("p01", "p05", "p50", "p95", "p99", "n", "version")
    )
    return (
        f"{BASELINE},application={tag(band.application)},feature={tag(band.feature)},"
        f"gpu_model={tag(band.gpu_model)},phase={tag(band.phase)} {fields} {band.ts_ns // 1_000_000}"
    )


def feedback_line(fb: Feedback) -> str:
    """One ``feedback`` point, at the time the operator gave it (see module docstring)."""
    tags = f"cluster={tag(fb.cluster)},gpu={tag(fb.gpu_uuid)}"
    if fb.application:
        tags = f"application={tag(fb.application)}," + tags
    if fb.gpu_model:
        tags += f",gpu_model={tag(fb.gpu_model)}"
    fields = (
        f"verdict={string_field(fb.verdict)},note={string_field(fb.note)},user={string_field(fb.user)},"
        f"event_ts_ms={float(fb.event_ts_ms)!r},event_id={string_field(fb.event_id)}"
    )
    return f"{FEEDBACK},{tags} {fields} {fb.ts_ns // 1_000_000}"


def finding_line(f: Finding) -> str:
    """One ``finding`` point (see module docstring)."""
    wl = f.workload
    app = f"application={tag(wl.application)}," if wl and wl.application else ""
    fields = [
        f"active={float(f.active)!r}",
        f"summary={string_field(f.summary)}",
        f"since_ns={float(f.since_ns)!r}",
    ]
    if f.action:
        fields.append(f"action={string_field(f.action)}")
    if wl and wl.job_id:
        fields.append(f"job_id={string_field(wl.job_id)}")
    if f.maintenance:
        fields.append(f"maintenance={string_field(f.maintenance)}")
    # evidence that is not a finite number is left out (InfluxDB refuses ``inf``, and with it the finding)
    fields += [f"ev_{k}={float(v)!r}" for k, v in sorted(f.evidence.items()) if math.isfinite(v)]
    return (
        f"{FINDING},{app}cluster={tag(f.cluster)},detector={tag(f.detector)},"
        f"gpu={tag(f.gpu_uuid or '-')},node={tag(f.node)},severity={f.severity.value} "
        f"{','.join(fields)} {f.ts_ns // 1_000_000}"
    )


def notification_line(r: NotificationRecord) -> str:
    """One ``notification`` point, at the record's time (made unique in its series by the alert manager)."""
    tags = (
        f"cluster={tag(r.cluster) or '-'},detector={tag(r.detector) or '-'},outcome={tag(r.outcome)},"
        f"receiver_kind={tag(r.receiver_kind)},status={tag(r.status)},subscription={tag(r.subscription)}"
    )
    fields = (
        f"dedup_key={string_field(r.dedup_key)},fingerprint={string_field(r.fingerprint)},attempt={r.attempt}i,"
        f"http_status={r.http_status}i,error={string_field(r.error)},latency_ms={float(r.latency_ms)!r},"
        f"group_key={string_field(r.group_key)},summary={string_field(r.summary)},receiver={string_field(r.receiver)},"
        f"owner={string_field(r.owner)},delivery_id={string_field(r.delivery_id)},reason={string_field(r.reason)}"
    )
    return f"{NOTIFICATION},{tags} {fields} {r.ts_ns // 1_000_000}"
