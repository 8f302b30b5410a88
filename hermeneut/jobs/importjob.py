"""``hermeneut import``: history in, through the same pipeline as live data, accounted for, rolled up, explained.

:func:`run_import` wires the stages for one import:

1. the importer plugin (registry kind ``importer``), validated before anything is connected;
2. topics and buckets (idempotent); a processor and a sink as child processes unless the pipeline already runs
   elsewhere (``pipeline=False``) or one runs already: the main job's (``hermeneut run`` leaves them running with
   the local services) or any in the stage's consumer group. Imports through one state folder run one at a time
   (:class:`ImportLock`). A second processor in the same group would take half
   the partitions from the running one, so the import goes through the running stages instead and says so; a
   SIGTERM to the import stops the stages it started;
3. :class:`producers.importers.driver.ImportDriver` publishes the blocks (progress bar: rows/s, ETA), resuming
   where an interrupted run of the same import stopped (a checkpoint under ``<state>/imports/``);
4. it waits until the processor has consumed every message of the import and the sink has written what came of
   it, then counts: samples stored in InfluxDB (per GPU, over the imported range) and dead letters of the
   import's runs (from the dead-letter topic, the importer's and the processor's, each counted once however often
   the import ran), which must add up to the rows read;
5. the 1-minute rollups and job summaries of the range (:func:`sinks.retention.backfill`);
6. a summary: rows read, stored, dead-lettered by reason, GPUs, jobs, time range, the intervals detected, and the
   commands to run next (training on that range, the questions to ask, the dashboard's URL for it).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import logging
import math
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from confluent_kafka import Consumer, KafkaException, TopicPartition
from tqdm import tqdm

from hermeneut.stages import start_stage
from pipeline import registry
from pipeline.codec import decode_interpreted
from pipeline.config import Settings
from pipeline.deadletter import GPU, IMPORT, PART, POSITION, REASON, SOURCE, STAGE
from pipeline.errors import HermeneutError, ServiceError
from pipeline.services.stages import Stage, wait_for
from pipeline.topics import ensure_topics, retried, topic_specs, wait_for_topics
from pipeline.vocab import format_duration

if TYPE_CHECKING:
    from processors.coverage import DataShape

log = logging.getLogger(__name__)

#: how often the counts are read while the pipeline works through an import
_POLL_S = 2.0
#: the headers that say which item of a message a dead letter is about, and why
_ITEM = (REASON, POSITION, PART, GPU)
_MS = 1_000_000


@dataclass
class ImportOutcome:
    """What an import did, for the summary: the driver's report and what the pipeline made of it."""

    report: Any  # producers.importers.driver.ImportReport
    stored: int
    #: dead letters of the import's runs by reason (the importer's and the processor's)
    dead: Counter[str]
    complete: bool
    backfill: Any = None  # sinks.retention.BackfillReport
    notes: list[str] = field(default_factory=list)
    #: which processor and sink the import went through, for the summary's hint (see :func:`pipeline_used`)
    through: str = ""

    @property
    def dead_total(self) -> int:
        return sum(self.dead.values())


def running_stages(settings: Settings) -> dict[str, int]:
    """The stages the main job left running with the local services (``hermeneut run``), alive: name -> pid."""
    from pipeline import services
    from pipeline.services.procs import pid_alive

    state = services.read_state(settings)
    kept = (state.stages or []) if state is not None else []
    return {str(s["name"]): int(s["pid"]) for s in kept if pid_alive(int(s["pid"]))}


#: the consumer group of each stage an import may start (the sink: the InfluxDB sink, ``hermeneut sink``'s default)
_GROUP = {"process": "{prefix}-processor", "sink": "{prefix}-sink-influxdb"}


def group_members(settings: Settings) -> dict[str, int]:
    """How many consumers are in the consumer group of each stage an import may start (name -> members; 0 where
    the broker does not say): a processor or sink started by hand, or by another import, is found this way."""
    from confluent_kafka.admin import AdminClient

    groups = {name: g.format(prefix=settings.group_prefix) for name, g in _GROUP.items()}
    admin = AdminClient(settings.kafka.client_config())
    out = dict.fromkeys(groups, 0)
    try:
        futures = admin.describe_consumer_groups(list(groups.values()), request_timeout=10)
        for name, group in groups.items():
            out[name] = len(futures[group].result(timeout=10).members)
    except (KafkaException, TimeoutError) as exc:  # an old broker, a timeout: none found, the import starts its own
        log.warning("could not describe the consumer groups of the pipeline: %s", exc)
    return out


