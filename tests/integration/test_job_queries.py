"""Job questions on interpreted data through the real sink into the real InfluxDB: per-GPU job trends, baseline
bands, a job against its baseline, model comparisons, top-N wasted capacity and XIDs, anomaly history, the HTTP API
and right-sizing (InterpretedBatches with workloads, verdicts, XIDs and findings published to the interpreted and
alerts topics; baseline bands written in the contract's shape through ``InfluxWriter``).
"""

from __future__ import annotations

import csv
import io
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from influxdb_client.client.influxdb_client import InfluxDBClient

from hermeneut.web.app import create_app, serving
from pipeline.codec import encode_interpreted, encode_record
from pipeline.config import Settings
from pipeline.events import (
    EventKind,
    Finding,
    GpuEvent,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    Severity,
    Verdict,
    Workload,
)
from pipeline.publisher import Publisher
from pipeline.services import kafka
from pipeline.services.stages import wait_for
from sinks.influxdb.write import InfluxWriter
from sinks.query import (
    AnomalyQuery,
    CompareJobQuery,
    CompareModelsQuery,
    Scope,
    Store,
    TopQuery,
    TrendQuery,
    anomalies,
    compare_job,
    compare_models,
    top,
    trend,
)
from sinks.query.output import iso
from tests.webserver import get, get_json

from .conftest import InfluxServer
from .harness import wait_stored
from .query_data import A100, GPUS, H100, MIN, NS, ROUNDS, expected, own_bucket, query_settings, running_sink, start_ns

pytestmark = pytest.mark.integration

# ---- data set 2: interpreted batches (workloads, verdicts, events, findings) through the sink ----------------


@dataclass
class Row:
    gpu: str
    model: str
    ts: int
    job: str | None
    application: str | None
    verdict: str
    power_watts: float
    power_ratio_of_limit: float
    utilization_gpu_percent: float
    memory_used_ratio: float
    temperature_ratio_of_slowdown: float


@dataclass
class JobData:
    settings: Settings
    start_ns: int
    rows: list[Row]
    xids: dict[str, list[int]]
    findings: list[Finding]

    @property
    def span(self) -> dict[str, str]:
        return {"start": iso(self.start_ns), "stop": iso(self.start_ns + 3 * MIN)}

    def where(self, **match: object) -> list[Row]:
        return [r for r in self.rows if all(getattr(r, k) == v for k, v in match.items())]

    def window(self, rows: list[Row], t: int) -> list[Row]:
        return [r for r in rows if t <= r.ts < t + MIN]


#: baseline bands in the contract's shape: two versions, the later one counts
BANDS = {
    (H100, 1.0): (0.10, 0.15, 0.30, 0.50, 0.60),
    (H100, 2.0): (0.20, 0.30, 0.55, 0.80, 0.90),
    (A100, 2.0): (0.05, 0.10, 0.40, 0.70, 0.80),
}


def _workload(gpu: str, r: int) -> Workload | None:
    if gpu == "GPU-a" or (gpu == "GPU-b" and r < 120):
        return Workload("llm-pretraining", job_id="job-1", user="ana", source="slurm", confidence=1.0)
    if gpu == "GPU-b":
        return Workload("llm-finetuning", job_id="job-3", user="bo", source="slurm", confidence=1.0)
    if gpu == "GPU-c":
        return Workload("llm-pretraining", job_id="job-2", user="cy", source="slurm", confidence=1.0)
    return None  # GPU-d: nothing allocated


