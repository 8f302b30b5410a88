"""Imports of real files through the real pipeline: a local Kafka and InfluxDB started by the project, a processor
and a sink as child processes (as `hermeneut import` runs them). For every importer, the samples stored in
InfluxDB equal the rows read minus the rows dead-lettered, by count; GPU-hours and idle time come out of the
stored data as numpy computes them from the same file, with no interval setting given; and an imported trace
goes on to training, anomalies, right-sizing and the dashboard."""

from __future__ import annotations

import csv
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.jobs.importjob import ImportOutcome, run_import
from pipeline.config import (
    InfluxSettings,
    KafkaSettings,
    ServiceSettings,
    Settings,
    StorageSettings,
    TopicSettings,
    settings_env,
)
from pipeline.topics import ensure_topics, topic_specs
from sinks.query import JobsQuery, Scope, Store, TopQuery, job_summaries, top
from sinks.query.output import iso
from sinks.retention import setup, task_specs
from tests import TESTDATA
from tests.dcgm_scrapes import L40S, T4, capture, expected, exposition, mid_upgrade

from .conftest import InfluxServer, KafkaServer
from .harness import running_pipeline, stored_points

pytestmark = pytest.mark.integration

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
TRACE = NANOGPT / "gpu_metrics_f4f827dd.csv"
#: imported history is older than the default 7 days (the captures go back to 2019): these buckets keep 10 years
KEEP_DAYS = 3650.0


