"""Retention and downsampling on the real InfluxDB: buckets and the job-summary task created idempotently (the
1-minute rollup task of the previous version removed), known points written by the real sink, which computes the
1-minute rollups in the stream: their exact values read back, the same points as the previous version's task
computes from the raw data, the job-summary task's exact values, and long-range questions answered from the
rollups."""

from __future__ import annotations

import math
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from influxdb_client.domain.task_create_request import TaskCreateRequest

from hermeneut.cli import cli
from pipeline.codec import encode_interpreted
from pipeline.config import Settings
from pipeline.errors import InvalidQuery
from pipeline.events import GpuSample, InterpretedBatch, InterpretedEvent, Verdict, Workload
from pipeline.publisher import Publisher
from pipeline.services import kafka
from sinks.influxdb.lines import series_tags
from sinks.influxdb.schema import ROLLUP_FIELDS, TAGS
from sinks.influxdb.write import InfluxWriter
from sinks.query import (
    AnomalyQuery,
    JobsQuery,
    Scope,
    Store,
    TopQuery,
    TrendQuery,
    anomalies,
    job_summaries,
    top,
    trend,
)
from sinks.query.flux import string
from sinks.query.model import BENIGN_MASKS
from sinks.query.output import iso
from sinks.retention import backfill, retired_task_names, run_task, task_specs

from .conftest import InfluxServer
from .harness import wait_stored
from .query_data import query_settings, running_sink

pytestmark = pytest.mark.integration

NS, MIN = 1_000_000_000, 60_000_000_000
ROUNDS = 120
GPUS = (
    ("n0", "GPU-r0", "NVIDIA H100 80GB HBM3", 700.0),
    ("n1", "GPU-r1", "NVIDIA L40S", 350.0),
    ("n1", "GPU-r2", "NVIDIA L40S", 350.0),  # no workload: rolled up too, in no job summary
)


def _env(s: Settings) -> dict[str, str]:
    assert s.influxdb.url and s.influxdb.token
    return {
        "HERMENEUT_INFLUXDB__URL": s.influxdb.url,
        "HERMENEUT_INFLUXDB__TOKEN": s.influxdb.token.get_secret_value(),
        "HERMENEUT_INFLUXDB__BUCKET": s.influxdb.bucket,
    }


