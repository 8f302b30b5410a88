"""The whole loop on imported history, in one test, on real servers and the real processor and sink: the nanoGPT
PR #643 trace is imported, `hermeneut baselines train` learns from that range, the running processor takes the new
version up, the trace is imported again (--restart) and judged against it, and `anomalies`, `rightsize` and the
dashboard's job, GPU and right-sizing views answer for the imported range."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pipeline.config import Settings
from pipeline.face.cli import cli
from pipeline.face.importjob import run_import
from pipeline.face.rightsizing import advise_and_gaps
from pipeline.face.web.app import create_app, serving
from pipeline.services.stages import Stage, wait_for
from sinks.query import AnomalyQuery, Scope, Store, anomalies
from sinks.query.output import iso
from sinks.retention import setup
from tests import TESTDATA
from tests.webserver import get_json

from .conftest import InfluxServer, KafkaServer
from .harness import running_pipeline, stored_points
from .test_import import accounted, import_settings

pytestmark = pytest.mark.integration

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
TRACE = NANOGPT / "gpu_metrics_f4f827dd.csv"
OPTIONS = {"paths": (TRACE,), "mapping": NANOGPT / "mapping.toml"}
JOB = "nanogpt-pr643"


@pytest.fixture
def pipeline(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> Iterator[tuple[Settings, Stage]]:
    s = import_settings(kafka_server, influx_server, defaults, tmp_path / "state")
    setup(s)
    with running_pipeline(s, tmp_path / "pipeline") as (processor, _sink):
        yield s, processor


def test_import_train_judge_and_ask_about_the_imported_range(pipeline: tuple[Settings, Stage]) -> None:
    settings, processor = pipeline
    first = run_import(settings, "table", OPTIONS, (TRACE, OPTIONS["mapping"]), pipeline=False, progress=False)
    accounted(first)
    r = first.report
    start, stop = iso(r.first_ns), iso(r.last_ns + 10**9)
    assert {p["verdict"] for p in stored_points(settings)} == {"unscored"}  # nothing learned yet

    trained = CliRunner().invoke(
        cli, ["baselines", "train", "--range", "5m", "--stop", stop, "--min-samples", "100",
              "--cluster", settings.cluster], obj={"settings": settings}, catch_exceptions=False,
    )  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert "llm-pretraining" in trained.output and "published version 1" in trained.output
    assert wait_for(lambda: processor.stats().get("baselines_version") == 1, 60), processor.stats()

    again = run_import(settings, "table", OPTIONS, (TRACE, OPTIONS["mapping"]), pipeline=False, progress=False,
                       restart=True)  # fmt: skip
    accounted(again)
    points = stored_points(settings)
    assert len(points) == 6240
    verdicts = {p["verdict"] for p in points}
    assert "unscored" not in verdicts and "normal" in verdicts  # judged against what was learned from it

    with Store.from_settings(settings) as store:
        history = anomalies(store, AnomalyQuery(None, "1m", Scope(cluster=settings.cluster), start=start, stop=stop))
    assert sum(w.samples for w in history.windows) == 6240
    judged = {v: sum(p["verdict"] == v for p in points) for v in ("unusual", "anomalous")}
    assert sum(w.unusual for w in history.windows) == judged["unusual"]
    assert sum(w.anomalous for w in history.windows) == judged["anomalous"]

    # the trace has utilization, power and temperature but no memory: right-sizing, which sizes memory first,
    # says that it cannot size this job, and for how many GPU-minutes, instead of guessing
    advice, gaps = advise_and_gaps(settings, None, job=JOB, cluster=settings.cluster, start=start, stop=stop)
    with TRACE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    minutes = {(r["gpu_index"], np.datetime64(r["timestamp"].rstrip("Z"), "m")) for r in rows}
    assert advice == [] and gaps == {JOB: len(minutes)}
    sized = CliRunner().invoke(cli, ["rightsize", "--job", JOB, "--start", start, "--stop", stop],
                               obj={"settings": settings}, catch_exceptions=False)  # fmt: skip
    assert f"{JOB}: {len(minutes)} GPU-minutes with utilization but no memory reading: not sized" in sized.output

    window = f"start={start}&stop={stop}"
    with serving(create_app(settings)) as url:
        status, job = get_json(f"{url}/api/v1/jobs/{JOB}/history?{window}")
        assert status == 200 and len(job["gpus"]) == 8 and len(job["series"]) == 8
        assert job["from_ms"] <= r.first_ns // 10**6 < job["to_ms"]
        status, gpu = get_json(f"{url}/api/v1/gpus/g150-gpu1/history?{window}")
        assert status == 200 and gpu["series"]["power_ratio_of_limit"]  # the limit from the catalogue
        status, sizing = get_json(f"{url}/api/v1/rightsizing?{window}")
        assert status == 200 and sizing["items"] == []  # nothing sized, as above