def import_settings(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, state: Path
) -> Settings:
    """A cluster tag, topics, consumer groups and buckets of the test's own (`storage setup` creates them with the
    long retention imported history needs)."""
    tag = uuid.uuid4().hex[:8]
    p = influx_server.proc
    s = Settings(
        cluster=f"imp-{tag}",
        group_prefix=f"imp-{tag}",
        kafka=KafkaSettings(bootstrap_servers=kafka_server.bootstrap_servers, session_timeout_s=6.0),
        influxdb=InfluxSettings(url=p.url, org=p.org, bucket=f"imp{tag}", token=p.token, flush_interval_s=0.1),
        topics=TopicSettings.with_prefix(f"imp{tag}", partitions=2),
        services=ServiceSettings(cache_dir=defaults.services.cache_dir, state_dir=state),
        storage=StorageSettings(
            raw_retention_days=KEEP_DAYS, rollup_retention_days=KEEP_DAYS, jobs_retention_days=KEEP_DAYS
        ),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return s


@pytest.fixture(scope="module")
def settings(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """One cluster, bucket and pipeline (a processor and a sink) for the module's imports: each imports other GPUs,
    so their counts do not mix."""
    s = import_settings(kafka_server, influx_server, defaults, tmp_path_factory.mktemp("import-state"))
    setup(s)
    with running_pipeline(s, tmp_path_factory.mktemp("import-pipeline")):
        yield s
    with Store.from_settings(s) as store:  # the buckets and tasks `storage setup` made for this module
        for spec in task_specs(s):
            for task in store.client.tasks_api().find_tasks(name=spec.name):
                store.client.tasks_api().delete_task(task.id)
        for name in (s.influxdb.bucket, f"{s.influxdb.bucket}_1m", f"{s.influxdb.bucket}_jobs"):
            found = store.client.buckets_api().find_bucket_by_name(name)
            if found is not None:
                store.client.buckets_api().delete_bucket(found)


def imported(settings: Settings, name: str, options: dict[str, object], inputs: tuple[Path, ...]) -> ImportOutcome:
    return run_import(settings, name, options, inputs, pipeline=False, progress=False)


def accounted(outcome: ImportOutcome) -> None:
    """The acceptance: every row read is stored or dead-lettered, by count."""
    r = outcome.report
    assert outcome.complete, (r.rows_read, outcome.stored, outcome.dead)
    assert outcome.stored == r.rows_read - outcome.dead_total


def idle_minute_samples(ts_ns: np.ndarray, util: np.ndarray, threshold: float) -> int:
    """The samples of the clock minutes whose peak utilization stays under ``threshold``, as numpy counts them."""
    minute = ts_ns // (60 * 10**9)
    starts = np.flatnonzero(np.r_[True, minute[1:] != minute[:-1]])
    peaks = np.maximum.reduceat(util, starts)
    sizes = np.diff(np.r_[starts, len(util)])
    return int(sizes[peaks < threshold].sum())


def per_gpu_trace() -> dict[int, dict[str, np.ndarray]]:
    """The trace per GPU as numpy sees it: times (ns) and utilization."""
    with TRACE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out: dict[int, dict[str, np.ndarray]] = {}
    for g in sorted({int(r["gpu_index"]) for r in rows}):
        mine = [r for r in rows if int(r["gpu_index"]) == g]
        ts = np.array([np.datetime64(r["timestamp"].rstrip("Z"), "ns").astype(np.int64) for r in mine])
        out[g] = {"ts": ts, "util": np.array([float(r["utilization_gpu_percent"]) for r in mine])}
    return out


def test_a_trace_through_a_mapping_gives_gpu_hours_and_idle_time_as_numpy_does(settings: Settings) -> None:
    outcome = imported(settings, "table", {"paths": (TRACE,), "mapping": NANOGPT / "mapping.toml"}, (TRACE,))
    accounted(outcome)
    r = outcome.report
    assert r.rows_read == 6240 and outcome.stored == 6240 and outcome.dead_total == 0
    trace = per_gpu_trace()
    # the interval of each series is detected (no setting): the median gap between its samples
    intervals = {g: float(np.median(np.diff(np.unique(t["ts"])))) / 1e9 for g, t in trace.items()}
    assert r.intervals == {f"g150/g150-gpu{g}": pytest.approx(v) for g, v in intervals.items()}
    points = stored_points(settings)
    assert len(points) == 6240
    # the context published just ahead of the first rows labels them too: every row, the first included
    assert {p["job_id"] for p in points} == {"nanogpt-pr643"} and {p["application"] for p in points} == {
        "llm-pretraining"
    }
    start, stop = iso(r.first_ns), iso(r.last_ns + 10**9)
    gpu_hours = sum(len(t["ts"]) * intervals[g] for g, t in trace.items()) / 3600
    # top wasted counts the samples of minutes whose peak utilization stayed under the threshold (docs/queries.md)
    idle_hours = sum(idle_minute_samples(t["ts"], t["util"], 10.0) * intervals[g] for g, t in trace.items()) / 3600
    with Store.from_settings(settings) as store:
        (job,) = job_summaries(store, JobsQuery(None, Scope(cluster=settings.cluster), start, stop)).rows
        wasted = top(store, TopQuery("wasted", 20, None, Scope(cluster=settings.cluster), threshold=10.0,
                                     start=start, stop=stop))  # fmt: skip
    # GPU-hours from the backfilled job summaries, idle time from the raw samples: as numpy has them
    assert job.job == "nanogpt-pr643" and job.gpu_hours == pytest.approx(gpu_hours, rel=1e-9)
    assert sum(float(row.values[0] or 0) for row in wasted.rows) == pytest.approx(idle_hours, rel=1e-9)
    assert sum(float(row.values[1] or 0) for row in wasted.rows) == pytest.approx(gpu_hours, rel=1e-9)

    again = imported(settings, "table", {"paths": (TRACE,), "mapping": NANOGPT / "mapping.toml"}, (TRACE,))
    accounted(again)  # resumed: nothing left to send, nothing counted twice
    assert again.report.runs[:1] == r.runs and again.report.rows_read == again.stored == 6240


def test_nvidia_smi_csv_logs_of_seven_gpus(settings: Settings) -> None:
    paths = tuple(sorted((TESTDATA / "nvidia-smi-csv").glob("*.csv")))
    outcome = imported(settings, "nvidia-smi-csv", {"paths": paths}, paths)
    accounted(outcome)
    assert outcome.report.rows_read == 14 and outcome.stored == 14
    points = stored_points(settings)
    load = next(p for p in points if p["node"] == "nvidia-h100-80gb-hbm3-load")
    assert load["power_watts"] == 631.95 and load["memory_used_bytes"] == 19818 * 2**20


def test_nvidia_smi_xml_captures(settings: Settings) -> None:
    folder = TESTDATA / "nvidia-smi-xml"
    outcome = imported(settings, "nvidia-smi-xml", {"paths": (folder,), "node": "lab"}, (folder,))
    accounted(outcome)
    # 16 captures, 18 GPUs: the hand-trimmed one without a timestamp is dead-lettered, and so is the second GPU of
    # dual_2080-v13.xml, whose uuid its anonymiser made the same as the first's (one point per GPU and time); the
    # lent H100's two captures share a masked uuid at two times: two points
    assert outcome.report.rows_read == 19 and outcome.stored == 17
    assert dict(outcome.dead) == {"malformed": 1, "duplicate": 1}


def test_saved_dcgm_exporter_scrapes(settings: Settings) -> None:
    folders = tuple(TESTDATA / d for d in ("dcgm-exporter-cncf-ai-conformance", "dcgm-exporter-datadog-fixture",
                                           "dcgm-exporter-nvidia-cloud-native-docs"))  # fmt: skip
    outcome = imported(settings, "dcgm-exporter", {"paths": folders, "time": "2026-03-06T12:00:00Z"}, folders)
    accounted(outcome)
    # kops_l4.prom repeats its scrape and the docs' example has a "..." line: two files dead-lettered whole
    assert dict(outcome.dead) == {"malformed": 2}
    assert outcome.stored == outcome.report.rows_read - 2 and outcome.stored >= 7


def test_dcgm_exporter_scrape_mid_upgrade_stores_each_gpus_values_in_our_units(
    settings: Settings, tmp_path: Path
) -> None:
    """A scrape with dcgm-exporter 4.8.2's names (a T4) and 4.10.0's (an L40S, its 4.8.2 series still there with
    other values): what InfluxDB holds is each GPU's legacy capture in the schema's units (tests/dcgm_scrapes.py)."""
    samples, _ = mid_upgrade()
    path = tmp_path / "mid-upgrade.prom"
    path.write_text(exposition(samples))
    outcome = imported(settings, "dcgm-exporter", {"paths": (path,), "time": "2026-12-01T00:00:00Z"}, (path,))
    accounted(outcome)
    assert outcome.report.rows_read == 2 and outcome.stored == 2
    want = expected(capture(T4)) | expected(capture(L40S))
    mine = [r for r in stored_points(settings) if r["_time"].isoformat().startswith("2026-12-01T00:00:00")]
    limits = [r for r in stored_points(settings, "gpu_info") if r["_time"].isoformat().startswith("2026-12-01T00:00")]
    assert {r["gpu"] for r in mine} == set(want) == {r["gpu"] for r in limits}
    for row in mine + limits:
        fields = {f: v for f, v in want[row["gpu"]].items() if f in row}
        assert fields == pytest.approx({f: row[f] for f in fields}, rel=1e-9), row["gpu"]
    checked = {f for r in mine + limits for f in r if f in want[r["gpu"]]}
    assert len(checked) >= 16 and "memory_total_bytes" in checked and "energy_joules" in checked, sorted(checked)


def test_the_command_line_prints_the_summary_and_what_to_run_next(settings: Settings, tmp_path: Path) -> None:
    env = settings_env(settings) | {"HERMENEUT_SERVICES__STATE_DIR": str(tmp_path / "cli-state")}
    args = ["import", "table", str(TRACE), "--mapping", str(NANOGPT / "mapping.toml"), "--no-pipeline"]
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "rows read        6240" in out and "stored           6240" in out and "dead-lettered    0 (none)" in out
    assert "GPUs             8 on 1 node(s)" in out and "jobs             1: nanogpt-pr643" in out
    assert "intervals        0.331 s (8 series)" in out
    # what utilization, power and temperature cannot show (processors.coverage), and nothing they can
    assert "cannot see       18 of " in out and "memory-leak: needs the memory used" in out, out
    assert "straggler:" not in out and "fallen-off-bus:" not in out
    assert "hermeneut baselines train --range 5m --stop 2025-09-24T03:46:10" in out
    bad = CliRunner().invoke(cli, ["import", "table", str(TRACE), "--mapping", str(TRACE)], env=env)
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "invalid configuration" in bad.output


def test_a_hostile_nvidia_smi_log_stores_every_good_row(settings: Settings, tmp_path: Path) -> None:
    """The nanoGPT run's 8 GPUs as nvidia-smi logs them without an index (10 times), read in the declared order,
    with issue 37's hostile lines in it: each bad line is one dead letter, every other line is stored, and the
    summary's counts add up."""
    import re

    from hermeneut.jobs.importjob import summary
    from tests.unit.producers.importers.test_hostile import LIMIT, _nanogpt_as_nvidia_smi

    lines = _nanogpt_as_nvidia_smi(80).splitlines()
    lines[3] = re.sub(r"[\d.]+ W$", "7" * (LIMIT + 1) + " W", lines[3])  # a field over the CSV reader's limit
    lines[20] = re.sub(r"[\d.]+ W$", "30\x0c0 W", lines[20])  # a form feed inside a cell
    lines[30] = "1e300" + lines[30][lines[30].index(",") :]  # a time that is none
    lines[41] = re.sub(r"([\d.]+) W$", r'"\1\n W"', lines[41])  # a quoted line break: valid CSV, stored
    path = tmp_path / "hostile.csv"
    path.write_bytes("\n".join(lines).encode() + b"\n")
    options = {"paths": (path,), "gpus_per_timestamp": 8}
    outcome = imported(settings, "nvidia-smi-csv", options, (path,))
    accounted(outcome)
    assert outcome.report.rows_read == 80 and outcome.stored == 77 and dict(outcome.dead) == {"malformed": 3}
    said = "\n".join(summary(outcome, settings, None))
    assert "rows read        80" in said and "stored           77" in said and "3 (3 malformed)" in said, said
    points = [p for p in stored_points(settings) if p["node"] == "hostile"]
    assert len(points) == 77 and {p["gpu"] for p in points} == {f"hostile-gpu{i}" for i in range(8)}
    quoted = float(re.findall(r'"([\d.]+)', lines[41])[0])
    assert quoted in {p["power_watts"] for p in points if p["gpu"] == "hostile-gpu0"}  # line 42: GPU 0 of time 6