def pipeline_used(own: list[str], running: dict[str, int], run_dir: Path | None, joined: dict[str, int]) -> str:
    """Which processor and sink an import goes through, as the summary's hint names them (pure): the ones it
    started (``own``), the main job's (``running``, name -> pid), ones found in their consumer groups (``joined``,
    name -> members), or a pipeline run elsewhere."""
    kept = [f"{name} (pid {running[name]})" for name in ("process", "sink") if name in running]
    found = [
        f"{name} ({n} in its consumer group)"
        for name in ("process", "sink")
        if name not in running and name not in own and (n := joined.get(name, 0))
    ]
    parts = []
    if own:
        parts.append(f"the import's own {' and '.join(own)} (logs in {run_dir})")
    if kept:
        parts.append(f"the main job's {' and '.join(kept)}, left running with the local services")
    if found:
        parts.append(f"the running {' and '.join(found)}")
    return "; ".join(parts) or "a pipeline running elsewhere (--no-pipeline)"


class ImportLock:
    """Imports through one state folder run one at a time (an advisory lock the kernel frees when its holder
    dies). Two at once went wrong two ways: a second import of a range read what was stored before the first's
    points were, so its rows' verdicts overwrote the first's instead of merging by field; and it went through the
    stages the first had started, found in their consumer groups, which the first stopped when it was done, so
    the second's messages were never processed. The second waits, saying for whom."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, holder: str, echo: Callable[[str], Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another import"
                echo(
                    f"waiting for {other} to finish: imports through one state folder ({self.path.parent}) run "
                    "one at a time, so that one of the same range merges with what the other stored"
                )
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{holder} (pid {os.getpid()})".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)  # frees the lock
            self._fd = None


class _Terminated(SystemExit):
    """SIGTERM during an import: leaves through the ``finally`` that stops the stages the import started."""


def _on_sigterm(signum: int, _frame: object) -> None:
    raise _Terminated(128 + signum)


#: a stored point of a GPU: (node, gpu uuid, ms); the ``gpu`` measurement is stored at ms
Point = tuple[str, str, int]


def merge_stored(rows: Any, stored: dict[Point, dict[str, float]]) -> tuple[Any, int]:
    """``rows`` (producers.importers.rows.Rows) with the readings already stored at their points added where a row
    has none, and how many rows took some (pure). Two files of the same range (one with power, one with
    temperatures) are then one sample per point, judged whole: the second import's verdicts are about everything
    the point holds, not about its own half, and a reading the row has is never replaced."""
    n = len(rows)
    found = [
        stored.get((node, gpu, ts // 1_000_000))
        for node, gpu, ts in zip(rows.node, rows.gpu_uuid, rows.ts_ns.tolist(), strict=True)
    ]
    names = sorted({name for point in found if point for name in point})
    if not names:
        return rows, 0
    metrics = dict(rows.metrics)
    took = np.zeros(n, dtype=bool)
    for name in names:
        have = np.array([math.nan if point is None else point.get(name, math.nan) for point in found])
        mine = metrics.get(name)
        column = np.full(n, math.nan) if mine is None else np.array(mine, dtype=np.float64)
        fill = np.isnan(column) & ~np.isnan(have)
        column[fill] = have[fill]
        took |= fill
        metrics[name] = column
    return dataclasses.replace(rows, metrics=metrics), int(took.sum())


def stored_readings(
    settings: Settings, cluster: str, nodes: set[str], start_ns: int, stop_ns: int
) -> dict[Point, dict[str, float]]:
    """The readings (schema fields) stored for ``cluster``'s ``nodes`` in ``[start_ns, stop_ns]``, per point."""
    from pipeline.events import METRIC_NAMES
    from producers.source import INTERVAL_FIELD
    from sinks.query.store import flux_rows

    # each series' interval the driver detects itself, from the rows it sends
    names = ", ".join(f'"{n}"' for n in METRIC_NAMES if n != INTERVAL_FIELD)
    wanted = ", ".join(f'"{n}"' for n in sorted(nodes))
    flux = (
        f'from(bucket: "{settings.influxdb.bucket}")\n'
        f"  |> range(start: time(v: {start_ns}), stop: time(v: {stop_ns + _MS}))\n"
        f'  |> filter(fn: (r) => r._measurement == "gpu" and r.cluster == "{cluster}")\n'
        f"  |> filter(fn: (r) => contains(value: r.node, set: [{wanted}]))\n"
        f"  |> filter(fn: (r) => contains(value: r._field, set: [{names}]))\n"
    )
    [records] = flux_rows(settings, flux)
    out: dict[Point, dict[str, float]] = {}
    for r in records:
        value = r["_value"]
        if isinstance(value, int | float) and not isinstance(value, bool):
            key = (str(r["node"]), str(r["gpu"]), int(r["_time"].timestamp() * 1000 + 0.5))
            out.setdefault(key, {})[str(r["_field"])] = float(value)
    return out


