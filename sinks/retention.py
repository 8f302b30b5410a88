"""Retention and downsampling: the three buckets, their retention rules and the InfluxDB task that fills the
job summaries, created idempotently through the InfluxDB API (``hermeneut storage setup``; the main job
calls :func:`setup`).

``<bucket>``        raw samples, findings, events, baselines: ``storage.raw_retention_days`` (7)
``<bucket>_1m``     1-minute rollups per GPU series: ``<field>_mean/_max/_min/_count`` of the key fields
                    (:data:`sinks.query.model.ROLLUP_FIELDS`), ``throttle_samples`` / ``throttled_samples``,
                    ``verdict_unusual`` and ``verdict_anomalous`` counts: ``storage.rollup_retention_days`` (90)
``<bucket>_jobs``   per job, application, GPU model and 10 minutes: ``gpu_seconds`` and p50/p95/max of
                    utilization, memory used and power (measurement ``job``, ``job_id`` a tag):
                    ``storage.jobs_retention_days`` (400)

The 1-minute rollups are computed in the stream by the sink (:mod:`sinks.influxdb.rollup`) from the samples it
stores, and written once per minute and series: an InfluxDB task re-reading the raw data every minute took 29 s
per run at 10,000 GPUs, and after an outage its runs piled up until every write timed out. Setup removes that
task where an older version installed it. The job summaries stay an InfluxDB task (Flux built in
:mod:`sinks.query.flux`, ``every: 10m`` over the last whole 10 minutes): their exact per-job percentiles need
every value of a job's 10 minutes at once, which in the sink would mean holding ten minutes of three fields per
GPU in memory and re-reading up to ten minutes after every restart; the task reads three fields once per
10 minutes. Each bucket is also mapped for InfluxQL (DBRP). Everything is looked up by name first, so running
setup again changes only what differs (a retention, a task's Flux).

Data that arrives after its minutes were closed (imported history mixed into a partition with live data, an
outage) is rolled up by :func:`backfill`: one Flux query per chunk of the range computes the very points the
stream writes (the same code as the retired task, with ``start``/``stop`` set to the chunk; the two are checked
equal in tests/integration/test_retention.py) and the job summaries of every 10 minutes in it
(``hermeneut storage backfill``, and what ``hermeneut import`` calls when it has stored a range).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import urllib3
from influxdb_client.domain.bucket_retention_rules import BucketRetentionRules
from influxdb_client.domain.task_create_request import TaskCreateRequest
from influxdb_client.domain.task_update_request import TaskUpdateRequest
from influxdb_client.rest import ApiException
from tqdm import tqdm

from pipeline.config import Settings
from pipeline.errors import ConfigError, ServiceError
from pipeline.events import METRIC_INDEX, RELATIVE_FIELDS, Verdict
from sinks.influxdb.lines import series_tags
from sinks.influxdb.rollup import rollup_rows
from sinks.influxdb.schema import JOB_FIELDS, ROLLUP_FIELDS
from sinks.influxdb.write import InfluxWriter
from sinks.query.flux import jobs_range_flux, jobs_task_flux
from sinks.query.history import StoredRows, stored_rows
from sinks.query.model import NS
from sinks.query.store import Store

DAY_S: Final = 86400
_MINUTE_NS: Final = 60 * NS
_TEN_MINUTES_NS: Final = 600 * NS
#: how much of a backfill is read back and rolled up at once: an hour of a 1,000-GPU fleet at 1 s is 3.6M rows
ROLLUP_CHUNK_NS: Final = 3600 * NS
JOBS_CHUNK_NS: Final = DAY_S * NS


@dataclass(frozen=True, slots=True)
class BucketSpec:
    name: str
    retention_s: int
    holds: str


@dataclass(frozen=True, slots=True)
class TaskSpec:
    name: str
    flux: str
    every: str


def bucket_specs(settings: Settings) -> tuple[BucketSpec, ...]:
    s, raw = settings.storage, settings.influxdb.bucket
    v = settings.validation
    for name, age_s in (("max_age_s", v.max_age_s), ("backfill_max_age_s", v.backfill_max_age_s)):
        if age_s is not None and s.raw_retention_days * DAY_S < age_s:
            # older samples would pass validation and then be refused by InfluxDB (beyond retention) forever
            raise ConfigError(
                f"invalid configuration: storage.raw_retention_days ({s.raw_retention_days:g}) is shorter than "
                f"validation.{name} ({age_s:g} s)"
            )
    return (
        BucketSpec(raw, int(s.raw_retention_days * DAY_S), "raw samples, events, findings, baselines"),
        BucketSpec(f"{raw}_1m", int(s.rollup_retention_days * DAY_S), "1-minute rollups per GPU"),
        BucketSpec(f"{raw}_jobs", int(s.jobs_retention_days * DAY_S), "job summaries per 10 minutes"),
    )


def task_specs(settings: Settings) -> tuple[TaskSpec, ...]:
    raw, org = settings.influxdb.bucket, settings.influxdb.org
    jobs_name = f"hermeneut job summaries: {raw} -> {raw}_jobs"
    flux = jobs_task_flux(jobs_name, raw, f"{raw}_jobs", org, JOB_FIELDS, settings.sample_interval_s)
    return (TaskSpec(jobs_name, flux, "10m"),)


def retired_task_names(settings: Settings) -> tuple[str, ...]:
    """Tasks an older version installed that the stream now does (removed by :func:`setup`)."""
    raw = settings.influxdb.bucket
    return (f"hermeneut rollup 1m: {raw} -> {raw}_1m",)


@dataclass(frozen=True, slots=True)
class Change:
    what: str
    name: str
    action: str  # created, updated, unchanged, removed


def _org_id(store: Store) -> str:
    orgs = store.client.organizations_api().find_organizations(org=store.org)  # type: ignore[no-untyped-call]
    if not orgs:
        raise ServiceError(f"InfluxDB has no organization {store.org!r}")
    org_id: str = orgs[0].id
    return org_id


def _api_errors(what: str, exc: Exception) -> ServiceError:
    detail = f"HTTP {exc.status}: {exc.body or exc.reason}" if isinstance(exc, ApiException) else str(exc)
    return ServiceError(f"{what} failed: {detail}".splitlines()[0][:300])


def _ensure_bucket(store: Store, spec: BucketSpec) -> Change:
    api = store.client.buckets_api()
    found = api.find_bucket_by_name(spec.name)  # type: ignore[no-untyped-call]
    rule = BucketRetentionRules(type="expire", every_seconds=spec.retention_s)  # type: ignore[no-untyped-call]
    if found is None:
        api.create_bucket(bucket_name=spec.name, retention_rules=rule, description=spec.holds, org=store.org)
        return Change("bucket", spec.name, "created")
    current = [r.every_seconds for r in found.retention_rules or [] if r.type == "expire"]
    if current == [spec.retention_s]:
        return Change("bucket", spec.name, "unchanged")
    found.retention_rules = [rule]
    api.update_bucket(found)
    return Change("bucket", spec.name, "updated")


def _find_task(store: Store, name: str) -> Any:
    tasks = store.client.tasks_api().find_tasks(name=name)  # type: ignore[no-untyped-call]
    return tasks[0] if tasks else None


def _ensure_task(store: Store, spec: TaskSpec, org_id: str) -> Change:
    api = store.client.tasks_api()
    found = _find_task(store, spec.name)
    if found is None:
        request = TaskCreateRequest(org_id=org_id, flux=spec.flux, status="active", description="hermeneut")  # type: ignore[no-untyped-call]
        api.create_task(task_create_request=request)
        return Change("task", spec.name, "created")
    if found.flux == spec.flux and found.status == "active":
        return Change("task", spec.name, "unchanged")
    api.update_task_request(found.id, TaskUpdateRequest(flux=spec.flux, status="active"))  # type: ignore[no-untyped-call]
    return Change("task", spec.name, "updated")


def setup(settings: Settings, store: Store | None = None, tasks: bool = True) -> list[Change]:
    """Create or update the buckets, their InfluxQL mappings and (``tasks``) the job-summary task."""
    buckets, specs = bucket_specs(settings), task_specs(settings)
    own = store is None
    store = store or Store.from_settings(settings)
    try:
        org_id = _org_id(store)
        changes = [_ensure_bucket(store, b) for b in buckets]
        for b in buckets:
            store.influxql.ensure_dbrp(b.name)
        if tasks:
            changes += [_ensure_task(store, t, org_id) for t in specs]
            for name in retired_task_names(settings):
                found = _find_task(store, name)
                if found is not None:
                    store.client.tasks_api().delete_task(found.id)
                    changes.append(Change("task", name, "removed"))
        return changes
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise _api_errors("storage setup", exc) from exc
    finally:
        if own:
            store.close()


@dataclass(frozen=True, slots=True)
class BucketStatus:
    name: str
    holds: str
    exists: bool
    retention_s: int | None


@dataclass(frozen=True, slots=True)
class TaskStatus:
    name: str
    exists: bool
    status: str
    every: str
    last_run: str
    last_run_at: str
    last_run_s: float | None


def status(settings: Settings, store: Store) -> tuple[list[BucketStatus], list[TaskStatus]]:
    """The buckets and tasks as they are now."""
    try:
        buckets = []
        for spec in bucket_specs(settings):
            found = store.client.buckets_api().find_bucket_by_name(spec.name)  # type: ignore[no-untyped-call]
            rules = [r.every_seconds for r in (found.retention_rules or []) if r.type == "expire"] if found else []
            buckets.append(BucketStatus(spec.name, spec.holds, found is not None, rules[0] if rules else None))
        tasks = []
        for task in task_specs(settings):
            found = _find_task(store, task.name)
            if found is None:
                tasks.append(TaskStatus(task.name, False, "missing", task.every, "-", "-", None))
                continue
            since = datetime.fromtimestamp(time.time() - DAY_S, UTC)
            runs = store.client.tasks_api().get_runs(found.id, after_time=since, limit=500)
            run = max(runs, key=lambda r: r.started_at or since, default=None)
            took = (run.finished_at - run.started_at).total_seconds() if run and run.finished_at else None
            when = run.scheduled_for.isoformat() if run and run.scheduled_for else "-"
            tasks.append(TaskStatus(task.name, True, found.status, task.every, run.status if run else "-", when, took))
        return buckets, tasks
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise _api_errors("storage status", exc) from exc


@dataclass(frozen=True, slots=True)
class RunResult:
    task: str
    status: str
    scheduled_ns: int
    seconds: float
    log: tuple[str, ...]


def _run_now(api: Any, task_id: str, run: Any) -> Any:
    """The run as it is now; a run that just finished is briefly in neither the running set nor the history
    (HTTP 404, seen in tests): keep the last state and ask again."""
    try:
        return api.get_run(task_id, run.id)
    except ApiException as exc:
        if exc.status == 404:
            return run
        raise


def _logs(api: Any, task_id: str, run_id: str, tries: int = 25) -> list[Any]:
    """A finished run's log; like the run itself it can be briefly missing (HTTP 404) while it moves to the
    history."""
    for _ in range(tries):
        try:
            events: list[Any] = api.get_run_logs(task_id, run_id) or []
            return events
        except ApiException as exc:
            if exc.status != 404:
                raise
            time.sleep(0.2)
    return []


def run_task(store: Store, name: str, scheduled_ns: int, timeout_s: float = 120.0) -> RunResult:
    """Run a task now as if scheduled at ``scheduled_ns`` (its ``now()``), wait for it, return how it went.

    For tests and for back-filling after an outage (``hermeneut storage rollup --at``).
    """
    api = store.client.tasks_api()
    try:
        found = _find_task(store, name)
        if found is None:
            raise ServiceError(f"task {name!r} does not exist: run `hermeneut storage setup`")
        when = datetime.fromtimestamp(scheduled_ns / NS, UTC)
        run = api.run_manually(found.id, scheduled_for=when)
        deadline = time.monotonic() + timeout_s
        while run.status not in ("success", "failed", "canceled") and time.monotonic() < deadline:
            time.sleep(0.2)
            run = _run_now(api, found.id, run)
        logs = _logs(api, found.id, run.id)
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise _api_errors(f"running task {name!r}", exc) from exc
    took = (run.finished_at - run.started_at).total_seconds() if run.finished_at and run.started_at else float("nan")
    return RunResult(name, str(run.status), scheduled_ns, took, tuple(str(e.message) for e in logs or []))


@dataclass(frozen=True, slots=True)
class BackfillReport:
    """What :func:`backfill` rolled up: the aligned spans per bucket (empty: nothing, beyond the bucket's
    retention), how many Flux queries it took, and what was left out and why."""

    rollup_spans: tuple[tuple[int, int], ...]
    jobs_spans: tuple[tuple[int, int], ...]
    queries: int
    seconds: float
    skipped: tuple[str, ...] = ()


def _aligned(start_ns: int, stop_ns: int, unit_ns: int) -> tuple[int, int]:
    return start_ns // unit_ns * unit_ns, -(-stop_ns // unit_ns) * unit_ns


def _chunks(start_ns: int, stop_ns: int, size_ns: int) -> list[tuple[int, int]]:
    return [(t, min(t + size_ns, stop_ns)) for t in range(start_ns, stop_ns, size_ns)]


def backfill(
    settings: Settings,
    spans: Sequence[tuple[int, int]],
    store: Store | None = None,
    progress: bool = False,
    now_ns: int | None = None,
) -> BackfillReport:
    """Roll up the ``[start_ns, stop_ns)`` spans now: the 1-minute rollups over their whole minutes (the stored
    rows read back and rolled up by the stream's own code, :func:`sinks.influxdb.rollup.rollup_rows`) and the job
    summaries over their whole 10 minutes (the task's Flux over the range), each clipped to what its bucket's
    retention keeps. Idempotent: the same points again (same series, same timestamps). What an import calls once
    its rows are stored (the spans that hold them): in a partition that also carries live data, the stream counts
    imported rows late and leaves them out of its rollups."""
    raw, org, s = settings.influxdb.bucket, settings.influxdb.org, settings.storage
    now_ns = time.time_ns() if now_ns is None else now_ns
    skipped: list[str] = []
    minutes = _clipped(f"{raw}_1m", _merged(spans, _MINUTE_NS), s.rollup_retention_days, now_ns, skipped)
    tens = _clipped(f"{raw}_jobs", _merged(spans, _TEN_MINUTES_NS), s.jobs_retention_days, now_ns, skipped)
    rollup_chunks = [chunk for span in minutes for chunk in _chunks(*span, ROLLUP_CHUNK_NS)]
    jobs = [
        jobs_range_flux(raw, f"{raw}_jobs", org, JOB_FIELDS, settings.sample_interval_s, a, b)
        for span in tens
        for a, b in _chunks(*span, JOBS_CHUNK_NS)
    ]
    own = store is None
    store = store or Store.from_settings(settings, timeout_s=600.0)
    writer = InfluxWriter.from_settings(settings.influxdb.model_copy(update={"bucket": f"{raw}_1m"}))
    started = time.monotonic()
    try:
        with tqdm(
            total=len(rollup_chunks) + len(jobs),
            desc="rollups and job summaries",
            unit="query",
            disable=not progress,
            dynamic_ncols=True,
            mininterval=0.5,
        ) as bar:
            for a, b in rollup_chunks:
                for rows in stored_rows(store, raw, a, b):
                    writer.write(_rollups_of(rows))
                bar.update()
            for flux in jobs:
                store.flux_records(flux)
                bar.update()
    finally:
        writer.close()
        if own:
            store.close()
    queries = 2 * len(rollup_chunks) + len(jobs)
    return BackfillReport(tuple(minutes), tuple(tens), queries, time.monotonic() - started, tuple(skipped))


def _rollups_of(rows: StoredRows) -> list[str]:
    tags = [
        series_tags(*key)
        for key in zip(rows.cluster, rows.node, rows.gpu, rows.gpu_index, rows.gpu_model, rows.application, strict=True)
    ]
    values = np.empty((len(rows.ts_ns), len(ROLLUP_FIELDS)))
    for j, name in enumerate(ROLLUP_FIELDS):
        if name in METRIC_INDEX:
            values[:, j] = rows.metrics[:, METRIC_INDEX[name]]
        elif name in RELATIVE_FIELDS:
            values[:, j] = rows.relative[:, RELATIVE_FIELDS.index(name)]
        else:
            values[:, j] = rows.score
    codes = {Verdict.UNUSUAL.value: 1, Verdict.ANOMALOUS.value: 2}
    verdict = np.fromiter((codes.get(v, 0) for v in rows.verdict), np.int8, len(rows.verdict))
    mask = rows.metrics[:, METRIC_INDEX["throttle_reasons_mask"]]
    return rollup_rows(tags, rows.ts_ns, values, mask, verdict)


def _merged(spans: Sequence[tuple[int, int]], unit_ns: int) -> list[tuple[int, int]]:
    """The spans widened to whole units, overlapping or touching ones merged, in time order."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(_aligned(a, b, unit_ns) for a, b in spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


def _clipped(
    name: str, spans: list[tuple[int, int]], retention_days: float, now_ns: int, skipped: list[str]
) -> list[tuple[int, int]]:
    """The parts of the spans the bucket still keeps (InfluxDB refuses points beyond its retention)."""
    oldest = now_ns - int(retention_days * DAY_S * NS)
    kept = [(max(a, oldest), b) for a, b in spans if b > oldest]
    if kept != spans:
        whole = "all of it" if not kept else "the part before then"
        skipped.append(f"{name} keeps {retention_days:g} days: {whole} is not rolled up")
    return kept
