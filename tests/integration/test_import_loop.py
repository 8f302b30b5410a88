"""The whole loop on imported history, in one test, on real servers and the real processor and sink: the nanoGPT
PR #643 trace is imported, `hermeneut baselines train` learns from that range, the running processor takes the new
version up, the trace is imported again (--restart) and judged against it, and `anomalies`, `rightsize` and the
dashboard's job, GPU and right-sizing views answer for the imported range.

And the README's loop as issue 37 ran it, with the processor that judges live data still running: the same node's
GPUs report live while their history is imported, trained on and imported again, through that one long-lived
processor: every finding is one the data holds (a processor of its own on the trace alone finds the same)."""

from __future__ import annotations

import csv
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer
from playwright.sync_api import Page, expect

from hermeneut.cli import cli
from hermeneut.jobs.importjob import group_members, import_shape, run_import
from hermeneut.views.rightsizing import advise_and_gaps
from hermeneut.web.app import create_app, serving
from pipeline.codec import decode_interpreted, encode_samples
from pipeline.config import Settings
from pipeline.events import METRIC_INDEX, GpuSample, InterpretedBatch, SampleBatch
from pipeline.publisher import Publisher
from pipeline.services.stages import Stage, wait_for
from processors.coverage import blind_detectors
from sinks.query import AnomalyQuery, Scope, Store, anomalies
from sinks.query.output import iso
from sinks.query.store import flux_rows
from sinks.retention import setup
from tests import TESTDATA
from tests.fakes.readings import H100, busy_h100
from tests.webserver import get_json

from .conftest import READY, InfluxServer, KafkaServer
from .harness import running_pipeline, stored_points, wait_settled
from .test_import import accounted, import_settings

pytestmark = pytest.mark.integration

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
TRACE = NANOGPT / "gpu_metrics_f4f827dd.csv"
MAPPING = NANOGPT / "mapping.toml"
OPTIONS = {"paths": (TRACE,), "mapping": MAPPING}
JOB = "nanogpt-pr643"


