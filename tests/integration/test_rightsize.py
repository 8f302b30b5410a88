"""Right-sizing reads on a real InfluxDB: usage statistics per job and application from points written in the
sink's own line protocol, and ``hermeneut rightsize`` end to end."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.config import Settings
from pipeline.events import GpuSample, InterpretedBatch, InterpretedEvent, Workload
from pipeline.face.cli import cli
from sinks.influxdb.lines import InfoTracker, batch_lines
from sinks.influxdb.write import InfluxWriter
from sinks.query.usage import UsageQuery, link_throughput, usage

pytestmark = pytest.mark.integration

S = 1_000_000_000
GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"


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
    # 30 minutes of samples on 2 GPUs -> 30 or 31 GPU-minutes each (minute boundaries)
    assert 59 / 60 <= small.gpu_hours <= 62 / 60
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