class MergedWithStored:
    """An importer whose blocks carry, for every row, the readings the range already holds at the row's point
    (:func:`merge_stored`): imports of the same range merge by field, not by point."""

    def __init__(self, importer: Any, settings: Settings, cluster: str) -> None:
        self.importer, self.settings, self.cluster = importer, settings, cluster
        #: rows that took readings already stored
        self.merged = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.importer, name)

    def blocks(self) -> Any:
        for block in self.importer.blocks():
            rows = block.rows
            if not len(rows):
                yield block
                continue
            first, last = int(rows.ts_ns.min()), int(rows.ts_ns.max())
            rows, took = merge_stored(rows, stored_readings(self.settings, self.cluster, set(rows.node), first, last))
            self.merged += took
            yield dataclasses.replace(block, rows=rows)


def checkpoint_path(settings: Settings, key: str) -> Path:
    return settings.services.state_dir / "imports" / f"{key}.json"


def _committed(settings: Settings, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """A consumer group's committed offsets (-1001: none yet) without joining it."""
    consumer = Consumer(settings.kafka.client_config() | {"group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found}


def _high_watermarks(settings: Settings, topic: str) -> dict[int, int]:
    consumer = Consumer(settings.kafka.client_config() | {"group.id": f"hermeneut-import-{uuid.uuid4().hex[:8]}"})
    try:
        found, pending = wait_for_topics(consumer, [topic], 10.0)  # a topic just created: in metadata in a moment
        if pending:
            raise ServiceError(f"topic {topic} not readable within 10s: run `hermeneut topics` first")
        ask, parts = consumer.get_watermark_offsets, found[topic].partitions
        return {p: retried(partial(ask, TopicPartition(topic, p), timeout=10), 10.0)[1] for p in parts}
    finally:
        consumer.close()


def dead_letters(settings: Settings, report: Any) -> Counter[str]:
    """The rows of an import dead-lettered, by reason, each once: a block sent again by a resumed run is rejected
    again, with the same bytes, position and reason. The importer's and the processor's dead letters name the
    import's runs; the sink's (InfluxDB refused a write) carry the processor's output, whose rows of the import's
    GPUs in its time range are counted."""
    runs, since_ns = report.runs, report.started_ns or 0
    gpus = set(report.gpus)
    topic = settings.topics.dead_letter
    consumer = Consumer(
        settings.kafka.client_config()
        | {"group.id": f"hermeneut-import-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    wanted = {r.encode() for r in runs}
    seen: set[tuple[bytes, ...]] = set()
    out: Counter[str] = Counter()
    try:
        ends = _high_watermarks(settings, topic)
        starts = consumer.offsets_for_times(
            [TopicPartition(topic, p, max(0, since_ns // _MS - 60_000)) for p in ends], timeout=10
        )
        todo = {tp.partition for tp in starts if 0 <= tp.offset < ends[tp.partition]}
        consumer.assign([tp for tp in starts if tp.partition in todo])
        deadline = time.monotonic() + 120
        while todo and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is not None:
                    continue
                partition, offset = msg.partition() or 0, msg.offset() or 0
                if offset + 1 >= ends[partition]:
                    todo.discard(partition)
                headers = _headers(msg.headers())
                if headers.get(STAGE) == b"sink" and headers.get(IMPORT) is None:
                    rows = _imported_rows(msg.value() or b"", gpus, report)
                    digest = hashlib.sha1(msg.value() or b"").digest()
                    if rows and (digest,) not in seen:
                        seen.add((digest,))
                        out[headers[REASON].decode()] += rows
                    continue
                if headers.get(IMPORT) not in wanted:
                    continue
                # the same rejected item, however many runs sent it: its bytes, where in them, why; the importer's
                # own origin (file:line) is stable too, the processor's (a raw offset) differs from run to run
                stage = headers.get(STAGE)
                origin = headers.get(SOURCE, b"") if stage == b"import" else b""
                item = (hashlib.sha1(msg.value() or b"").digest(), origin, *(headers.get(h, b"") for h in _ITEM))
                if item not in seen:
                    seen.add(item)
                    out[headers[REASON].decode()] += 1
    finally:
        consumer.close()
    return out


def _imported_rows(value: bytes, gpus: set[str], report: Any) -> int:
    """Rows of an interpreted batch (what the sink could not write) that are this import's: its GPUs, its time."""
    try:
        batch = decode_interpreted(value)
    except HermeneutError:
        return 0
    return sum(
        f"{node}/{gpu}" in gpus and report.first_ns <= ts <= report.last_ns
        for node, gpu, ts in zip(batch.node, batch.gpu_uuid, batch.ts_ns.tolist(), strict=True)
    )


def _headers(raw: Any) -> dict[str, bytes]:
    """A consumed record's headers as a dict of bytes (confluent-kafka gives a list of pairs, values maybe None)."""
    return {str(k): v if isinstance(v, bytes) else str(v or "").encode() for k, v in raw or ()}


def _stored(settings: Settings, cluster: str, report: Any) -> int:
    from sinks.query.counts import stored_samples
    from sinks.query.store import Store

    if report.first_ns is None:
        return 0
    with Store.from_settings(settings) as store:
        counts = stored_samples(store, cluster, report.first_ns, report.last_ns + _MS)
    gpus = set(report.gpus)
    return sum(n for (node, gpu), n in counts.items() if f"{node}/{gpu}" in gpus)


def _caught_up(settings: Settings, raw_ends: dict[int, int]) -> bool:
    """The processor has committed past every message of this run. The sink's commit says nothing here: it holds
    its commit at the first record of a rollup minute still open, and the last minute of a history stays open (no
    later data closes it); what the sink stored is counted in InfluxDB instead."""
    done = _committed(settings, f"{settings.group_prefix}-processor", settings.topics.raw, sorted(raw_ends))
    return all(done.get(p, -1) >= end for p, end in raw_ends.items())


def wait_accounted(
    settings: Settings, cluster: str, report: Any, raw_ends: dict[int, int], patience_s: float, progress: bool
) -> tuple[int, Counter[str], bool]:
    """Wait until every row read is stored or dead-lettered (or nothing moved for ``patience_s``); the counts.
    Complete when the processor caught up and at least as many samples are stored (plus dead-lettered) as were
    read: more where the range already held points of these GPUs that this import's rows did not (another file of
    the same range, merged with it field by field in InfluxDB), which the summary notes."""
    expected = report.rows_read
    last, still_since = (-1, False), time.monotonic()
    with tqdm(
        total=expected,
        desc="stored or dead-lettered",
        unit=" rows",
        unit_scale=True,
        disable=not progress,
        dynamic_ncols=True,
        mininterval=0.5,
    ) as bar:
        while True:
            caught_up = not raw_ends or _caught_up(settings, raw_ends)
            stored = _stored(settings, cluster, report)
            dead = dead_letters(settings, report)
            accounted = stored + sum(dead.values())
            bar.update(max(0, min(accounted, expected) - bar.n))
            if caught_up and accounted >= expected:
                return stored, dead, True
            if (accounted, caught_up) != last:
                last, still_since = (accounted, caught_up), time.monotonic()
            elif time.monotonic() - still_since > patience_s:
                return stored, dead, False
            time.sleep(_POLL_S)


def run_import(
    settings: Settings,
    name: str,
    options: dict[str, Any],
    inputs: tuple[Path, ...] = (),
    *,
    pipeline: bool = True,
    restart: bool = False,
    patience_s: float = 120.0,
    progress: bool = True,
    echo: Callable[[str], Any] = print,
) -> ImportOutcome:
    """Import with resolved settings (see module docstring); raises ConfigError before connecting to anything when
    the importer's options are wrong."""
    from pipeline.publisher import Publisher
    from producers.importers.driver import Checkpoint, ImportDriver, import_key
    from sinks.retention import backfill
    from sinks.retention import setup as storage_setup

    importer = registry.create("importer", name, settings, **options)
    cluster = str(options.get("cluster") or settings.cluster)
    key = import_key(name, cluster, options, inputs)
    checkpoint = Checkpoint.load(checkpoint_path(settings, key), key, restart)
    if checkpoint.blocks_done:
        echo(f"resuming import {key}: {checkpoint.blocks_done} blocks were delivered by an earlier run")
    importer.open()
    ensure_topics(settings.kafka.client_config(), topic_specs(settings))
    storage_setup(settings)
    run_id = f"{key}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    stages: list[Stage] = []
    lock = ImportLock(settings.services.state_dir / "imports" / "running.lock")
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        lock.acquire(f"the import {key}", echo)
        running = running_stages(settings) if pipeline else {}
        joined = group_members(settings) if pipeline else {}
        # a stage already in its consumer group (the main job's, one started by hand) keeps the group's partitions:
        # the import goes through it, never a second one that would take half of them
        own = [name for name in ("process", "sink") if pipeline and name not in running and not joined.get(name)]
        run_dir = settings.services.state_dir / "imports" / key / run_id if own else None
        through = pipeline_used(own, running, run_dir, joined)
        if pipeline and len(own) < 2:
            echo(f"the import goes through {through}")
        if run_dir is not None:
            stages = [start_stage(name, settings, run_dir) for name in own]
            if not wait_for(lambda: all(s.stats().get("assigned") or not s.alive() for s in stages), 120):
                raise ServiceError(f"the processor and sink did not start within 120 s (logs in {run_dir})")
            if not all(s.alive() for s in stages):
                raise ServiceError(f"the processor or the sink exited at start (logs in {run_dir})")
        publisher = Publisher(settings.kafka.client_config())
        merging = MergedWithStored(importer, settings, cluster)
        driver = ImportDriver(merging, publisher, settings.topics, cluster, run_id, checkpoint, progress)
        try:
            report = driver.run()
        finally:
            publisher.close()
            importer.close()
        stored, dead, complete = wait_accounted(settings, cluster, report, driver.raw_ends, patience_s, progress)
        outcome = ImportOutcome(report, stored, dead, complete, through=through)
        if stored:
            outcome.backfill = backfill(settings, report.spans(), progress=progress)
        if merging.merged:
            outcome.notes.append(
                f"{merging.merged} rows met readings already stored at their points (another import of the range): "
                "merged field by field and judged whole"
            )
        if hasattr(importer, "unmapped") and importer.unmapped:
            outcome.notes.append(f"columns no field maps to (left out): {', '.join(sorted(importer.unmapped))}")
        unknown = getattr(importer, "unknown_applications", None)
        if unknown:
            named = ", ".join(f"{a!r} x{n}" for a, n in sorted(unknown.items()))
            outcome.notes.append(f"applications outside the vocabulary, stored as unknown: {named}")
        return outcome
    finally:
        for stage in reversed(stages):
            stage.stop()
        lock.release()
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def import_shape(r: Any) -> DataShape:
    """What an import's report says of its data besides its columns (processors.coverage.DataShape)."""
    import statistics

    from processors.coverage import DataShape

    per_node = Counter(g.split("/", 1)[0] for g in r.gpus)
    return DataShape(
        interval_s=statistics.median(r.intervals.values()) if r.intervals else None,
        # GPUs per job are known only where one job is named (then it holds every GPU imported)
        job_gpus=0 if not r.jobs else len(r.gpus) if len(r.jobs) == 1 else None,
        node_gpus=max(per_node.values(), default=0),
        events=r.events > 0,
    )


def blind_lines(r: Any) -> list[str]:
    """The summary's lines naming the detectors that cannot fire on what was imported, and why (processors.coverage):
    a quiet import of logs with three columns is not a healthy fleet (issue 38)."""
    from pipeline.kinds import DETECTORS
    from processors.coverage import blind_detectors

    if not r.columns:
        return []  # a checkpoint of an earlier version does not say which columns it read
    blind = blind_detectors(r.columns, import_shape(r))
    if not blind:
        return []
    head = f"cannot see       {len(blind)} of {len(DETECTORS)} detectors blind or limited by these columns, intervals:"
    return [head, *(f"                 {detector}: {why}" for detector, why in blind)]


def summary(outcome: ImportOutcome, settings: Settings, dashboard_url: str | None) -> list[str]:
    """The closing lines: what came in, what went where, and what to run next."""
    from sinks.query.output import iso

    r = outcome.report
    dead = ", ".join(f"{n} {reason}" for reason, n in outcome.dead.most_common()) or "none"
    lines = [
        f"rows read        {r.rows_read}",
        f"stored           {outcome.stored}",
        f"dead-lettered    {outcome.dead_total} ({dead})",
    ]
    missing = r.rows_read - outcome.stored - outcome.dead_total
    if missing > 0:
        lines.append(
            f"NOT ACCOUNTED    {missing} rows are neither stored nor dead-lettered yet, through "
            f"{outcome.through or 'a pipeline running elsewhere'}: "
            + (
                "is a processor and a sink running (`hermeneut process`, `hermeneut sink`)?"
                if not outcome.through or "elsewhere" in outcome.through
                else "see its log and `hermeneut services status`."
            )
            + " Run the import again to check."
        )
    elif missing < 0:
        lines.append(
            f"note: {-missing} more samples stored than read: the range already held samples of these GPUs "
            "(an earlier import of other files)"
        )
    if r.first_ns is None:
        return [*lines, "nothing was read that could be stored", *outcome.notes]
    # whole seconds around the rows: the first one's second, the second after the last one
    start_ns, stop_ns = r.first_ns // 10**9 * 10**9, (r.last_ns // 10**9 + 1) * 10**9
    start, stop = iso(start_ns), iso(stop_ns)
    intervals = Counter(f"{v:.3g} s" for v in r.intervals.values())
    single = len(r.gpus) - len(r.intervals)
    detected = ", ".join(f"{v} ({n} series)" for v, n in intervals.most_common()) or "none"
    if single > 0:
        detected += f"; {single} series with a single sample (no interval)"
    lines += [
        f"GPUs             {len(r.gpus)} on {len(r.nodes)} node(s)",
        f"jobs             {len(r.jobs)}{': ' + ', '.join(r.jobs[:5]) if r.jobs else ''}"
        f"{' ...' if len(r.jobs) > 5 else ''}",
        f"time range       {start} .. {stop} ({format_duration((r.last_ns - r.first_ns) // 10**9 * 10**9)})",
        f"intervals        {detected}",
    ]
    lines += blind_lines(r)
    if outcome.backfill is not None:
        b = outcome.backfill
        lines.append(f"rollups          {b.queries} queries over the range ({b.seconds:.1f} s)")
        lines += [f"                 left out: {why}" for why in b.skipped]
    if outcome.dead.get("ancient_timestamp"):
        lines.append(
            "note: rows older than the backfill bound were dead-lettered; keep more raw history with "
            "HERMENEUT_STORAGE__RAW_RETENTION_DAYS (then `hermeneut storage setup`) and import again"
        )
    lines += [f"note: {n}" for n in outcome.notes]
    span = format_duration(-(-(stop_ns - start_ns) // 60_000_000_000) * 60_000_000_000)
    lines.append("\nnext:")
    if r.applications and set(r.applications) != {"unknown"}:
        lines.append(f"  hermeneut baselines train --range {span} --stop {stop}   # learn what is normal from it")
        lines.append("  then import again (same command, --restart) to judge the history against what was learned")
    else:
        lines.append("  (no application is known for these rows: give one, e.g. [context] in a table mapping or")
        lines.append("   --application, so that `hermeneut baselines train` can learn from them)")
    lines += [
        f"  hermeneut anomalies --start {start} --stop {stop}",
        f"  hermeneut jobs --start {start} --stop {stop}",
        f"  hermeneut rightsize --start {start} --stop {stop}",
        f"  hermeneut top wasted --start {start} --stop {stop}",
    ]
    if dashboard_url:
        # the dashboard shows at most 7 days: the last 7 of a longer import
        window = f"?start={iso(max(start_ns, stop_ns - 7 * 86400 * 10**9))}&stop={stop}"
        target = f"#/job/{r.jobs[0]}" if r.jobs else f"#/gpu/{r.gpus[0].split('/', 1)[1]}"
        lines.append(f"  dashboard: {dashboard_url}/{target}{window}")
        lines.append(f"  right-sizing: {dashboard_url}/#/rightsizing{window}")
    return lines
