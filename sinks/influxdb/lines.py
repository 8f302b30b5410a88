"""Interpreted events, findings, baselines and feedback as InfluxDB line protocol: pure functions, no I/O
(:mod:`sinks.influxdb.write` sends the lines).

Schema (the README has the cardinality budget):

``gpu`` - one point per GPU sample, timestamp in milliseconds.
  tags   ``cluster``, ``node``, ``gpu`` (uuid), ``gpu_index``, ``gpu_model``, ``application`` (when known).
         Together they identify one GPU (application adds at most a handful of series per GPU over a retention
         period). Nothing job-scoped is a tag: job ids and users would multiply series without bound.
  fields every canonical reading present in the sample (float, units in the name), the relative values
         (``*_ratio*``), ``verdict`` (string), ``score`` (float, when scored), ``job_id`` / ``user`` (strings,
         when known); the interpretation when there is one: ``app_source`` / ``app_confidence`` (who said which
         application, e.g. ``inferred`` 0.93), ``phase``, ``baseline`` (the id it was judged against),
         ``explanation`` and ``drivers`` (only on rows that are not normal).
``gpu_info`` - the GPU's limits (``FieldSpec.limit``: memory total, power limit, max clocks, thermal
  thresholds, max PCIe link), same tags but ``application``, written when they change and every 10 minutes.
  Repeating them every second cost InfluxDB a quarter of its per-point work for values that never change.
``gpu_event`` - one point per discrete event (XID, ECC, row remap, GPU lost...): GPU tags plus ``kind`` and
  ``code`` (both bounded); fields ``detail``, ``dedup_key``.
``nic`` - one point per InfiniBand/RoCE port reading: tags ``cluster``, ``node``, ``device``, ``port``.
``nvlink`` - per link (tag ``link``): state, error counters and throughput, written when the state or an error
  counter changes and every 10 minutes (per-GPU NVLink totals are in ``gpu`` every sample).
``gpu_process`` - the processes on a GPU (``count``, ``processes`` as "pid name MiB; ..."), on change and every
  10 minutes.
``finding`` - every detector finding (from the alerts topic): tags ``cluster``, ``node``, ``gpu``, ``detector``,
  ``severity``, ``application`` (when known); fields ``active`` (1/0), ``summary``, ``action``, ``since_ns``,
  ``job_id``, and the evidence as ``ev_<name>``.

``baseline`` - the learned bands, written by ``hermeneut baselines train``: tags ``application``, ``gpu_model``
  (``*`` for priors), ``phase``, ``feature`` (the stored field it describes); fields ``p01`` ``p05`` ``p50``
  ``p95`` ``p99`` (in that field's units), ``n``, ``version``; timestamp = training time.
``feedback`` - operators' verdicts on events (``hermeneut feedback``): tags ``cluster``, ``gpu``,
  ``application``, ``gpu_model``; fields ``verdict``, ``note``, ``user``, ``event_ts_ms``, ``event_id``.

A replayed event has the same measurement, tags and timestamp, so InfluxDB overwrites instead of duplicating.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np

from pipeline.baselines import BaselineBand, Feedback
from pipeline.events import (
    METRIC_LIMIT,
    METRIC_NAMES,
    NIC_NAMES,
    RELATIVE_FIELDS,
    Driver,
    Finding,
    InterpretedBatch,
    NvLinkSample,
)

MEASUREMENT: Final = "gpu"
INFO_MEASUREMENT: Final = "gpu_info"
EVENT_MEASUREMENT: Final = "gpu_event"
NIC_MEASUREMENT: Final = "nic"
NVLINK_MEASUREMENT: Final = "nvlink"
PROCESS_MEASUREMENT: Final = "gpu_process"
FINDING_MEASUREMENT: Final = "finding"
BASELINE_MEASUREMENT: Final = "baseline"
FEEDBACK_MEASUREMENT: Final = "feedback"
_TAG_ESCAPES = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": "", "\r": ""})


def tag(value: str) -> str:
    """A tag value with line protocol's escapes (commas, equals signs, spaces; no line breaks)."""
    return value.translate(_TAG_ESCAPES)