@pytest.fixture
def stored(
    kafka_server: kafka.KafkaProcess, influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> Iterator[tuple[Settings, int, list[dict[str, float | str | int]]]]:
    """A bucket of its own, set up by ``hermeneut storage setup``, with two minutes of known samples (two GPUs,
    1 Hz) starting on a whole 10 minutes; removed again after the test."""
    settings = query_settings(kafka_server, influx_server, defaults, tmp_path, bucket=f"r{uuid.uuid4().hex[:8]}")
    env = _env(settings)
    raw = settings.influxdb.bucket
    (retired,) = retired_task_names(settings)
    _create_task(settings, previous_rollup_task_flux(retired, raw, f"{raw}_1m", settings.influxdb.org))
    first = CliRunner().invoke(cli, ["storage", "setup"], env=env)
    assert first.exit_code == 0, first.output
    assert [line.split()[1] for line in first.output.splitlines()] == ["created"] * 4 + ["removed"]
    again = CliRunner().invoke(cli, ["storage", "setup"], env=env)
    assert [line.split()[1] for line in again.output.splitlines()] == ["unchanged"] * 4

    start = (time.time_ns() // (10 * MIN) - 2) * 10 * MIN
    rng = np.random.default_rng(11)
    rows: list[dict[str, float | str | int]] = []
    batches = []
    for r in range(ROUNDS):
        ts = start + r * NS
        events = []
        for node, gpu, model, limit in GPUS:
            power = round(float(rng.uniform(50, limit)), 2)
            util = float(rng.integers(0, 101))
            mask = float(rng.choice([0, 1, 4, 0x40, 0x10]))
            verdict = [Verdict.NORMAL, Verdict.UNUSUAL, Verdict.ANOMALOUS][int(rng.integers(0, 3))]
            job = None if gpu == "GPU-r2" else "job-x" if gpu == "GPU-r0" or r < 60 else "job-y"
            m = {"power_watts": power, "power_limit_watts": limit, "utilization_gpu_percent": util,
                 "throttle_reasons_mask": mask}  # fmt: skip
            wl = Workload("bert-training", job_id=job) if job else None
            sample = GpuSample(settings.cluster, node, gpu, 0, model, ts, m)
            events.append(InterpretedEvent(sample, {"power_ratio_of_limit": power / limit}, wl, 1.0, verdict))
            rows.append({"gpu": gpu, "model": model, "ts": ts, "job": job, "power_watts": power, "util": util,
                         "mask": int(mask), "verdict": verdict.value, "ratio": power / limit})  # fmt: skip
        batches.append(InterpretedBatch.from_events(events))
    # a sample of another cluster 3 minutes later in the same partition: the sink closes a partition's minute once
    # it is a minute past it (the processor keeps each GPU in one partition; one key does that here)
    later = GpuSample("elsewhere", "n9", "GPU-later", 0, GPUS[0][2], start + 3 * MIN, {"power_watts": 1.0})
    batches.append(InterpretedBatch.from_events([InterpretedEvent(later)]))
    pub = Publisher(settings.kafka.client_config())
    with running_sink(settings, tmp_path / "run") as sink:
        for b in batches:
            pub.publish(settings.topics.interpreted, b"one-partition", encode_interpreted(b))
        assert pub.close(30) == 0
        wait_stored(sink, ROUNDS * len(GPUS) + 1)
        assert sink.stats()["rollup_minutes"] == 2 * len(GPUS) and sink.stats()["rollup_late_rows"] == 0
    try:
        yield settings, start, rows
    finally:
        with Store.from_settings(settings) as store:
            tasks_api = store.client.tasks_api()
            for spec in task_specs(settings):
                for task in tasks_api.find_tasks(name=spec.name):
                    tasks_api.delete_task(task.id)
            buckets_api = store.client.buckets_api()
            for name in (raw, f"{raw}_1m", f"{raw}_jobs", f"{raw}_1m_task"):
                found = buckets_api.find_bucket_by_name(name)
                if found is not None:
                    buckets_api.delete_bucket(found)


def _ceil_rank(values: list[float], q: float) -> float:
    a = np.sort(values)
    return float(a[max(math.ceil(q * float(len(a))), 1) - 1])


def _create_task(settings: Settings, flux: str) -> None:
    with Store.from_settings(settings) as store:
        orgs = store.client.organizations_api().find_organizations(org=settings.influxdb.org)
        request = TaskCreateRequest(org_id=orgs[0].id, flux=flux, status="active", description="hermeneut")
        store.client.tasks_api().create_task(task_create_request=request)


def test_stream_rollups_equal_the_previous_versions_task_on_the_same_data(
    stored: tuple[Settings, int, list[dict]],  # type: ignore[type-arg]
) -> None:
    """The previous version computed the rollups with an InfluxDB task reading the raw data back; run on the same
    raw data, into a bucket of its own, it gives exactly the points the sink computed in the stream."""
    settings, start, rows = stored
    raw, org = settings.influxdb.bucket, settings.influxdb.org
    name = f"previous rollup task {raw}"
    # the previous version's raw data also held each sample's relative values (they are computed at query time
    # now): added to the same points, as its sink wrote them
    nodes = {gpu: node for node, gpu, _, _ in GPUS}
    writer = InfluxWriter.from_settings(settings.influxdb)
    lines = []
    for r in rows:
        gpu, app = str(r["gpu"]), "bert-training" if r["job"] else None
        tags = series_tags(settings.cluster, nodes[gpu], gpu, 0, str(r["model"]), app)
        lines.append(f"gpu,{tags} power_ratio_of_limit={float(r['ratio'])!r} {int(r['ts']) // 1_000_000}")
    writer.write(lines)
    writer.close()
    with Store.from_settings(settings) as store:
        store.client.buckets_api().create_bucket(bucket_name=f"{raw}_1m_task", org=org)
        # its Flux run as the scheduler ran it at start + 2 minutes (``now()`` is the run's scheduled time), as one
        # query: run as a task, its output once came back 6 points short on a loaded CI box with the run already
        # "success", which this comparison cannot tell from a wrong stream
        flux = previous_rollup_task_flux(name, raw, f"{raw}_1m_task", org)
        store.flux_records(flux.replace("option task", f"option now = () => {iso(start + 2 * MIN)}\noption task", 1))
        points = {}
        for bucket in (f"{raw}_1m", f"{raw}_1m_task"):
            records = store.flux_records(
                f'from(bucket: "{bucket}") |> range(start: {iso(start)}, stop: {iso(start + 3 * MIN)}) '
                f'|> filter(fn: (r) => r.cluster == "{settings.cluster}")'
            )
            points[bucket] = {
                (tuple(str(r.get(t)) for t in TAGS["gpu"]), r["_time"], r["_field"]): r["_value"] for r in records
            }
    stream, task = points[f"{raw}_1m"], points[f"{raw}_1m_task"]
    assert sorted(set(stream) - set(task)) == [] and sorted(set(task) - set(stream)) == []
    assert len(stream) == 6 * 20  # 3 series x 2 minutes x (4 fields x 4 functions + 4 counts)
    for key, value in task.items():
        assert stream[key] == pytest.approx(value, rel=1e-12), key


@pytest.mark.parametrize("how", ["stream", "backfill"])
def test_rollups_and_job_summaries_hold_the_exact_values(stored: tuple[Settings, int, list[dict]], how: str) -> None:  # type: ignore[type-arg]
    """The rollups the sink streamed and the job task's summaries; or, with the rollups deleted, what a backfill
    (as an import calls it) computes from the stored rows and the job task's Flux over the range: the same exact
    values."""
    settings, start, rows = stored
    (jobs_task,) = task_specs(settings)
    with Store.from_settings(settings) as store:
        if how == "stream":
            assert run_task(store, jobs_task.name, start + 10 * MIN).status == "success"
        else:
            raw = settings.influxdb.bucket
            store.client.delete_api().delete(iso(start), iso(start + 10 * MIN), "", f"{raw}_1m", settings.influxdb.org)
            gone = store.flux_records(
                f'from(bucket: "{raw}_1m") |> range(start: {iso(start)}, stop: {iso(start + 2 * MIN)})'
            )
            assert gone == []
            report = backfill(settings, [(start, start + ROUNDS * NS)], store)
            assert report.rollup_spans == ((start, start + 2 * MIN),)
            assert report.jobs_spans == ((start, start + 10 * MIN),) and report.skipped == ()
        got = store.flux_records(
            f'from(bucket: "{settings.influxdb.bucket}_1m") |> range(start: {iso(start)}, stop: {iso(start + 2 * MIN)})'
        )
        jobs = store.flux_records(f'from(bucket: "{settings.influxdb.bucket}_jobs") |> range(start: {iso(start)})')
    rollup = {(r["gpu"], int(r["_time"].timestamp()), r["_field"]): r["_value"] for r in got}
    per_minute: dict[tuple[str, int], list[dict]] = defaultdict(list)  # type: ignore[type-arg]
    for r in rows:
        per_minute[(str(r["gpu"]), (int(r["ts"]) // MIN) * 60)].append(r)
    assert len(per_minute) == 6
    for (gpu, minute), sample in per_minute.items():
        power = [float(r["power_watts"]) for r in sample]
        assert rollup[(gpu, minute, "power_watts_mean")] == pytest.approx(np.mean(power), rel=1e-12)
        assert rollup[(gpu, minute, "power_watts_max")] == max(power)
        assert rollup[(gpu, minute, "power_watts_min")] == min(power)
        assert rollup[(gpu, minute, "power_watts_count")] == 60
        assert rollup[(gpu, minute, "power_ratio_of_limit_max")] == pytest.approx(
            max(float(r["ratio"]) for r in sample)
        )
        assert rollup[(gpu, minute, "utilization_gpu_percent_mean")] == pytest.approx(
            np.mean([r["util"] for r in sample])
        )
        assert rollup[(gpu, minute, "throttle_samples")] == 60
        assert rollup.get((gpu, minute, "throttled_samples"), 0) == sum((int(r["mask"]) & ~0x113) != 0 for r in sample)
        for verdict in ("unusual", "anomalous"):
            count = sum(r["verdict"] == verdict for r in sample)
            assert rollup.get((gpu, minute, f"verdict_{verdict}"), 0.0) == count
    summary = {(r["job_id"], r["gpu_model"], r["_field"]): r["_value"] for r in jobs}
    assert {(j, m) for j, m, _ in summary} == {("job-x", GPUS[0][2]), ("job-x", GPUS[1][2]), ("job-y", GPUS[1][2])}
    for (job, model, field), value in summary.items():
        sample = [r for r in rows if r["job"] == job and r["model"] == model]
        column = {"power_watts": "power_watts", "utilization_gpu_percent": "util"}.get(field.rsplit("_", 1)[0])
        if field == "gpu_seconds":
            assert value == len(sample) * settings.sample_interval_s
        elif column is not None:
            values = [float(r[column]) for r in sample]
            stat = field.rsplit("_", 1)[1]
            want = max(values) if stat == "max" else _ceil_rank(values, int(stat[1:]) / 100)
            assert value == pytest.approx(want), field
    assert all(r["application"] == "bert-training" for r in jobs)
    with Store.from_settings(settings) as store:
        summaries = job_summaries(store, JobsQuery(None, Scope(cluster=settings.cluster)))
    assert [(s.job, s.gpu_model) for s in summaries.rows] == [
        ("job-x", GPUS[0][2]),
        ("job-x", GPUS[1][2]),
        ("job-y", GPUS[1][2]),
    ]
    for s in summaries.rows:
        sample = [r for r in rows if r["job"] == s.job and r["model"] == s.gpu_model]
        util, _memory, power = s.stats
        assert s.gpu_hours == pytest.approx(len(sample) / 3600)
        assert util == pytest.approx(
            (
                _ceil_rank([float(r["util"]) for r in sample], 0.5),
                _ceil_rank([float(r["util"]) for r in sample], 0.95),
                max(r["util"] for r in sample),
            )
        )
        assert power[2] == max(float(r["power_watts"]) for r in sample)


def test_long_ranges_read_the_rollups(stored: tuple[Settings, int, list[dict]]) -> None:  # type: ignore[type-arg]
    settings, _start, rows = stored
    with Store.from_settings(settings) as store:
        scope = Scope(cluster=settings.cluster)
        for fn in ("max", "mean", "count"):
            result = trend(store, TrendQuery("power_watts", "gpu", "1m", "3d", fn, scope))
            assert result.source == "1m" and result.notes == ()
            got = {(r.group[0], r.time_ns): r.value for r in result.rows}
            assert len(got) == 2 * len(GPUS)
            for (gpu, t), value in got.items():
                power = [float(r["power_watts"]) for r in rows if r["gpu"] == gpu and t <= int(r["ts"]) < t + MIN]
                want = {"max": max(power), "mean": np.mean(power), "count": len(power)}[fn]
                assert value == pytest.approx(want, rel=1e-12), (fn, gpu)
        p95 = trend(store, TrendQuery("power_watts", "gpu", "1h", "3d", "p95", scope))
        assert p95.source == "1m" and "p95 over the 1-minute means" in p95.notes[0]
        short = trend(store, TrendQuery("power_watts", "gpu", "1m", "1h", "max", scope))
        assert short.source == "raw" and len(short.rows) == 2 * len(GPUS)
        # the rollups cannot answer these: within raw retention they read raw data, beyond it they say why
        assert trend(store, TrendQuery("pcie_replay_total", "gpu", "1h", "3d", "max", scope)).source == "raw"
        with pytest.raises(InvalidQuery, match="not kept in the rollups"):
            trend(store, TrendQuery("pcie_replay_total", "gpu", "1d", "30d", "max", scope))
        throttled = top(store, TopQuery("throttled", 5, "3d", scope))
        assert throttled.source == "1m"
        for r in throttled.rows:
            masks = [int(x["mask"]) for x in rows if x["gpu"] == r.gpu]
            assert r.values == (pytest.approx(np.mean([(m & ~0x113) != 0 for m in masks])), len(masks))
        history = anomalies(store, AnomalyQuery("3d", "1h", scope))
        assert history.source == "1m"
        assert sum(w.anomalous for w in history.windows) == sum(r["verdict"] == "anomalous" for r in rows)
        assert sum(w.samples for w in history.windows) == len(rows)


def test_storage_status_and_backfill_from_the_cli(stored: tuple[Settings, int, list[dict]]) -> None:  # type: ignore[type-arg]
    settings, start, _rows = stored
    env = _env(settings)
    backfill = CliRunner().invoke(cli, ["storage", "rollup", "--at", iso(start + 2 * MIN)], env=env)
    assert backfill.exit_code == 0, backfill.output
    assert [line.split()[0] for line in backfill.output.splitlines()] == ["success"]
    status = CliRunner().invoke(cli, ["storage", "status"], env=env)
    assert status.exit_code == 0, status.output
    lines = status.output.splitlines()
    assert [line.split()[2:5] for line in lines[:3]] == [
        ["ok", "kept", "7"],
        ["ok", "kept", "90"],
        ["ok", "kept", "400"],
    ]
    assert len(lines) == 4 and "active" in lines[3] and "last run success" in lines[3]


def previous_rollup_task_flux(name: str, raw: str, rollup: str, org: str) -> str:
    """The InfluxDB task the previous version installed for the 1-minute rollups (its Flux as it was), kept here
    as the reference the stream's rollups are checked against."""
    measurement, fields = "gpu", ROLLUP_FIELDS
    fields_predicate = "(" + " or ".join(f"r._field == {string(f)}" for f in fields) + ")"
    not_benign = "    |> filter(fn: (r) => " + " and ".join(f"r._value != {v!r}" for v in BENIGN_MASKS) + ")"
    out = f"to(bucket: {string(rollup)}, org: {string(org)})"
    src = f"from(bucket: {string(raw)})\n    |> range(start: start, stop: stop)"

    def count_as(field_name: str, filters: str) -> str:
        return (
            f"{src}\n{filters}\n"
            '    |> aggregateWindow(every: 1m, fn: count, timeSrc: "_start", createEmpty: false)\n'
            f"    |> map(fn: (r) => ({{r with _value: float(v: r._value), _field: {string(field_name)}}}))\n"
            f"    |> {out}"
        )

    series = ", ".join(string(t) for t in (*TAGS["gpu"], "_measurement"))
    per_fn = "\n\n".join(
        f"{src}\n"
        f"    |> filter(fn: (r) => r._measurement == {string(measurement)} and {fields_predicate})\n"
        f'    |> aggregateWindow(every: 1m, fn: {fn}, timeSrc: "_start", createEmpty: false)\n'
        f'    |> map(fn: (r) => ({{r with _value: float(v: r._value), _field: r._field + "_{fn}"}}))\n'
        f"    |> group(columns: [{series}])\n"
        '    |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
        f"    |> experimental.to(bucket: {string(rollup)}, org: {string(org)})"
        for fn in ("mean", "max", "min", "count")
    )
    mask = f'    |> filter(fn: (r) => r._measurement == {string(measurement)} and r._field == "throttle_reasons_mask")'
    verdict = f'    |> filter(fn: (r) => r._measurement == {string(measurement)} and r._field == "verdict")'
    counts = [
        count_as("throttle_samples", mask),
        count_as("throttled_samples", mask + "\n" + not_benign),
        *(count_as(f"verdict_{v}", f'{verdict}\n    |> filter(fn: (r) => r._value == "{v}")') for v in VERDICTS),
    ]
    return f"""import "date"
import "experimental"

option task = {{name: {string(name)}, every: 1m, offset: 15s}}

stop = date.truncate(t: now(), unit: 1m)
start = date.sub(d: 2m, from: stop)

{per_fn}

{chr(10).join(c + chr(10) for c in counts)}"""


VERDICTS = ("unusual", "anomalous")
