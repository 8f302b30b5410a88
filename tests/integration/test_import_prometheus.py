"""The Prometheus importer against a real Prometheus (Debian's, started by pipeline/services/prometheus.py) holding
real readings: nanoGPT PR #643's 8xH100 series (utilization, power, temperature every ~0.33 s) as the dcgm-exporter
series they are (DCGM_FI_DEV_GPU_UTIL, _POWER_USAGE, _GPU_TEMP), and NVIDIA's A100 scrape with a MIG instance, loaded
as TSDB blocks with promtool. Imported as stored (each sample at its own time: the 0.33 s interval detected) and on
15/30/60 s grids; every time the stored samples are the rows read minus the dead-lettered, and GPU-hours and idle
time are what numpy computes from the same file on the same grid."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import Settings
from pipeline.services import prometheus
from sinks.query import JobsQuery, Scope, Store, TopQuery, job_summaries, top
from sinks.query.output import iso
from sinks.retention import setup
from tests import TESTDATA

from .conftest import InfluxServer, KafkaServer
from .harness import running_pipeline, stored_points
from .test_import import accounted, idle_minute_samples, import_settings, imported

pytestmark = pytest.mark.integration

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries" / "gpu_metrics_f4f827dd.csv"
MIG_SCRAPE = TESTDATA / "dcgm-exporter-nvidia-cloud-native-docs" / "a100_mig_dcgm_exporter_scrape.prom"
#: the time the A100 scrape (which has none) is loaded at
MIG_AT = "2025-09-24T03:50:00Z"
#: the labels the trace's series carry: the identity the mapping file gives it, and its job as Kubernetes would name it
LABELS = 'Hostname="g150",modelName="NVIDIA H100 80GB HBM3",namespace="nanogpt",pod="train-pr643"'
COLUMNS = {"DCGM_FI_DEV_GPU_UTIL": "utilization_gpu_percent", "DCGM_FI_DEV_POWER_USAGE": "power_W",
           "DCGM_FI_DEV_GPU_TEMP": "temperature_C"}  # fmt: skip
S = 10**9


def trace() -> list[dict[str, str]]:
    with NANOGPT.open(newline="") as f:
        return list(csv.DictReader(f))


def seconds(iso_time: str) -> float:
    return float(np.datetime64(iso_time.rstrip("Z"), "ns").astype(np.int64)) / 1e9


def openmetrics(path: Path) -> None:
    """The readings as OpenMetrics with their timestamps (one family after another, each series in time order)."""
    rows = trace()
    lines = []
    for metric, column in COLUMNS.items():
        lines.append(f"# TYPE {metric} gauge")
        for gpu in range(8):
            for r in rows:
                if int(r["gpu_index"]) == gpu:
                    labels = f'gpu="{gpu}",UUID="g150-gpu{gpu}",{LABELS}'
                    lines.append(f"{metric}{{{labels}}} {r[column].strip()} {seconds(r['timestamp']):.3f}")
    stamp = f"{seconds(MIG_AT):.3f}"
    by_name: dict[str, list[str]] = {}
    for line in MIG_SCRAPE.read_text().splitlines():
        if line.strip():
            by_name.setdefault(line.split("{", 1)[0], []).append(f"{line.strip()} {stamp}")
    for name, samples in by_name.items():
        lines += [f"# TYPE {name} gauge", *samples]
    path.write_text("\n".join([*lines, "# EOF"]) + "\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    run_dir = tmp_path_factory.mktemp("prometheus")
    openmetrics(run_dir / "history.om")
    prometheus.create_blocks(run_dir / "history.om", run_dir)
    proc = prometheus.start(run_dir)
    yield proc.url
    proc.stop()


@pytest.fixture(scope="module")
def settings(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    s = import_settings(kafka_server, influx_server, defaults, tmp_path_factory.mktemp("prom-state"))
    setup(s)
    with running_pipeline(s, tmp_path_factory.mktemp("prom-pipeline")):
        yield s


def window() -> tuple[str, str]:
    rows = trace()
    first, last = seconds(rows[0]["timestamp"]), seconds(rows[-1]["timestamp"])
    return iso(int(first) * S), iso((int(last) + 1) * S)


def test_samples_as_stored_keep_their_times_and_the_mig_instance(server: str, settings: Settings) -> None:
    start, _ = window()
    options = {"url": server, "start": start, "end": "2025-09-24T03:51:00Z", "application": "llm-pretraining",
               "node": "prometheus"}  # fmt: skip
    outcome = imported(settings, "prometheus", options, ())
    accounted(outcome)
    r = outcome.report
    assert outcome.stored == r.rows_read == 6240 + 2 and outcome.dead_total == 0  # the trace, the A100 and its MIG
    points = stored_points(settings)
    nanogpt = [p for p in points if p["node"] == "g150"]
    assert len(nanogpt) == 6240 and {p["job_id"] for p in nanogpt} == {"nanogpt/train-pr643"}
    rows = trace()
    first = min(round(seconds(x["timestamp"]) * 1000) for x in rows)
    assert min(int(p["_time"].timestamp() * 1000) for p in nanogpt) == first  # the original times, to the ms
    assert {round(v, 3) for k, v in r.intervals.items() if k.startswith("g150/")} == {0.331}
    a100 = {p["gpu"]: p for p in points if p["node"] == "ub20-a100-k8s"}
    mig = next(p for u, p in a100.items() if u.startswith("MIG-"))
    assert mig["gpu_model"].endswith("MIG 1g.5gb") and len(a100) == 2


@pytest.mark.parametrize("step_s", [15, 30, 60])
def test_a_regular_grid_gives_gpu_hours_and_idle_time_as_numpy_does(
    server: str, settings: Settings, step_s: int
) -> None:
    start, end = window()
    cluster = f"{settings.cluster}-s{step_s}"
    options = {"url": server, "start": start, "end": end, "step": f"{step_s}s", "selector": '{Hostname="g150"}',
               "application": "llm-pretraining", "cluster": cluster}  # fmt: skip
    outcome = imported(settings, "prometheus", options, ())
    accounted(outcome)
    r = outcome.report
    assert set(r.intervals.values()) == {float(step_s)}  # detected from the grid: no setting given
    # numpy on the same file: at each grid time, the last sample of the step before it (if any)
    grid = np.arange(seconds(start), seconds(end), step_s)
    rows = trace()
    n_points, idle_points = 0, 0
    for gpu in range(8):
        mine = [x for x in rows if int(x["gpu_index"]) == gpu]
        ts = np.array([seconds(x["timestamp"]) for x in mine])
        util = np.array([float(x["utilization_gpu_percent"]) for x in mine])
        last = np.searchsorted(ts, grid, side="right") - 1
        taken = (last >= 0) & (ts[np.maximum(last, 0)] > grid - step_s)
        n_points += int(taken.sum())
        # top wasted counts the samples of minutes whose peak stays under the threshold (docs/queries.md)
        grid_ns = np.round(grid[taken] * 1e9).astype(np.int64)
        idle_points += idle_minute_samples(grid_ns, util[last[taken]], 10.0)
    assert r.rows_read == outcome.stored == n_points
    with Store.from_settings(settings) as store:
        (job,) = job_summaries(store, JobsQuery(None, Scope(cluster=cluster), start, end)).rows
        wasted = top(store, TopQuery("wasted", 20, None, Scope(cluster=cluster), threshold=10.0, start=start, stop=end))
    assert job.gpu_hours == pytest.approx(n_points * step_s / 3600, rel=1e-9)
    assert sum(float(row.values[0] or 0) for row in wasted.rows) == pytest.approx(idle_points * step_s / 3600)