def string_field(value: str) -> str:
    """A quoted string field value (backslashes and quotes escaped, line breaks as spaces)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


_READING_COLS: Final = np.flatnonzero(~METRIC_LIMIT)
_LIMIT_COLS: Final = np.flatnonzero(METRIC_LIMIT)
_READING_KEYS: Final = tuple(f"{METRIC_NAMES[c]}=" for c in _READING_COLS.tolist())
_LIMIT_KEYS: Final = tuple(f"{METRIC_NAMES[c]}=" for c in _LIMIT_COLS.tolist())
_RELATIVE_KEYS: Final = tuple(f"{name}=" for name in RELATIVE_FIELDS)
INFO_REFRESH_NS: Final = 600 * 10**9


def _field_parts(keys: tuple[str, ...], values: np.ndarray) -> list[str]:
    """Per row, ``k=v`` pairs joined by commas, leaving out NaN (absent) values.

    A plain comprehension: measured faster than selecting columns with numpy on node-sized batches.
    """
    # `v == v` is False only for NaN
    return [",".join([k + repr(v) for k, v in zip(keys, row, strict=True) if v == v]) for row in values.tolist()]  # noqa: PLR0124


def _gpu_tags(b: InterpretedBatch, i: int) -> str:
    # line protocol has no empty tag value (InfluxDB refuses the whole write): a model nobody named is left out
    model = tag(b.gpu_model[i])
    return (
        f"cluster={tag(b.cluster[i])},gpu={tag(b.gpu_uuid[i])},gpu_index={b.gpu_index[i]},"
        f"{'gpu_model=' + model + ',' if model else ''}node={tag(b.node[i])}"
    )


class ChangeTracker:
    """Which value was last written per key, so slowly changing things get a point only on change or when the
    last one is 10 minutes old (what a dashboard needs to find the current value in a short time range)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, int]] = {}

    def due(self, key: str, signature: str, ts_ns: int) -> bool:
        last = self._last.get(key)
        if last is None or last[0] != signature or ts_ns - last[1] >= INFO_REFRESH_NS:
            self._last[key] = (signature, ts_ns)
            return True
        return False


class InfoTracker:
    """Change-only points for a GPU's slowly changing parts: limits (``gpu_info``), links and processes."""

    def __init__(self) -> None:
        self._changes = ChangeTracker()

    def lines(self, b: InterpretedBatch) -> list[str]:
        out = []
        limits = _field_parts(_LIMIT_KEYS, b.metrics[:, _LIMIT_COLS])
        ts_ns = b.ts_ns.tolist()
        for i, fields in enumerate(limits):
            tags, ts = _gpu_tags(b, i), ts_ns[i]
            if fields and self._changes.due(f"info/{b.cluster[i]}/{b.gpu_uuid[i]}", fields, ts):
                out.append(f"{INFO_MEASUREMENT},{tags} {fields} {ts // 1_000_000}")
            links, procs = b.links[i], b.processes[i]
            for link in links or ():
                errors = (link.crc_errors_total, link.replay_errors_total, link.recovery_errors_total)
                if self._changes.due(f"link/{b.cluster[i]}/{b.gpu_uuid[i]}/{link.link}", f"{link.active}{errors}", ts):
                    out.append(_link_line(tags, link, ts))
            if procs is not None:
                described = "; ".join(
                    f"{p.pid} {p.name}" + ("" if p.used_memory_bytes is None else f" {p.used_memory_bytes >> 20}MiB")
                    for p in procs
                )
                signature = ",".join(sorted(f"{p.pid}:{p.name}" for p in procs))
                if self._changes.due(f"proc/{b.cluster[i]}/{b.gpu_uuid[i]}", signature, ts):
                    out.append(
                        f"{PROCESS_MEASUREMENT},{tags} count={float(len(procs))!r},"
                        f"processes={string_field(described)} {ts // 1_000_000}"
                    )
        return out


def _link_line(gpu_tags: str, link: NvLinkSample, ts_ns: int) -> str:
    fields = [f"active={float(link.active)!r}"]
    for name in ("tx_bytes_per_second", "rx_bytes_per_second"):
        value = getattr(link, name)
        if value is not None:
            fields.append(f"{name}={float(value)!r}")
    for name in ("crc_errors_total", "replay_errors_total", "recovery_errors_total"):
        value = getattr(link, name)
        if value is not None:
            fields.append(f"{name}={float(value)!r}")
    return f"{NVLINK_MEASUREMENT},{gpu_tags},link={link.link} {','.join(fields)} {ts_ns // 1_000_000}"


