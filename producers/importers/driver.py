"""The import loop: an importer's blocks, published as live data would be, marked as backfill, resumable.

Per block, in order:

1. rows of a GPU at a millisecond it already has in the block are rejected (``duplicate``): InfluxDB would keep
   one of them silently;
2. each series' sampling interval is detected (:class:`~producers.importers.rows.Intervals`) and stamped on its
   samples (``sample_interval_seconds``), so GPU-hours and idle time need no setting;
3. the workload contexts of the block (where a GPU's workload changes) go to the context topic and are
   *delivered* before any of the rows they cover is sent: the processor, which catches its context mirror up
   before labelling a batch, then labels every row with the context of its own time;
4. the rows the importer could not read, and the duplicates, go to the dead-letter topic with the original
   bytes, the reason, where they were (``hermeneut-source``: ``file:line``) and the import run;
5. one message per node and timestamp goes to the raw topic, each with the header ``hermeneut-import: <run>``:
   the processor judges it by the backfill age bound, and its dead letters carry the run too.

Once a block is delivered the :class:`Checkpoint` (a JSON file per import: same source, same options, same
cluster) records it; run again, the import skips what was delivered (``restart`` starts over). Everything it
writes is idempotent downstream: the same sample is the same InfluxDB point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from pipeline.codec import CONTENT_TYPE, encode_record, encode_samples
from pipeline.config import TopicSettings
from pipeline.deadletter import IMPORT, dead_letter
from pipeline.errors import ServiceError
from pipeline.events import Workload
from pipeline.publisher import Headers
from producers.importers.rows import Block, Intervals, Rejection, context_changes, duplicates, node_batches
from producers.importers.rows import series_codes as _series_codes

log = logging.getLogger(__name__)

STAGE = "import"
HOUR_NS = 3600 * 10**9


class Importer(Protocol):
    """What an importer plugin is at run time: a source of history in blocks (see producers/importers)."""

    name: str

    def open(self) -> None:
        """Check the input is there and readable (files exist, the server answers); raises HermeneutError."""

    def blocks(self) -> Iterator[Block]:
        """Every block of the input, in the same order on every run (the checkpoint counts blocks)."""

    def total_rows(self) -> int | None:
        """How many input rows there are, when known before reading them (for the progress bar's ETA)."""

    def close(self) -> None:
        """Release what :meth:`open` took; safe to call twice."""


class Publishing(Protocol):
    """The part of :class:`pipeline.publisher.Publisher` the driver uses (a recording one in unit tests)."""

    @property
    def stats(self) -> Any: ...

    def publish(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Headers | None = None,
        timeout_s: float | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> bool: ...

    def poll(self, timeout_s: float = 0.0) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> int: ...


@dataclass
class ImportReport:
    """What an import read and sent; cumulative over the runs of one import (the checkpoint keeps it)."""

    rows_read: int = 0
    samples: int = 0
    messages: int = 0
    contexts: int = 0
    events: int = 0
    #: rows dead-lettered by the importer itself, by reason (the processor may reject more: the summary says)
    rejected: dict[str, int] = field(default_factory=dict)
    blocks: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    #: "node/gpu" -> detected interval (s); series with a single sample are not here
    intervals: dict[str, float] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    applications: list[str] = field(default_factory=list)
    #: the metric fields at least one row had a value of (what the detectors can read: processors.coverage)
    columns: list[str] = field(default_factory=list)
    #: the runs whose messages make up this import (dead letters are counted over all of them)
    runs: list[str] = field(default_factory=list)
    #: when the first run of this import started (UTC epoch ns): its dead letters are after it
    started_ns: int | None = None
    #: the UTC hours (epoch ns // 1 h) that hold imported rows: what is rolled up afterwards (captures years apart
    #: are a few hours of data, not years)
    hours: list[int] = field(default_factory=list)

    def spans(self) -> list[tuple[int, int]]:
        """The imported rows' time as ``[start_ns, stop_ns)`` spans of whole hours, consecutive hours merged."""
        out: list[tuple[int, int]] = []
        for hour in self.hours:
            if out and out[-1][1] == hour * HOUR_NS:
                out[-1] = (out[-1][0], (hour + 1) * HOUR_NS)
            else:
                out.append((hour * HOUR_NS, (hour + 1) * HOUR_NS))
        return out

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImportReport:
        return cls(**data)


@dataclass
class Checkpoint:
    """How far an import got: its key (what was imported, with which options, into which cluster), the blocks
    delivered so far and the report up to them. Saved after every delivered block."""

    path: Path | None
    key: str
    blocks_done: int = 0
    report: ImportReport = field(default_factory=ImportReport)

    @classmethod
    def load(cls, path: Path | None, key: str, restart: bool = False) -> Checkpoint:
        if path is None or restart or not path.is_file():
            return cls(path, key)
        try:
            data = json.loads(path.read_text())
            if data.get("key") != key:
                return cls(path, key)
            return cls(path, key, int(data["blocks_done"]), ImportReport.from_json(data["report"]))
        except (ValueError, KeyError, TypeError):
            log.warning("%s is not an import checkpoint; starting over", path)
            return cls(path, key)

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": self.key, "blocks_done": self.blocks_done, "report": self.report.to_json()}))
        tmp.replace(self.path)


def import_key(importer: str, cluster: str, options: dict[str, Any], inputs: Sequence[Path] = ()) -> str:
    """What makes two imports the same one: the importer, the cluster, its options and its input files as they
    are now (path, size, modification time)."""
    described = [
        importer,
        cluster,
        sorted((k, str(v)) for k, v in options.items()),
        [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in inputs if p.exists()],
    ]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]


class ImportDriver:
    """Publishes an importer's blocks (see module docstring); :meth:`run` until the input ends or ``stop``."""

    def __init__(
        self,
        importer: Importer,
        publisher: Publishing,
        topics: TopicSettings,
        cluster: str,
        run_id: str,
        checkpoint: Checkpoint | None = None,
        progress: bool = False,
        flush_timeout_s: float = 300.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.importer, self.publisher, self.topics = importer, publisher, topics
        self.cluster, self.run_id = cluster, run_id
        self.checkpoint = checkpoint or Checkpoint(None, run_id)
        self.progress = progress
        self.flush_timeout_s = flush_timeout_s
        self.clock = clock
        self._headers: Headers = [("content-type", CONTENT_TYPE), (IMPORT, run_id.encode())]
        self._intervals = Intervals(
            {tuple(k.split("/", 1)): v for k, v in self.checkpoint.report.intervals.items()}  # type: ignore[misc]
        )
        self._workloads: dict[tuple[str, str], Workload | None] = {}
        self._seen: dict[str, set[str]] = {}
        self._hours: set[int] = set(self.checkpoint.report.hours)
        #: per raw partition, the offset after the last message this run delivered: how far the pipeline must get
        self.raw_ends: dict[int, int] = {}

    @property
    def report(self) -> ImportReport:
        return self.checkpoint.report

    def run(self, stop: threading.Event | None = None) -> ImportReport:
        report = self.report
        if self.run_id not in report.runs:
            report.runs.append(self.run_id)
        if report.started_ns is None:
            report.started_ns = self.clock()
        for name in ("gpus", "nodes", "jobs", "applications", "columns"):
            self._seen[name] = set(getattr(report, name))
        done = self.checkpoint.blocks_done
        total = self.importer.total_rows()
        with tqdm(
            total=total,
            desc=f"import {self.importer.name}",
            unit=" rows",
            unit_scale=True,
            disable=not self.progress,
            dynamic_ncols=True,
            mininterval=0.5,
        ) as bar:
            bar.update(report.rows_read if done else 0)
            for index, block in enumerate(self.importer.blocks()):
                if stop is not None and stop.is_set():
                    break
                if index < done:
                    continue  # delivered by an earlier run of this import
                self._block(block, bar)
                self._deliver()
                report.blocks += 1
                report.hours = sorted(self._hours)
                self.checkpoint.blocks_done = index + 1
                self.checkpoint.save()
        for name in ("gpus", "nodes", "jobs", "applications", "columns"):
            setattr(report, name, sorted(self._seen[name]))
        report.hours = sorted(self._hours)
        self.checkpoint.save()
        return report

    def _deliver(self) -> None:
        failed = self.publisher.stats.failed
        if self.publisher.flush(self.flush_timeout_s):
            raise ServiceError(f"Kafka did not take the import's messages within {self.flush_timeout_s:.0f}s")
        if self.publisher.stats.failed != failed:
            raise ServiceError("Kafka refused some of the import's messages; run the import again to resume")

    def _send(self, topic: str, key: bytes | None, value: bytes, headers: Headers) -> None:
        self.publisher.publish(topic, key, value, headers)

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            partition, end = msg.partition(), msg.offset() + 1
            self.raw_ends[partition] = max(self.raw_ends.get(partition, 0), end)

    def _block(self, block: Block, bar: tqdm[Any]) -> None:
        report, rows = self.report, block.rows
        rejected: list[Rejection] = list(block.rejected)
        if len(rows):
            codes, _series = _series_codes(rows)
            dup = duplicates(codes, rows.ts_ns)
            for i in np.flatnonzero(dup).tolist():
                detail = f"{rows.gpu_uuid[i]} already has a sample at this millisecond in the same input"
                rejected.append(Rejection("duplicate", detail, rows.origin[i], rows.original[i], rows.gpu_uuid[i]))
            if dup.any():
                rows = rows.take(np.flatnonzero(~dup))
        report.rows_read += len(rows) + len(rejected)
        for r in rejected:
            report.rejected[r.reason] = report.rejected.get(r.reason, 0) + 1
            letter = dead_letter(
                None, r.original, r.reason, r.detail, STAGE, r.origin, r.gpu_uuid, import_run=self.run_id
            )
            self._send(self.topics.dead_letter, letter.key, letter.value, letter.headers)
        bar.update(len(rejected))
        if not len(rows):
            return
        self._note(rows)
        contexts = context_changes(rows, self.cluster, self._workloads)
        for context in contexts:
            self._send(self.topics.context, context.kafka_key, encode_record(context), self._headers)
        if contexts:
            self._deliver()  # before the rows they cover: see the module docstring
            report.contexts += len(contexts)
        interval = self._intervals.per_row(rows)
        for batch in node_batches(rows, self.cluster, interval):
            value = encode_samples(batch)
            self.publisher.publish(self.topics.raw, batch.kafka_key, value, self._headers, on_delivery=self._delivered)
            report.messages += 1
            report.samples += len(batch.samples)
            report.events += len(batch.events)
            bar.update(len(batch.samples))
        report.intervals |= {"/".join(k): v for k, v in self._intervals.seen.items()}

    def _note(self, rows: Any) -> None:
        """What the summary names: GPUs, nodes, jobs and applications, and the time range."""
        report = self.report
        first, last = int(rows.ts_ns.min()), int(rows.ts_ns.max())
        report.first_ns = first if report.first_ns is None else min(report.first_ns, first)
        report.last_ns = last if report.last_ns is None else max(report.last_ns, last)
        self._hours.update(np.unique(rows.ts_ns // HOUR_NS).tolist())
        self._seen["gpus"].update(f"{n}/{u}" for n, u in zip(rows.node, rows.gpu_uuid, strict=True))
        self._seen["nodes"].update(rows.node)
        self._seen["columns"].update(k for k, v in rows.metrics.items() if np.isfinite(v).any())
        for w in rows.workload or ():
            if w is not None:
                if w.job_id:
                    self._seen["jobs"].add(w.job_id)
                self._seen["applications"].add(w.application)
