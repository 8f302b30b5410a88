"""Right-sizing reads on a real InfluxDB: usage statistics per job and application from points written in the
sink's own line protocol, and ``hermeneut rightsize`` end to end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.jobs.importjob import run_import
from hermeneut.web.app import create_app, serving
from pipeline.config import Settings
from pipeline.events import GpuSample, InterpretedBatch, InterpretedEvent, Workload
from pipeline.publisher import Publisher
from pipeline.services.stages import wait_for
from producers.agent import NodeAgent
from producers.simulator import Fleet
from producers.simulator.source import SimulatorSource
from sinks.influxdb.lines import InfoTracker, batch_lines
from sinks.influxdb.write import InfluxWriter
from sinks.query.output import iso
from sinks.query.usage import UsageQuery, link_throughput, usage
from sinks.retention import setup
from tests import TESTDATA
from tests.webserver import get_json

from .conftest import InfluxServer, KafkaServer
from .harness import running_pipeline, stored_points
from .test_import import import_settings

pytestmark = pytest.mark.integration

S = 1_000_000_000
GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"
#: the nvidia-smi captures' uuid, masked alike in every file (tests/testdata/nvidia-smi-csv/README.md)
MASKED = "GPU-00000000-0000-0000-0000-000000000000"


def write_history(settings: Settings) -> int:
    """30 minutes at one sample per 10 s: job small-1 (2 GPUs, ~6 GiB, 10% SM active) and big-2 (1 GPU, busy)."""
    start = time.time_ns() - 40 * 60 * S
    rng = np.random.default_rng(0)
    events = []
    for k in range(180):
        ts = start + k * 10 * S
        for gpu, job, app in (("G0", "small-1", "llm-serving"), ("G1", "small-1", "llm-serving"),
                              ("G2", "big-2", "llm-pretraining")):  # fmt: skip
            small = job == "small-1"
            metrics = {
                "memory_used_bytes": float((5 + (k % 10) / 10) * GIB if small else 70 * GIB),
                "memory_total_bytes": 80.0 * GIB,
                "power_limit_watts": 700.0,
                "utilization_gpu_percent": float(25 + rng.integers(0, 5) if small else 97),
                "sm_active_percent": float(8 + rng.integers(0, 3) if small else 90),
                "power_watts": float(150 if small else 650),
                "nvlink_tx_bytes_per_second": 0.0 if small else 200e9,
                "pcie_tx_bytes_per_second": 1e9,
                # as the collector stamps its samples: each stands for 10 s of GPU time (pipeline.usage)
                "sample_interval_seconds": 10.0,
            }
            sample = GpuSample(settings.cluster, "n1", gpu, int(gpu[1]), H100, ts, metrics)
            wl = Workload(app, job_id=job, source="test", job_gpus=2 if small else 1)
            events.append(InterpretedEvent(sample, workload=wl))
    batch = InterpretedBatch.from_events(events)
    writer = InfluxWriter.from_settings(settings.influxdb)
    try:
        writer.write(batch_lines([batch], InfoTracker()))
    finally:
        writer.close()
    return len(events)


def test_usage_statistics_and_advice(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    write_history(settings)
    query = UsageQuery("2h", cluster=settings.cluster)
    jobs = {u.key: u for u in usage(settings, query)}
    assert set(jobs) == {"small-1", "big-2"}
    small = jobs["small-1"]
    assert small.gpus == 2 and small.application == "llm-serving" and small.gpu_model == H100
    # 180 samples of 10 s on each of 2 GPUs: 1 GPU-hour
    assert small.gpu_hours == pytest.approx(1.0)
    assert small.memory_peak_bytes == pytest.approx(5.9 * GIB) and small.memory_total_bytes == 80 * GIB
    assert small.sm_active_p95_percent == pytest.approx(10.0) and small.power_p95_watts == 150
    (app,) = usage(settings, UsageQuery("2h", application="llm-pretraining", cluster=settings.cluster))
    assert app.key == "llm-pretraining" and app.runs == 1 and app.memory_peak_bytes == 70 * GIB
    speeds = {t.gpu_model: t for t in link_throughput(settings, UsageQuery("2h", cluster=settings.cluster))}
    assert speeds[H100].nvlink_bytes_per_second == 200e9

    i = settings.influxdb
    assert i.url and i.token
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", i.url)
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", i.token.get_secret_value())
    monkeypatch.setenv("HERMENEUT_INFLUXDB__ORG", i.org)
    monkeypatch.setenv("HERMENEUT_INFLUXDB__BUCKET", i.bucket)
    args = ["rightsize", "--job", "small-1", "--range", "2h", "--format", "json", "--cluster", settings.cluster]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    (advice,) = json.loads(result.output)
    assert advice["options"][0]["kind"] == "mig" and advice["options"][0]["target"] == "1g.10gb"
    assert advice["wasted_gpu_hours"] > 0.8
    table = CliRunner().invoke(cli, ["rightsize", "--range", "2h", "--cluster", settings.cluster])
    assert table.exit_code == 0 and "big-2" in table.output and "keep" in table.output


# --- the three sizing questions on the simulator and on imported real history (issue 43) ---------------------------


@pytest.fixture
def pipeline(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> Iterator[Settings]:
    """Topics, buckets and a running processor and sink of the test's own (the processor labels rows with their
    context, which right-sizing groups jobs by)."""
    s = import_settings(kafka_server, influx_server, defaults, tmp_path / "state")
    setup(s)
    with running_pipeline(s, tmp_path / "pipeline"):
        yield s


def _answered(advice: list[dict[str, Any]]) -> None:
    """Every job has the three answers, and nothing is printed as a GPU-hour saving that is not one."""
    for a in advice:
        q = a["answers"]
        assert q["smallest"] and q["smallest_detail"], a["summary"]
        assert q["splits"] or q["cost_note"], a["summary"]
        for cost in q["costs"]:
            assert cost["total_s"] == pytest.approx(cost["transfer_s"] + cost["latency_s"] + cost["overhead_s"])
        for o in a["options"]:
            if o["kind"] in ("split", "smaller-gpu"):
                assert o["saved_gpu_hours"] <= 0 and "saves" not in o["detail"], o


def test_the_three_questions_on_the_simulator_with_the_probes_facts(pipeline: Settings) -> None:
    settings = pipeline
    fleet = Fleet(2, 4, cluster=settings.cluster, seed=3)
    publisher = Publisher(settings.kafka.client_config())
    report = NodeAgent(SimulatorSource.of(fleet), publisher, settings.topics, 10.0).run(
        threading.Event(), 0.0, fast_forward_s=600
    )
    assert publisher.stats.failed == 0 and report.contexts > 0 and report.topologies == 2
    assert wait_for(lambda: len(stored_points(settings)) >= report.samples, 120), len(stored_points(settings))

    # the probe on a node (the host path here: no GPU in CI) puts its figures on the node's topology
    obj = {"settings": settings}
    node = fleet.nodes[0]
    probed = CliRunner().invoke(cli, ["probe", "links", "--backend", "host", "--node", node, "--repeats", "3"],
                                obj=obj, catch_exceptions=False)  # fmt: skip
    assert probed.exit_code == 0 and f"published 1 link timings on {settings.topics.topology}" in probed.output
    from hermeneut.views.health import node_topologies

    mine = {t.node: t for t in node_topologies(settings) if t.cluster == settings.cluster}
    assert len(mine[node].link_timings) == 1 and len(mine[node].gpus) == 4  # merged into the collector's topology

    args = ["rightsize", "--range", "2h", "--cluster", settings.cluster, "--model", "llama3-8b", "--tokens", "256"]
    result = CliRunner().invoke(cli, [*args, "--format", "json"], obj=obj, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    advice = json.loads(result.output)
    jobs = {c.workload.job_id for c in fleet.contexts(time.time_ns()) if c.workload and c.workload.job_id}
    assert {a["stats"]["key"] for a in advice} <= jobs and advice
    _answered(advice)
    table = CliRunner().invoke(cli, args, obj=obj, catch_exceptions=False)
    assert "1. smallest that holds it:" in table.output and "2. split over smaller GPUs:" in table.output
    # the link kinds come from the fleet's topologies (the simulator's NVLink nodes), published figures for them
    assert "links: link kinds on the fleet: " in table.output and "measured by the probe: none" in table.output
    # the dashboard's view gives the same answers beside each recommendation
    with serving(create_app(settings)) as url:
        status, body = get_json(f"{url}/api/v1/rightsizing?range=2h")
    assert status == 200 and body["items"]
    assert all(i["answers"][0].startswith("1. smallest that holds it: ") for i in body["items"])


def test_the_three_questions_on_imported_real_captures(pipeline: Settings) -> None:
    """Real `nvidia-smi --query-gpu` rows of an H100 under load (19.4 GiB, 100%) and an L40S (1.2 GiB, 9%), each
    declared a job by `hermeneut context set` before it is imported."""
    settings = pipeline
    obj = {"settings": settings}
    files = {"nvidia-h100-80gb-hbm3-load": "h100-serve", "nvidia-l40s-load": "l40s-serve"}
    for node, job in files.items():
        declared = CliRunner().invoke(cli, ["context", "set", "--node", node, "--gpu", MASKED, "--app",
                                            "llm-serving", "--job", job], obj=obj, catch_exceptions=False)  # fmt: skip
        assert declared.exit_code == 0, declared.output
    paths = tuple(TESTDATA / "nvidia-smi-csv" / f"{f}.csv" for f in files)
    outcome = run_import(settings, "nvidia-smi-csv", {"paths": paths}, paths, pipeline=False, progress=False)
    assert outcome.complete and outcome.stored == 2
    assert wait_for(lambda: {p.get("job_id") for p in stored_points(settings)} == set(files.values()), 60)
    start, stop = iso(outcome.report.first_ns - 60 * 10**9), iso(outcome.report.last_ns + 60 * 10**9)
    args = ["rightsize", "--start", start, "--stop", stop, "--cluster", settings.cluster, "--links", "published"]
    result = CliRunner().invoke(cli, [*args, "--format", "json"], obj=obj, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    advice = {a["stats"]["key"]: a for a in json.loads(result.output)}
    assert set(advice) == set(files.values())
    _answered(list(advice.values()))
    h100 = advice["h100-serve"]["answers"]
    # 19,818 MiB x 1.2 = 23.2 GiB: busy, so no MIG slice; an A30 (24 GiB) is the smallest board that holds it, and an
    # A10G (22.5 GiB) would take two; no model dimensions given: the cost is the per-hand-off latency and overhead
    assert h100["smallest"] == "NVIDIA A30" and ["NVIDIA A10G", 2] in h100["splits"]
    assert h100["costs"] == [] and "--model" in h100["cost_note"]
    assert advice["h100-serve"]["options"][0]["kind"] == "keep"