def extra_lines(b: InterpretedBatch) -> list[str]:
    """``gpu_event`` and ``nic`` points for the node-level extras of a batch."""
    out = []
    for e in b.gpu_events:
        out.append(
            f"{EVENT_MEASUREMENT},cluster={tag(e.cluster)},code={e.code},gpu={tag(e.gpu_uuid)},"
            f"gpu_index={e.gpu_index},kind={e.kind.value},node={tag(e.node)} "
            f"detail={string_field(e.detail)},dedup_key={string_field(e.dedup_key)} {e.ts_ns // 1_000_000}"
        )
    for n in b.nics:
        fields = ",".join(f"{k}={float(n.metrics[k])!r}" for k in NIC_NAMES if k in n.metrics)
        if fields:
            out.append(
                f"{NIC_MEASUREMENT},cluster={tag(n.cluster)},device={tag(n.device)},node={tag(n.node)},"
                f"port={n.port} {fields} {n.ts_ns // 1_000_000}"
            )
    return out


def batch_lines(batches: Iterable[InterpretedBatch], info: InfoTracker | None = None) -> list[str]:
    """Line protocol for every event of the batches, straight from their columns (the sink's hot path).

    Readings go to ``gpu``; with an ``info`` tracker, changed limits go to ``gpu_info``. Tags are in sorted key
    order, as InfluxDB prefers; absent values (NaN) are left out; every metric is a float field, so a field
    never changes type between writes.
    """
    lines: list[str] = []
    append = lines.append
    for b in batches:
        readings = _field_parts(_READING_KEYS, b.metrics[:, _READING_COLS])
        relative = _field_parts(_RELATIVE_KEYS, b.relative)
        ts_ms = (b.ts_ns // 1_000_000).tolist()
        scores = b.score.tolist()
        for i in range(len(b)):
            wl = b.workload[i]
            app = f"application={tag(wl.application)}," if wl and wl.application else ""
            fields = [readings[i]] if readings[i] else []
            if relative[i]:
                fields.append(relative[i])
            fields.append(f"verdict={string_field(b.verdict[i].value)}")
            if scores[i] == scores[i]:
                fields.append(f"score={scores[i]!r}")
            if wl and wl.job_id:
                fields.append(f"job_id={string_field(wl.job_id)}")
            if wl and wl.user:
                fields.append(f"user={string_field(wl.user)}")
            if wl:
                fields.append(f"app_source={string_field(wl.source)},app_confidence={float(wl.confidence)!r}")
            phase, baseline = b.phase[i], b.baseline[i]
            if phase:
                fields.append(f"phase={string_field(phase)}")
            if baseline:
                fields.append(f"baseline={string_field(baseline)}")
            if b.explanation[i]:
                fields.append(f"explanation={string_field(b.explanation[i])}")
            if b.drivers[i]:
                fields.append(f"drivers={string_field(drivers_text(b.drivers[i]))}")
            append(f"{MEASUREMENT},{app}{_gpu_tags(b, i)} {','.join(fields)} {ts_ms[i]}")
        if info is not None:
            lines.extend(info.lines(b))
        lines.extend(extra_lines(b))
    return lines


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
        f"{BASELINE_MEASUREMENT},application={tag(band.application)},feature={tag(band.feature)},"
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
    return f"{FEEDBACK_MEASUREMENT},{tags} {fields} {fb.ts_ns // 1_000_000}"


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
    fields += [f"ev_{k}={float(v)!r}" for k, v in sorted(f.evidence.items()) if v == v]  # noqa: PLR0124
    return (
        f"{FINDING_MEASUREMENT},{app}cluster={tag(f.cluster)},detector={tag(f.detector)},"
        f"gpu={tag(f.gpu_uuid or '-')},node={tag(f.node)},severity={f.severity.value} "
        f"{','.join(fields)} {f.ts_ns // 1_000_000}"
    )