@pytest.fixture
def pipeline(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> Iterator[tuple[Settings, Stage]]:
    s = import_settings(kafka_server, influx_server, defaults, tmp_path / "state")
    setup(s)
    with running_pipeline(s, tmp_path / "pipeline") as (processor, _sink):
        yield s, processor


def test_import_train_judge_and_ask_about_the_imported_range(pipeline: tuple[Settings, Stage], page: Page) -> None:
    settings, processor = pipeline
    first = run_import(settings, "table", OPTIONS, (TRACE, MAPPING), pipeline=False, progress=False)
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

    again = run_import(settings, "table", OPTIONS, (TRACE, MAPPING), pipeline=False, progress=False,
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
        assert status == 200, job
        assert len(job["gpus"]) == 8 and len(job["series"]) == 8
        assert job["from_ms"] <= r.first_ns // 10**6 < job["to_ms"]
        status, gpu = get_json(f"{url}/api/v1/gpus/g150-gpu1/history?{window}")
        assert status == 200 and gpu["series"]["power_ratio_of_limit"]  # the limit from the catalogue
        status, sizing = get_json(f"{url}/api/v1/rightsizing?{window}")
        assert status == 200 and sizing["items"] == []  # nothing sized, as above
    # the views of the imported range name the detectors its readings cannot feed, as the import's summary did (but
    # for the XID detectors: a range without an XID says nothing of whether its source could send them)
    blind = blind_detectors(r.columns, dataclasses.replace(import_shape(r), events=True))
    named = {d for d, _ in blind}
    assert {"thermal-throttling", "memory-leak", "power-capping"} <= named and not {"straggler", "xid"} & named
    for view in (job, gpu):
        assert [(c["detector"], c["why"]) for c in view["cannot_see"]] == blind, view["cannot_see"]
    with serving(create_app(settings)) as url:  # and the views show them (Chromium)
        for hash_ in (f"/job/{JOB}?{window}", f"/gpu/g150-gpu1?{window}"):
            page.goto(f"{url}/#{hash_}")
            page.wait_for_function(READY, timeout=60_000)
            listed = page.locator("[data-testid=cannot-see] li")
            expect(listed).to_have_count(len(blind))
            assert [listed.nth(i).get_attribute("data-detector") for i in range(len(blind))] == [d for d, _ in blind]
        page.goto("about:blank")  # the live view's event stream ends before the server stops


def _findings(settings: Settings) -> list[tuple[str, str, int]]:
    """Every finding start stored for the test's cluster: (detector, GPU, since in ns), in time order."""
    [rows] = flux_rows(
        settings,
        f'from(bucket: "{settings.influxdb.bucket}") |> range(start: 0) '
        f'|> filter(fn: (r) => r._measurement == "finding" and r.cluster == "{settings.cluster}") '
        '|> filter(fn: (r) => r._field == "since_ns") |> group()',
    )
    return sorted({(str(r["detector"]), str(r["gpu"]), int(r["_value"]) // 10**6 * 10**6) for r in rows},
                  key=lambda f: f[2])  # fmt: skip


def _live(settings: Settings, stop: threading.Event, rounds: list[int]) -> None:
    """The imported node's 8 GPUs reporting live, a round a second (healthy, busy), until ``stop``."""
    rng = np.random.default_rng(0)
    publisher = Publisher(settings.kafka.client_config())
    try:
        while not stop.is_set():
            ts = time.time_ns()
            samples = tuple(
                GpuSample(settings.cluster, "g150", f"g150-gpu{i}", i, H100, ts, busy_h100(rng)) for i in range(8)
            )
            batch = SampleBatch(settings.cluster, "g150", samples)
            publisher.publish(settings.topics.raw, batch.kafka_key, encode_samples(batch))
            publisher.poll(0)
            rounds.append(ts)
            stop.wait(1.0)
    finally:
        assert publisher.close(30) == 0


def test_the_readme_loop_with_a_live_processor_finds_only_what_the_data_holds(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> None:
    """Issue 37: with the main job's processor running, import, train, import again (--restart) made 67 healthy
    GPUs 'silent for 40755 s while the node's other GPUs keep reporting'. Here one processor judges the node live
    (a round a second) and its history interleaved on the same partition, twice: it finds what a processor of its
    own finds on the trace alone, no GPU off the bus, and the second import stores the same verdicts as a fresh
    judging of the same trace against the same baselines."""
    alone = import_settings(kafka_server, influx_server, defaults, tmp_path / "alone")
    setup(alone)
    with running_pipeline(alone, tmp_path / "alone-pipeline") as (processor, _sink):
        accounted(run_import(alone, "table", OPTIONS, (TRACE, MAPPING), pipeline=False, progress=False))
        wait_settled(processor, "findings")
    held = {(d, g, t) for d, g, t in _findings(alone)}

    settings = import_settings(kafka_server, influx_server, defaults, tmp_path / "state")
    setup(settings)
    stop, rounds = threading.Event(), list[int]()
    options: dict[str, Any] = {"pipeline": False, "progress": False}
    with running_pipeline(settings, tmp_path / "pipeline") as (processor, _sink):
        live = threading.Thread(target=_live, args=(settings, stop, rounds), name="live")
        live.start()
        try:
            first = run_import(settings, "table", OPTIONS, (TRACE, MAPPING), **options)
            accounted(first)
            stop_at = iso(first.report.last_ns + 10**9)
            trained = CliRunner().invoke(
                cli, ["baselines", "train", "--range", "5m", "--stop", stop_at, "--min-samples", "100",
                      "--cluster", settings.cluster], obj={"settings": settings}, catch_exceptions=False,
            )  # fmt: skip
            assert trained.exit_code == 0, trained.output
            assert wait_for(lambda: processor.stats().get("baselines_version") == 1, 60), processor.stats()
            accounted(run_import(settings, "table", OPTIONS, (TRACE, MAPPING), restart=True, **options))
            time.sleep(5)  # live rounds after the history, judged with the rest
        finally:
            stop.set()
            live.join()
        wait_settled(processor, "findings")
    found = _findings(settings)
    history = [f for f in found if f[2] <= first.report.last_ns]
    assert [f for f in found if f[0] == "fallen-off-bus"] == []
    assert set(history) <= held, set(history) - held  # in the history: only what the trace alone holds
    assert [f for f in found if f[2] > first.report.last_ns] == []  # the healthy live node: nothing
    # the node reported live all along: before the first import and through the 5 s after the second (the loop can
    # take under 20 s on a quiet machine: the count of rounds is not the point)
    assert len(rounds) >= 5 and rounds[0] < first.report.started_ns


def test_an_import_finds_a_running_processor_and_sink_in_their_consumer_groups(
    pipeline: tuple[Settings, Stage],
    kafka_server: KafkaServer,
    influx_server: InfluxServer,
    defaults: Settings,
    tmp_path: Path,
) -> None:
    """Issue 37: an import that started its own processor beside a running one split the partitions with it and
    stored 0. The running stages are found in their groups (the import then goes through them); none elsewhere."""
    settings, _processor = pipeline
    assert group_members(settings) == {"process": 1, "sink": 1}
    idle = import_settings(kafka_server, influx_server, defaults, tmp_path / "idle")
    assert group_members(idle) == {"process": 0, "sink": 0}


def _interpreted_rows(settings: Settings, expected: int, timeout_s: float = 60) -> list[InterpretedBatch]:
    """What the processor wrote to the interpreted topic, from its start, until ``expected`` rows came."""
    consumer = Consumer(
        settings.kafka.client_config()
        | {"group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([settings.topics.interpreted])
    out: list[InterpretedBatch] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and sum(len(b) for b in out) < expected:
            out += [decode_interpreted(m.value() or b"") for m in consumer.consume(500, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return out


def test_two_files_of_the_same_range_merge_by_field_and_are_judged_whole(
    pipeline: tuple[Settings, Stage], tmp_path: Path
) -> None:
    """Issue 37: a second file of the same range shared its points with the first; its half-samples were judged
    alone, their verdicts overwrote the first's, and the import exited 1 ('2 more samples stored than read'). The
    trace split into a file of power readings and one of temperature and utilization, the same rows: the second
    import's samples carry the first's power (judged whole), every point holds all three, and both add up."""
    settings, _processor = pipeline
    with TRACE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    imports = []
    for name, columns in (("power", ("power_W",)), ("rest", ("temperature_C", "utilization_gpu_percent"))):
        path, mapping = tmp_path / f"{name}.csv", tmp_path / f"{name}.toml"
        with path.open("w", newline="") as f:
            out = csv.DictWriter(f, ["timestamp", "gpu_index", *columns], extrasaction="ignore")
            out.writeheader()
            out.writerows(rows)
        head, tail = MAPPING.read_text().split("[fields]")
        kept = [line for line in tail.split("[context]")[0].splitlines() if any(c in line for c in columns)]
        mapping.write_text(head + "[fields]\n" + "\n".join(kept) + "\n\n[context]" + tail.split("[context]")[1])
        outcome = run_import(settings, "table", {"paths": (path,), "mapping": mapping}, (path, mapping),
                             pipeline=False, progress=False)  # fmt: skip
        accounted(outcome)  # the second: exactly as many stored as read, the points being the first's
        imports.append(outcome)
    assert not any("rows met readings" in n for n in imports[0].notes)
    assert "6240 rows met readings already stored at their points" in " ".join(imports[1].notes)

    power, temperature = METRIC_INDEX["power_watts"], METRIC_INDEX["temperature_gpu_celsius"]
    judged = np.vstack([b.metrics for b in _interpreted_rows(settings, 2 * len(rows))])
    whole = ~np.isnan(judged[:, power]) & ~np.isnan(judged[:, temperature])
    assert len(judged) == 2 * len(rows) and int(whole.sum()) == len(rows)  # the second import's, every one
    points = stored_points(settings)
    assert len(points) == len(rows)
    assert all(p.get("power_watts") is not None and p.get("temperature_gpu_celsius") is not None for p in points)