def _interpreted(cluster: str, start_ns: int) -> tuple[list[InterpretedBatch], list[Row], dict[str, list[int]]]:
    rng = np.random.default_rng(7)
    verdicts = [Verdict.NORMAL, Verdict.NORMAL, Verdict.NORMAL, Verdict.UNUSUAL, Verdict.ANOMALOUS]
    rows: list[Row] = []
    batches = []
    xids: dict[str, list[int]] = {"GPU-a": [79, 79, 48], "GPU-c": [13]}
    for r in range(ROUNDS):
        ts = start_ns + r * NS
        events = []
        for node, gpu, index, model, limit, slowdown in GPUS:
            util = float(rng.integers(0, 20)) if gpu == "GPU-c" else float(rng.integers(0, 101))
            total = 80 * 2**30 if model == H100 else 40 * 2**30
            m = {
                "power_watts": round(float(rng.uniform(60, limit * 0.95)), 2),
                "power_limit_watts": limit,
                "utilization_gpu_percent": util,
                "memory_used_bytes": float(rng.integers(1, total // 2**20) * 2**20),
                "memory_total_bytes": float(total),
                "temperature_gpu_celsius": float(rng.integers(30, 86)),
                "temperature_slowdown_celsius": slowdown,
            }
            rel = {
                "power_ratio_of_limit": m["power_watts"] / limit,
                "memory_used_ratio": m["memory_used_bytes"] / total,
                "temperature_ratio_of_slowdown": m["temperature_gpu_celsius"] / slowdown,
            }
            wl = _workload(gpu, r)
            verdict = verdicts[int(rng.integers(0, len(verdicts)))]
            sample = GpuSample(cluster, node, gpu, index, model, ts, m)
            events.append(InterpretedEvent(sample, rel, wl, float(rng.uniform(0, 5)), verdict))
            rows.append(
                Row(gpu, model, ts, wl.job_id if wl else None, wl.application if wl else None, verdict.value,
                    m["power_watts"], rel["power_ratio_of_limit"], util, rel["memory_used_ratio"],
                    rel["temperature_ratio_of_slowdown"])
            )  # fmt: skip
        gpu_events = []
        if r in (10, 20, 30, 40):
            gpu = "GPU-a" if r < 40 else "GPU-c"
            code = {10: 79, 20: 79, 30: 48, 40: 13}[r]
            node = "n0" if gpu == "GPU-a" else "n1"
            gpu_events.append(GpuEvent(cluster, node, gpu, 0, ts, EventKind.XID, code, f"XID {code}"))
            gpu_events.append(GpuEvent(cluster, node, gpu, 0, ts, EventKind.ROW_REMAP, 0, "not an XID"))
        batches.append(InterpretedBatch.from_events(events, tuple(gpu_events)))
    return batches, rows, xids


def _findings(cluster: str, start_ns: int) -> list[Finding]:
    job1 = Workload("llm-pretraining", job_id="job-1")
    return [
        Finding("thermal-throttling", Severity.WARNING, True, cluster, "n0", "GPU-a", H100, start_ns + 30 * NS,
                start_ns + 25 * NS, "GPU-a throttled for heat", workload=job1),
        Finding("thermal-throttling", Severity.WARNING, False, cluster, "n0", "GPU-a", H100, start_ns + 90 * NS,
                start_ns + 25 * NS, "GPU-a no longer throttled", workload=job1),
        Finding("xid", Severity.WARNING, True, cluster, "n1", "GPU-c", A100, start_ns + 40 * NS, start_ns + 40 * NS,
                "XID 13 on GPU-c"),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def jobs(
    kafka_server: kafka.KafkaProcess,
    influx_server: InfluxServer,
    defaults: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> JobData:
    state = tmp_path_factory.mktemp("jobs")
    # Baselines are fleet-wide (no cluster tag): a bucket of its own keeps other tests' trained bands out.
    settings = query_settings(kafka_server, influx_server, defaults, state, bucket=own_bucket(influx_server))
    start = start_ns()
    batches, rows, xids = _interpreted(settings.cluster, start)
    findings = _findings(settings.cluster, start)
    pub = Publisher(settings.kafka.client_config())
    with running_sink(settings, state / "run") as sink:
        for b in batches:
            pub.publish(settings.topics.interpreted, None, encode_interpreted(b))
        for f in findings:
            pub.publish(settings.topics.alerts, f.dedup_key.encode(), encode_record(f))
        assert pub.close(30) == 0
        wait_stored(sink, ROUNDS * len(GPUS))
        assert wait_for(lambda: sink.stats().get("findings_written") == len(findings), 30)
    writer = InfluxWriter.from_settings(settings.influxdb)
    trained = start - 3600 * NS
    lines = []
    for (model, version), (p01, p05, p50, p95, p99) in BANDS.items():
        escaped = model.replace(" ", "\\ ")
        tags = f"application=llm-pretraining,feature=power_ratio_of_limit,gpu_model={escaped},phase=compute"
        fields = f"p01={p01},p05={p05},p50={p50},p95={p95},p99={p99},n=5000.0,version={version}"
        lines.append(f"baseline,{tags} {fields} {(trained + int(version) * MIN) // 1_000_000}")
    writer.write(lines)
    writer.close()
    return JobData(settings, start, rows, xids, findings)


@pytest.fixture
def jstore(jobs: JobData) -> Iterator[Store]:
    with Store.from_settings(jobs.settings) as s:
        yield s


@pytest.mark.parametrize("backend", ["flux", "influxql"])
def test_a_job_trend_per_gpu(jobs: JobData, jstore: Store, backend: str) -> None:
    scope = Scope(cluster=jobs.settings.cluster, job="job-1")
    for fn in ("mean", "max", "count", "p95", "median"):
        result = trend(jstore, TrendQuery("power_watts", "gpu", "1m", None, fn, scope, backend=backend, **jobs.span))
        job_rows = jobs.where(job="job-1")
        want = {
            (t, g): expected([r.power_watts for r in jobs.window(job_rows, t) if r.gpu == g], fn, backend)
            for t in range(jobs.start_ns, jobs.start_ns + 3 * MIN, MIN)
            for g in ("GPU-a", "GPU-b")
            if any(r.gpu == g for r in jobs.window(job_rows, t))
        }
        got = {(r.time_ns, r.group[0]): r.value for r in result.rows}
        assert got.keys() == want.keys(), fn  # GPU-b left job-1 after two minutes
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-9), (fn, k)


def test_trend_with_the_baseline_band(jobs: JobData, jstore: Store) -> None:
    scope = Scope(cluster=jobs.settings.cluster, node="n0")
    q = TrendQuery("power_ratio_of_limit", "gpu", "1m", None, "mean", scope, band=True, **jobs.span)
    result = trend(jstore, q)
    assert result.group_by == ("gpu", "application", "gpu_model")
    latest = BANDS[(H100, 2.0)]
    for r in result.rows:
        if r.group[1] == "llm-pretraining":
            assert r.band is not None and (r.band.p05, r.band.p50, r.band.p95, r.band.version) == (*latest[1:4], 2.0)
        else:
            assert r.band is None
    assert any("no compute baseline for power_ratio_of_limit on llm-finetuning/" + H100 in n for n in result.notes)
    table = result.tables()[0]
    assert table.columns[-3:] == ("band_p05", "band_p50", "band_p95")


def test_job_against_its_baseline(jobs: JobData, jstore: Store) -> None:
    q = CompareJobQuery("job-1", None, ("power_ratio_of_limit", "utilization_gpu_percent"), **jobs.span)
    result = compare_job(jstore, q)
    assert result.backend == "flux"  # a relative feature: a reading over the GPU's limit per point, in Flux
    rows = jobs.where(job="job-1")
    assert len(rows) == ROUNDS + 120
    by_feature = {r.feature: r for r in result.rows}
    assert set(by_feature) == {"power_ratio_of_limit", "utilization_gpu_percent"}
    for feature, r in by_feature.items():
        values = [getattr(x, feature) for x in rows]
        assert (r.application, r.gpu_model, r.samples) == ("llm-pretraining", H100, len(rows))
        assert r.p50 == pytest.approx(expected(values, "p50", "flux"), rel=1e-9)
        assert r.p95 == pytest.approx(expected(values, "p95", "flux"), rel=1e-9)
    power = by_feature["power_ratio_of_limit"]
    assert power.band is not None and (power.band.p05, power.band.p50, power.band.p95) == BANDS[(H100, 2.0)][1:4]
    p50 = power.p50 or 0.0
    assert power.position == ("above band" if p50 > 0.8 else "below band" if p50 < 0.3 else "within band")
    assert by_feature["utilization_gpu_percent"].position == "no baseline"
    assert compare_job(jstore, CompareJobQuery("job-404", None, **jobs.span)).rows == ()


def test_two_gpu_models_on_one_application(jobs: JobData, jstore: Store) -> None:
    features = ("power_ratio_of_limit", "memory_used_ratio")
    q = CompareModelsQuery("llm-pretraining", H100, A100, None, features, jobs.settings.cluster, **jobs.span)
    result = compare_models(jstore, q)
    assert [(r.feature, r.gpu_model) for r in result.rows] == [(f, m) for f in features for m in (H100, A100)]
    for r in result.rows:
        values = [getattr(x, r.feature) for x in jobs.where(application="llm-pretraining", model=r.gpu_model)]
        assert r.samples == len(values) == (ROUNDS + 120 if r.gpu_model == H100 else ROUNDS)
        assert r.mean == pytest.approx(np.mean(values), rel=1e-9)
        for stat in ("p05", "p50", "p95"):
            assert getattr(r, stat) == pytest.approx(expected(values, stat, "influxql"), rel=1e-9), stat
    delta = result.tables()[0].rows[1][-1]
    assert delta == pytest.approx((result.rows[1].p50 or 0) - (result.rows[0].p50 or 0))


def test_most_wasted_capacity(jobs: JobData, jstore: Store) -> None:
    """Wasted: allocated samples of minutes whose peak utilization stayed under the threshold (right-sizing's idle
    minute; a sample stands for its interval, pipeline.usage); GPU-c's utilization never reaches 20, the others'
    peaks do."""
    result = top(jstore, TopQuery("wasted", 10, None, Scope(cluster=jobs.settings.cluster), threshold=20, **jobs.span))
    want = {}
    for g in ("GPU-a", "GPU-b", "GPU-c", "GPU-d"):
        allocated = [r for r in jobs.where(gpu=g) if r.application is not None]
        peaks: dict[int, float] = {}
        for r in allocated:
            peaks[r.ts // MIN] = max(peaks.get(r.ts // MIN, 0.0), r.utilization_gpu_percent)
        low = [r for r in allocated if peaks[r.ts // MIN] < 20]
        if low:
            minutes = [np.mean([r.memory_used_ratio for r in jobs.window(allocated, m * MIN)]) for m in sorted(peaks)]
            want[g] = (len(low) / 3600, len(allocated) / 3600, np.mean(minutes))
    assert "GPU-d" not in want  # idle but never allocated: not waste
    assert "GPU-c" in want  # the test can tell waste from work
    assert [r.gpu for r in result.rows] == sorted(want, key=lambda g: (-want[g][0], g))
    for r in result.rows:
        hours, allocated, memory = want[r.gpu]
        assert r.values[0] == pytest.approx(hours) and r.values[1] == pytest.approx(allocated)
        assert r.values[2] == pytest.approx(hours / allocated) and r.values[3] == pytest.approx(memory, rel=1e-9)


def test_most_xids(jobs: JobData, jstore: Store) -> None:
    result = top(jstore, TopQuery("xid", 5, None, Scope(cluster=jobs.settings.cluster), **jobs.span))
    assert [(r.gpu, r.values) for r in result.rows] == [("GPU-a", (3.0, "79x2 48x1")), ("GPU-c", (1.0, "13x1"))]
    scoped = top(jstore, TopQuery("xid", 5, None, Scope(cluster=jobs.settings.cluster, gpu_model=A100), **jobs.span))
    assert [r.gpu for r in scoped.rows] == ["GPU-c"]  # gpu_event has no model tag: resolved through gpu


@pytest.mark.parametrize("scope", [Scope(), Scope(job="job-1"), Scope(gpu_model=H100), Scope(node="n1")])
def test_anomaly_history(jobs: JobData, jstore: Store, scope: Scope) -> None:
    scoped = Scope(cluster=jobs.settings.cluster, job=scope.job, gpu_model=scope.gpu_model, node=scope.node)
    history = anomalies(jstore, AnomalyQuery(None, "1m", scoped, **jobs.span))
    rows = [
        r for r in jobs.rows
        if (scope.job is None or r.job == scope.job) and (scope.gpu_model is None or r.model == scope.gpu_model)
        and (scope.node is None or r.gpu in ("GPU-c", "GPU-d"))
    ]  # fmt: skip
    want = [
        (t, len(w), sum(r.verdict == "unusual" for r in w), sum(r.verdict == "anomalous" for r in w))
        for t in range(jobs.start_ns, jobs.start_ns + 3 * MIN, MIN)
        if (w := jobs.window(rows, t))
    ]
    assert [(w.time_ns, w.samples, w.unusual, w.anomalous) for w in history.windows] == want
    findings = [
        f for f in jobs.findings
        if (scope.job is None or (f.workload and f.workload.job_id == scope.job))
        and (scope.gpu_model is None or f.gpu_model == scope.gpu_model) and (scope.node is None or f.node == scope.node)
    ]  # fmt: skip
    findings.sort(key=lambda f: -f.ts_ns)
    assert [(h.time_ns, h.detector, h.active, h.summary, h.since_ns, h.gpu) for h in history.findings] == [
        (f.ts_ns, f.detector, f.active, f.summary, f.since_ns, f.gpu_uuid) for f in findings
    ]


def test_http_api_answers_like_the_query_layer(jobs: JobData, jstore: Store) -> None:
    cluster, span = jobs.settings.cluster, f"start={jobs.span['start']}&stop={jobs.span['stop']}"
    token = "integration-token"
    with serving(create_app(jobs.settings, jstore)) as url:
        assert get_json(f"{url}/api/v1/trend?cluster={cluster}&{span}")[0] == 401
        status, doc = get_json(
            f"{url}/api/v1/trend?field=power_watts&by=gpu&every=1m&fn=p95&cluster={cluster}&job=job-1&{span}", token
        )
        assert status == 200
        direct = trend(
            jstore,
            TrendQuery("power_watts", "gpu", "1m", None, "p95", Scope(cluster=cluster, job="job-1"), **jobs.span),
        )
        assert [(r["time"], r["gpu"], r["p95(power_watts)"]) for r in doc["rows"]] == [
            (iso(r.time_ns), r.group[0], r.value) for r in direct.rows
        ]
        status, ctype, text = get(f"{url}/api/v1/top/xid?cluster={cluster}&{span}&format=csv", token)
        assert (status, ctype) == (200, "text/csv")
        assert [(r["gpu"], r["xids"]) for r in csv.DictReader(io.StringIO(text))] == [
            ("GPU-a", "3.0"),
            ("GPU-c", "1.0"),
        ]
        status, doc = get_json(f"{url}/api/v1/compare/job?job=job-1&feature=power_ratio_of_limit&{span}", token)
        assert status == 200 and doc["rows"][0]["base_p50"] == BANDS[(H100, 2.0)][2]
        status, doc = get_json(
            f"{url}/api/v1/compare/models?application=llm-pretraining&a={H100}&b={A100}&cluster={cluster}&{span}"
            .replace(" ", "%20"), token)  # fmt: skip
        assert status == 200 and {r["gpu_model"] for r in doc["rows"]} == {H100, A100}
        status, doc = get_json(f"{url}/api/v1/anomalies?cluster={cluster}&every=1m&{span}", token)
        assert status == 200 and [d["title"].split(" ")[0] for d in doc] == ["verdicts", "findings"]
        assert len(doc[1]["rows"]) == len(jobs.findings)
        status, doc = get_json(f"{url}/api/v1/trend?field=gpu_temp&{span}", token)
        assert status == 400 and doc == {"error": "field 'gpu_temp' is not a stored reading"}


# ---- one GPU-hour, and wasted capacity over the rollups at a fleet's size -------------------------------------


def _bucket_named(settings: Settings, name: str) -> None:
    i = settings.influxdb
    assert i.token is not None
    with InfluxDBClient(url=i.url, token=i.token.get_secret_value(), org=i.org) as client:
        if client.buckets_api().find_bucket_by_name(name) is None:
            client.buckets_api().create_bucket(bucket_name=name, org=i.org)


def test_one_gpu_hour_in_jobs_rightsize_and_top_wasted(jobs: JobData, jstore: Store) -> None:
    """The same stored rows give the same GPU-hours in the job summaries (the jobs bucket's task, run over the
    range), right-sizing's usage and top wasted's allocated hours; and that is each job's samples times their
    interval, computed here from the rows (pipeline.usage: the one definition)."""
    from sinks.influxdb.schema import JOB_FIELDS
    from sinks.query.flux import jobs_range_flux
    from sinks.query.jobs import job_summaries
    from sinks.query.model import JobsQuery
    from sinks.query.usage import UsageQuery, usage

    settings, cluster = jobs.settings, jobs.settings.cluster
    ten = 10 * MIN
    lo, hi = jobs.start_ns // ten * ten, -(-(jobs.start_ns + 3 * MIN) // ten) * ten
    _bucket_named(settings, jstore.buckets.jobs)
    jstore.flux_records(jobs_range_flux(jstore.buckets.raw, jstore.buckets.jobs, settings.influxdb.org, JOB_FIELDS,
                                        settings.sample_interval_s, lo, hi))  # fmt: skip
    want: dict[str, float] = {}
    for job in {r.job for r in jobs.rows if r.job}:
        want[job] = len([r for r in jobs.rows if r.job == job]) / 3600  # samples of 1 s
    assert len(want) == 3 and all(v > 0 for v in want.values())

    summaries = job_summaries(jstore, JobsQuery(None, Scope(cluster=cluster), start=iso(lo), stop=iso(hi)))
    from_jobs: dict[str, float] = defaultdict(float)
    for s in summaries.rows:
        from_jobs[s.job] += s.gpu_hours
    sized = usage(settings, UsageQuery(None, cluster=cluster, **jobs.span))
    from_rightsize = {u.key: u.gpu_hours for u in sized}
    wasted = top(jstore, TopQuery("wasted", 10, None, Scope(cluster=cluster), threshold=100, **jobs.span))
    allocated = {r.gpu: r.values[1] for r in wasted.rows}
    assert from_jobs == pytest.approx(want) and from_rightsize == pytest.approx(want)
    # top wasted is per GPU: GPU-c ran job-2 alone, GPU-a job-1 alone (GPU-b ran job-1, then job-3)
    for gpu in ("GPU-a", "GPU-c"):
        if gpu in allocated:
            mine = [r for r in jobs.rows if r.gpu == gpu and r.job]
            assert allocated[gpu] == pytest.approx(len(mine) / 3600)
    assert "GPU-c" in allocated  # util under 20 throughout: some minute's peak is under 100
    assert sum(allocated.values()) == pytest.approx(
        sum(len([r for r in jobs.rows if r.gpu == g and r.job]) / 3600 for g in allocated)
    )


#: the fleet and span of the rollup read: a thousand GPUs, a day of minutes
FLEET_GPUS, FLEET_MINUTES = 1000, 1440


def _rollup_minutes(
    tags: list[str], minute_ms: int, util: np.ndarray, memory: np.ndarray, n: float = 60.0
) -> list[str]:
    """One minute of every GPU (``n`` samples each) as the sink's rollups write it, trimmed to the fields top wasted
    reads (a minute's peak utilization and samples, mean memory ratio; InfluxDB stores each field apart, so the
    others cost this read nothing): formatting all 60 fields of 1.44 M points took the test 200 s on 2 cores."""
    return [
        f"gpu,{t} utilization_gpu_percent_max={u!r},utilization_gpu_percent_count={n!r},memory_used_ratio_mean={m!r} "
        f"{minute_ms}"
        for t, u, m in zip(tags, util.tolist(), memory.tolist(), strict=True)
    ]


def test_top_wasted_over_a_day_of_a_thousand_gpus_reads_the_rollups_in_time(
    kafka_server: kafka.KafkaProcess, influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> None:
    """1,000 GPUs x 1 day of 1-minute rollups (1.44 M points, in the shape the sink's own rollup code writes them,
    checked on a minute of it) written by the sink's writer: top wasted answers from the rollups well inside the
    30 s read timeout, with the wasted and allocated GPU-hours computed here from the same minutes (a tenth of the
    GPUs idle: not allocated)."""
    from sinks.influxdb.rollup import rollup_rows
    from sinks.influxdb.schema import ROLLUP_FIELDS

    settings = query_settings(kafka_server, influx_server, defaults, tmp_path, bucket=own_bucket(influx_server))
    _bucket_named(settings, f"{settings.influxdb.bucket}_1m")
    rng = np.random.default_rng(37)
    start = (time.time_ns() // MIN - FLEET_MINUTES - 3) * MIN
    gpus = [f"GPU-{g:04d}" for g in range(FLEET_GPUS)]
    apps = ["idle" if g % 10 == 0 else "llm-pretraining" for g in range(FLEET_GPUS)]
    tags = [f"cluster={settings.cluster},gpu={u},gpu_index={g % 8},gpu_model={H100.replace(' ', chr(92) + ' ')},"
            f"node=n{g // 8:03d},application={apps[g]}" for g, u in enumerate(gpus)]  # fmt: skip
    # per GPU a share of quiet minutes of its own (peak utilization 0-4 %), busy ones above the threshold
    quiet_share = rng.uniform(0.0, 0.6, FLEET_GPUS)
    util = np.where(rng.random((FLEET_MINUTES, FLEET_GPUS)) < quiet_share, rng.integers(0, 5, (FLEET_MINUTES,
                    FLEET_GPUS)), rng.integers(5, 101, (FLEET_MINUTES, FLEET_GPUS))).astype(float)  # fmt: skip
    memory = rng.uniform(0.0, 1.0, (FLEET_MINUTES, FLEET_GPUS))
    # the shape is the rollup code's: its line for the first minute carries these tags, fields and values
    values = np.full((FLEET_GPUS, len(ROLLUP_FIELDS)), np.nan)
    values[:, ROLLUP_FIELDS.index("utilization_gpu_percent")] = util[0]
    values[:, ROLLUP_FIELDS.index("memory_used_ratio")] = memory[0]
    ts = np.full(FLEET_GPUS, start + 7 * NS, dtype=np.int64)
    made = rollup_rows(tags, ts, values, np.full(FLEET_GPUS, np.nan), np.zeros(FLEET_GPUS, np.int8))
    ours = _rollup_minutes(tags, start // 10**6, util[0], memory[0], n=1.0)  # one row each: one sample
    for line, mine in zip(made, ours, strict=True):
        rest, stamp = line.rsplit(" ", 1)
        head, fields = rest.rsplit(" ", 1)  # tags hold escaped spaces, fields none
        kept = ",".join(f for f in fields.split(",") if f.split("=")[0] in mine)
        assert f"{head} {kept} {stamp}" == mine
    rollups = settings.influxdb.model_copy(update={"bucket": f"{settings.influxdb.bucket}_1m", "timeout_s": 60.0})
    writers = [InfluxWriter.from_settings(rollups) for _ in range(2)]
    began = time.monotonic()
    with ThreadPoolExecutor(2) as pool:  # two requests in flight: influxd parses one while it stores the other
        done = []
        for i, first in enumerate(range(0, FLEET_MINUTES, 50)):  # requests of 50,000 points
            lines = []
            for m in range(first, min(first + 50, FLEET_MINUTES)):
                lines += _rollup_minutes(tags, (start + m * MIN) // 10**6, util[m], memory[m])
            done.append(pool.submit(writers[i % 2].write, lines))
            if len(done) > 2:  # at most two requests' lines held at once
                done.pop(0).result()
        for f in done:
            f.result()
    for w in writers:
        w.close()
    written_s = time.monotonic() - began

    with Store.from_settings(settings) as store:
        asked = TopQuery("wasted", 1000, None, Scope(cluster=settings.cluster), start=iso(start),
                         stop=iso(start + FLEET_MINUTES * MIN))  # fmt: skip
        began = time.monotonic()
        result = top(store, asked)
        took_s = time.monotonic() - began
    assert result.source == "1m", result.source
    assert took_s < 30, f"top wasted took {took_s:.1f} s over the rollups (writing them took {written_s:.0f} s)"
    allocated = [g for g in range(FLEET_GPUS) if apps[g] != "idle"]
    want = {gpus[g]: ((util[:, g] < 5).sum() / 60, FLEET_MINUTES / 60) for g in allocated if (util[:, g] < 5).any()}
    got = {r.gpu: (r.values[0], r.values[1]) for r in result.rows}
    assert set(got) == set(want) and len(got) > 800
    for gpu, (wasted, held) in want.items():
        assert got[gpu] == pytest.approx((wasted, held)), gpu
    assert [r.gpu for r in result.rows][:10] == sorted(want, key=lambda g: (-want[g][0], g))[:10]
    print(f"top wasted over {FLEET_GPUS} GPUs x {FLEET_MINUTES} rollup minutes: {took_s:.2f} s "
          f"(writing {FLEET_GPUS * FLEET_MINUTES} points took {written_s:.1f} s)")  # fmt: skip
