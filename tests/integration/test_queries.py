"""Trend queries, top-N lists, comparisons and anomaly history on data with known values, written through the
real pipeline into the real InfluxDB, checked against aggregates computed here with numpy.

Two data sets, each loaded once per module:
- ``raw``: SampleBatches published to the raw topic, through the processor and the sink (the acceptance
  path); every aggregate function, window, scope filter, both backends, top-N on readings.
- ``interpreted``: InterpretedBatches with workloads, verdicts, XIDs and findings published to the
  interpreted and alerts topics and stored by the real sink. On this branch the processor has no
  enrichment/scoring stages yet, so this is how job ids, applications and verdicts reach InfluxDB exactly
  as the sink writes them. Baseline bands are written in the contract's shape through ``InfluxWriter``.

Percentiles: Flux ``exact_selector`` is rank ceil(n*q); InfluxQL ``percentile`` is rank floor(n*q + 0.5).
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from pipeline.config import Settings
from pipeline.events import (
    GpuSample,
    SampleBatch,
)
from pipeline.services import kafka
from sinks.query import (
    FUNCTIONS,
    AnomalyQuery,
    Scope,
    Store,
    TopQuery,
    TrendQuery,
    anomalies,
    render,
    top,
    trend,
)
from sinks.query.output import iso

from .conftest import InfluxServer
from .harness import publish_batches, running_pipeline, wait_stored
from .query_data import A100, GPUS, H100, MIN, NS, ROUNDS, THROTTLING, expected, query_settings, start_ns

pytestmark = pytest.mark.integration

# ---- data set 1: raw samples through processor and sink ------------------------------------------------------


@dataclass
class RawData:
    settings: Settings
    start_ns: int
    #: gpu uuid -> column -> values in time order; "ts" holds the timestamps
    series: dict[str, dict[str, list[float]]]

    @property
    def span(self) -> dict[str, str]:
        return {"start": iso(self.start_ns), "stop": iso(self.start_ns + 3 * MIN)}

    def values(self, gpus: list[str], column: str, window: int | None = None) -> list[float]:
        out: list[float] = []
        for g in gpus:
            for ts, v in zip(self.series[g]["ts"], self.series[g][column], strict=True):
                if window is None or self.start_ns + window * MIN <= ts < self.start_ns + (window + 1) * MIN:
                    out.append(v)
        return out


def _raw_samples(cluster: str, start_ns: int) -> tuple[list[SampleBatch], dict[str, dict[str, list[float]]]]:
    rng = np.random.default_rng(20250601)
    series: dict[str, dict[str, list[float]]] = {g[1]: defaultdict(list) for g in GPUS}
    batches = []
    for r in range(ROUNDS):
        ts = start_ns + r * NS
        per_node: dict[str, list[GpuSample]] = defaultdict(list)
        for node, uuid_, index, model, limit, slowdown in GPUS:
            m = {
                "power_watts": round(float(rng.uniform(60, limit * 0.95)), 2),
                "power_limit_watts": limit,
                "temperature_gpu_celsius": float(rng.integers(30, 86)),
                "temperature_slowdown_celsius": slowdown,
                "utilization_gpu_percent": float(rng.integers(0, 101)),
                "throttle_reasons_mask": float(rng.choice([0, 0, 1, 4, 5, 0x10, 0x40, 0x44])),
            }
            per_node[node].append(GpuSample(cluster, node, uuid_, index, model, ts, m))
            s = series[uuid_]
            s["ts"].append(ts)
            for k, v in m.items():
                s[k].append(v)
            s["power_ratio_of_limit"].append(m["power_watts"] / limit)
            s["temperature_ratio_of_slowdown"].append(m["temperature_gpu_celsius"] / slowdown)
        batches += [SampleBatch(cluster, node, tuple(samples)) for node, samples in per_node.items()]
    return batches, series


@pytest.fixture(scope="module")
def raw(
    kafka_server: kafka.KafkaProcess,
    influx_server: InfluxServer,
    defaults: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> RawData:
    state = tmp_path_factory.mktemp("raw")
    settings = query_settings(kafka_server, influx_server, defaults, state)
    start = start_ns()
    batches, series = _raw_samples(settings.cluster, start)
    with running_pipeline(settings, state / "run") as (_processor, sink):
        publish_batches(settings, batches)
        wait_stored(sink, ROUNDS * len(GPUS))
    return RawData(settings, start, series)


@pytest.fixture
def store(raw: RawData) -> Iterator[Store]:
    with Store.from_settings(raw.settings) as s:
        yield s


@pytest.mark.parametrize("backend", ["flux", "influxql"])
def test_every_function_per_window_and_gpu(raw: RawData, store: Store, backend: str) -> None:
    scope = Scope(cluster=raw.settings.cluster)
    for fn in FUNCTIONS:
        result = trend(store, TrendQuery("power_watts", "gpu", "1m", None, fn, scope, backend=backend, **raw.span))
        assert result.backend == backend and result.source == "raw"
        got = {(r.time_ns, r.group[0]): r.value for r in result.rows}
        assert len(got) == 3 * len(GPUS), fn
        for (t, gpu), value in got.items():
            window = (t - raw.start_ns) // MIN
            want = expected(raw.values([gpu], "power_watts", window), fn, backend)
            assert value == pytest.approx(want, rel=1e-9), (fn, gpu, window)


def test_the_backend_is_chosen_per_question(raw: RawData, store: Store) -> None:
    scope = Scope(cluster=raw.settings.cluster)
    windowed = {
        fn: trend(store, TrendQuery("power_watts", "node", "3m", None, fn, scope, **raw.span)).backend
        for fn in ("mean", "max", "p95", "stddev")
    }
    assert set(windowed.values()) == {"influxql"}
    assert top(store, TopQuery("hot", 2, None, scope, "max", **raw.span)).backend == "flux"  # pushed down
    # a relative value is a reading over the GPU's limit at each point, which only Flux computes
    assert top(store, TopQuery("hot", 2, None, scope, "p95", **raw.span)).backend == "flux"
    assert trend(store, TrendQuery("temperature_gpu_celsius", "gpu", None, None, "p95", scope, **raw.span)).backend == (
        "influxql"
    )


@pytest.mark.parametrize(
    ("scope", "by", "groups"),
    [
        (Scope(node="n0"), "gpu", {"GPU-a": ["GPU-a"], "GPU-b": ["GPU-b"]}),
        (Scope(gpu="GPU-c"), "gpu", {"GPU-c": ["GPU-c"]}),
        (Scope(gpu_model=A100), "node", {"n1": ["GPU-c", "GPU-d"]}),
        (Scope(), "gpu_model", {H100: ["GPU-a", "GPU-b"], A100: ["GPU-c", "GPU-d"]}),
        (Scope(), "cluster", {"(this test's cluster)": ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]}),
    ],
)
def test_scope_filters_and_groups(
    raw: RawData, store: Store, scope: Scope, by: str, groups: dict[str, list[str]]
) -> None:
    cluster = raw.settings.cluster
    scoped = Scope(cluster=cluster, node=scope.node, gpu=scope.gpu, gpu_model=scope.gpu_model)
    groups = {cluster if k.startswith("(") else k: v for k, v in groups.items()}
    for field in ("temperature_ratio_of_slowdown", "utilization_gpu_percent"):
        result = trend(store, TrendQuery(field, by, "1m", None, "mean", scoped, **raw.span))
        assert {r.group[0] for r in result.rows} == set(groups)
        assert len(result.rows) == 3 * len(groups)
        for r in result.rows:
            window = (r.time_ns - raw.start_ns) // MIN
            assert r.value == pytest.approx(np.mean(raw.values(groups[r.group[0]], field, window)), rel=1e-9)


def test_an_automatic_window_and_a_relative_range(raw: RawData, store: Store) -> None:
    scope = Scope(cluster=raw.settings.cluster, gpu="GPU-a")
    result = trend(store, TrendQuery("power_watts", "gpu", None, "30m", "count", scope))
    assert result.window_ns == 10 * NS  # 30 minutes in about 300 points
    assert sum(r.value or 0 for r in result.rows) == ROUNDS
    assert all(r.value == 10 for r in result.rows)  # 1 Hz samples, windows start on whole minutes


@pytest.mark.parametrize(("kind", "fn"), [("hot", "max"), ("hot", "p95"), ("power", "mean"), ("throttled", "max")])
def test_top_lists_on_readings(raw: RawData, store: Store, kind: str, fn: str) -> None:
    result = top(store, TopQuery(kind, 3, None, Scope(cluster=raw.settings.cluster), fn, **raw.span))
    gpus = [g[1] for g in GPUS]
    backend = result.backend
    if kind == "hot":
        want = {g: expected(raw.values([g], "temperature_ratio_of_slowdown"), fn, backend) for g in gpus}
    elif kind == "power":
        want = {g: expected(raw.values([g], "power_watts"), fn, backend) for g in gpus}
    else:
        masks = {g: np.array(raw.values([g], "throttle_reasons_mask"), dtype=np.int64) for g in gpus}
        want = {g: float(np.mean((m & THROTTLING) != 0)) for g, m in masks.items()}
    ranking = sorted(gpus, key=lambda g: (-want[g], g))[:3]
    assert [r.gpu for r in result.rows] == ranking
    for r in result.rows:
        assert r.values[0] == pytest.approx(want[r.gpu], rel=1e-9)
        models = {g[1]: g[3] for g in GPUS}
        assert (r.rank, r.gpu_model, r.cluster) == (ranking.index(r.gpu) + 1, models[r.gpu], raw.settings.cluster)
    if kind == "throttled":
        assert all(r.values[1] == ROUNDS for r in result.rows)


def test_unscored_samples_show_in_anomaly_history(raw: RawData, store: Store) -> None:
    history = anomalies(store, AnomalyQuery(None, "1m", Scope(cluster=raw.settings.cluster), **raw.span))
    assert [(w.samples, w.unusual, w.anomalous) for w in history.windows] == [(60 * len(GPUS), 0, 0)] * 3
    # a quarter of the random masks say HW thermal slowdown, which is thermal throttling; unscored rows raise no
    # baseline anomaly
    assert {f.detector for f in history.findings} <= {"thermal-throttling"}


def test_output_formats_parse_back(raw: RawData, store: Store) -> None:
    q = TrendQuery("power_watts", "gpu", "1m", None, "p95", Scope(cluster=raw.settings.cluster), **raw.span)
    result = trend(store, q)
    doc = json.loads(render(result.tables(), "json"))
    rows = list(csv.DictReader(io.StringIO(render(result.tables(), "csv"))))
    assert len(doc["rows"]) == len(rows) == len(result.rows) == 12
    for r, j, c in zip(result.rows, doc["rows"], rows, strict=True):
        assert j == {"time": iso(r.time_ns), "gpu": r.group[0], "p95(power_watts)": r.value}
        assert (c["time"], c["gpu"], float(c["p95(power_watts)"])) == (iso(r.time_ns), r.group[0], r.value)
    assert doc["notes"][0] == "answered by influxql from the raw bucket"


def test_cli_trend_csv(raw: RawData) -> None:
    env = {
        "HERMENEUT_INFLUXDB__URL": raw.settings.influxdb.url or "",
        "HERMENEUT_INFLUXDB__TOKEN": raw.settings.influxdb.token.get_secret_value()
        if raw.settings.influxdb.token
        else "",
    }
    args = ["trend", "--field", "utilization_gpu_percent", "--by", "node", "--every", "3m", "--fn", "max",
            "--cluster", raw.settings.cluster, "--start", raw.span["start"], "--stop", raw.span["stop"],
            "--format", "csv"]  # fmt: skip
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    nodes = {"n0": ["GPU-a", "GPU-b"], "n1": ["GPU-c", "GPU-d"]}
    assert {r["node"]: float(r["max(utilization_gpu_percent)"]) for r in rows} == {
        n: max(raw.values(g, "utilization_gpu_percent")) for n, g in nodes.items()
    }
    assert "note: answered by influxql from the raw bucket" in result.stderr
