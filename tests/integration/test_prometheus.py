"""A real Prometheus (Debian's, started by pipeline.services.prometheus) scrapes the real processor, sink and alert
manager during a simulated run on real Kafka and InfluxDB: what it stores equals the stages' own counts and the
dead-letter topic, and what hermeneut concluded (verdicts, open findings) equals what ``hermeneut anomalies``, the
alerts API and InfluxDB say. The rule file of hermeneut's own health is loaded by that server, checked by
``promtool check rules`` and unit-tested by ``promtool test rules``."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.stages import start_stage
from hermeneut.web.app import create_app
from pipeline.config import Settings
from pipeline.deadletter import headers_dict
from pipeline.events import APPLICATIONS
from pipeline.publisher import Publisher
from pipeline.services import prometheus
from pipeline.services.stages import Stage, wait_for
from producers.agent import NodeAgent
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan, Injection
from producers.simulator.source import SimulatorSource
from sinks.query.store import flux_rows

from .harness import consume_all, publish

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "hermeneut.rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "hermeneut.rules.test.yml"
S = 1_000_000_000
LEARN_S, JUDGE_S = 300, 120
#: faults the detectors confirm within seconds, each on a GPU the injector picks (seconds after the first round)
FAULTS = (("ecc-uncorrectable", 310.0), ("nvlink-down", 315.0), ("pcie-link-degraded", 320.0))
GARBAGE = [(b"bad/1", b"\x00 not msgpack"), (b"bad/2", b"\xc1"), (b"bad/3", b"")]


def test_the_rule_file_is_valid_and_each_alert_fires_on_its_series() -> None:
    assert "SUCCESS: 11 rules found" in prometheus.check_rules(RULES)
    assert "SUCCESS" in prometheus.promtool("test", "rules", RULES_TEST)


@pytest.fixture
def stages(settings: Settings, tmp_path: Path) -> Iterator[dict[str, Stage]]:
    running = {
        "process": start_stage("process", settings, tmp_path / "stages"),
        "sink": start_stage("sink", settings, tmp_path / "stages"),
        "alerts": start_stage("alerts", settings, tmp_path / "stages", command=("alerts", "run")),
    }
    try:
        ready = wait_for(lambda: all(s.stats().get("assigned") for s in running.values()), 120)
        assert ready, {name: s.log.read_text()[-2000:] for name, s in running.items()}
        yield running
    finally:
        for stage in running.values():
            stage.stop()


@pytest.fixture
def server(stages: dict[str, Stage], tmp_path: Path) -> Iterator[prometheus.PrometheusProcess]:
    targets = {f"hermeneut-{name}": [str(s.metrics_url)] for name, s in stages.items()}
    config = prometheus.scrape_config(targets, interval_s=1.0, rule_files=[RULES])
    proc = prometheus.start(tmp_path / "prometheus", config)
    try:
        yield proc
    finally:
        proc.stop()


def _simulate(settings: Settings, fleet: Fleet, end_ns: int, seconds: int) -> int:
    """The fleet's rounds from ``seconds`` before ``end_ns`` up to it, through the collector agent; samples sent."""
    publisher = Publisher(settings.kafka.client_config())
    agent = NodeAgent(SimulatorSource.of(fleet), publisher, settings.topics, 1.0, clock=lambda: end_ns)
    report = agent.run(threading.Event(), 0.0, fast_forward_s=seconds)
    assert publisher.stats.failed == 0 and report.undelivered == 0
    return report.samples


def _value(server: prometheus.PrometheusProcess, promql: str) -> float | None:
    result = server.query(promql)
    return result[0][1] if result else None


def _scraped(server: prometheus.PrometheusProcess, promql: str, expected: float, timeout_s: float = 30) -> float:
    """What Prometheus holds for ``promql`` once it scraped ``expected`` (or when time ran out)."""
    wait_for(lambda: _value(server, promql) == expected, timeout_s, interval_s=0.5)
    return _value(server, promql) or 0.0


def _settled(stage: Stage, key: str) -> bool:
    before = stage.stats().get(key, 0)
    time.sleep(3.0)
    return bool(stage.stats().get(key, 0) == before)


def _alerts_api(settings: Settings, status: str) -> list[dict[str, Any]]:
    async def get() -> list[dict[str, Any]]:
        async with TestClient(TestServer(create_app(settings))) as client:
            resp = await client.get(f"/api/v1/alerts?status={status}")
            assert resp.status == 200, await resp.text()
            body: list[dict[str, Any]] = await resp.json()
            return body

    return asyncio.run(get())


def _latest_verdicts(settings: Settings) -> dict[str, str]:
    [rows] = flux_rows(
        settings,
        f'from(bucket: "{settings.influxdb.bucket}") |> range(start: 0) '
        f'|> filter(fn: (r) => r._measurement == "gpu" and r.cluster == "{settings.cluster}" and r._field == "verdict")'
        ' |> group(columns: ["gpu"]) |> last()',
    )
    return {r["gpu"]: r["_value"] for r in rows}


def test_prometheus_scrapes_the_stages_of_a_simulated_run(
    settings: Settings, stages: dict[str, Stage], server: prometheus.PrometheusProcess
) -> None:
    processor, sink, alerts = stages["process"], stages["sink"], stages["alerts"]
    injections = tuple(Injection(fault, at_s, 600.0) for fault, at_s in FAULTS)
    fleet = Fleet(4, 4, cluster=settings.cluster, seed=0, faults=FaultPlan(rate_scale=0.0, injections=injections))
    now = time.time_ns()

    # learn: five minutes of healthy history through the pipeline, baselines trained from InfluxDB
    produced = _simulate(settings, fleet, now - JUDGE_S * S, LEARN_S)
    assert wait_for(lambda: sink.stats().get("points_written", 0) >= produced, 180), sink.stats()
    result = CliRunner().invoke(
        cli, ["baselines", "train", "--range", "1h", "--min-samples", "100", "--cluster", settings.cluster],
        obj={"settings": settings}, catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0 and "published version 1" in result.output, result.output
    assert wait_for(lambda: processor.stats().get("baselines_version") == 1, 60), processor.stats()

    # judge: two minutes with faults, and three messages that are not hermeneut's at all
    produced += _simulate(settings, fleet, now, JUDGE_S - 1)
    publish(settings, GARBAGE)
    assert wait_for(lambda: sink.stats().get("points_written", 0) >= produced, 180), sink.stats()
    assert wait_for(lambda: _settled(sink, "findings_written") and _settled(alerts, "findings"), 90)
    p, s, a = processor.stats(), sink.stats(), alerts.stats()
    assert s["points_written"] == p["samples_ok"] == produced and p["dead_lettered"] == len(GARBAGE)

    # every target up; what Prometheus stored equals the stages' own counts
    assert {t["labels"]["job"]: t["health"] for t in server.targets()} == {
        "hermeneut-process": "up", "hermeneut-sink": "up", "hermeneut-alerts": "up",
    }  # fmt: skip
    counts = {
        "hermeneut_processor_messages_total": p["messages_in"],
        "hermeneut_processor_samples_total": p["samples_ok"],
        "hermeneut_processor_findings_total": p["findings"],
        "hermeneut_processor_baselines_version": 1,
        'sum(hermeneut_dead_letters_total{job="hermeneut-process"})': p["dead_lettered"],
        "hermeneut_sink_points_written_total": s["points_written"],
        "hermeneut_sink_findings_written_total": s["findings_written"],
        "hermeneut_sink_messages_total": s["messages"],
        "hermeneut_sink_batches_total": s["batches"],
        "hermeneut_sink_write_retries_total": s["write_retries"],
        "hermeneut_sink_sample_stored_seconds_count": s["points_written"],
        "hermeneut_sink_batch_size_sum": s["points_written"],
        "hermeneut_alerts_findings_total": a["findings"],
        "hermeneut_alerts_firing": a["alerts_firing"],
        'sum(hermeneut_alerts{status="firing"})': a["alerts_firing"],
        "sum(hermeneut_processor_verdicts_total)": p["samples_ok"],
        "count(hermeneut_gpu_verdict == 1)": fleet.size,
    }
    got = {promql: _scraped(server, promql, float(want)) for promql, want in counts.items()}
    assert got == {promql: float(want) for promql, want in counts.items()}

    # dead letters by reason, as the dead-letter topic's headers say
    letters = consume_all(settings, settings.topics.dead_letter, len(GARBAGE))
    reasons = Counter(headers_dict(m.headers())["hermeneut-reason"] for m in letters)
    by_reason = {r["reason"]: v for r, v in server.query('hermeneut_dead_letters_total{job="hermeneut-process"}')}
    assert by_reason == {reason: float(n) for reason, n in reasons.items()}

    # every partition read to its end: no lag, nothing stalled
    lag = server.query("hermeneut_consumer_lag_messages")
    assert {r["job"] for r, _ in lag} == {"hermeneut-process", "hermeneut-sink", "hermeneut-alerts"}
    assert {v for _, v in lag} == {0.0} and not server.query("hermeneut_consumer_stalled == 1")

    # the verdicts: per verdict as `hermeneut anomalies` counts them, per GPU as InfluxDB holds the latest
    out = CliRunner().invoke(
        cli, ["anomalies", "--range", "1h", "--cluster", settings.cluster, "--part", "windows", "--format", "json"],
        obj={"settings": settings}, catch_exceptions=False,
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    windows = json.loads(out.output)["rows"]
    judged = {r["verdict"]: v for r, v in server.query("hermeneut_processor_verdicts_total")}
    assert {v: judged[v] for v in ("unusual", "anomalous")} == {
        v: float(sum(w[v] for w in windows)) for v in ("unusual", "anomalous")
    }
    assert sum(w["samples"] for w in windows) == produced
    latest = {r["gpu"]: r["verdict"] for r, _ in server.query("hermeneut_gpu_verdict == 1")}
    assert latest == _latest_verdicts(settings) and len(latest) == fleet.size
    assert "normal" in latest.values() and judged["normal"] > 0  # the trained baselines judge

    # open findings: the alert manager's firing alerts, one for each, and the injected faults among them
    opened = {f"{r['detector']}/{r['cluster']}/{r['node']}/{r['gpu'] or '-'}" for r, _ in server.query(
        "hermeneut_finding_open == 1")}  # fmt: skip
    firing = {alert["dedup_key"] for alert in _alerts_api(settings, "firing")}
    assert opened == firing
    assert {fault for fault, _ in FAULTS} <= {key.split("/")[0] for key in opened}

    # GPU time per application: each GPU's samples one second apart, the first of each counting none
    seconds = {r["application"]: v for r, v in server.query("hermeneut_gpu_seconds_total")}
    samples_per_gpu = Counter(r["gpu"] for r in _stored_rows(settings))
    assert sum(seconds.values()) == pytest.approx(sum(n - 1 for n in samples_per_gpu.values()))
    assert set(seconds) <= set(APPLICATIONS) and seconds

    # the rules are loaded and evaluate without error
    groups = server.api("rules")["groups"]
    assert sorted(g["name"] for g in groups) == ["hermeneut-health", "hermeneut-recording"]
    assert {r["health"] for g in groups for r in g["rules"]} == {"ok"}
    firing_rules = {r["name"] for g in groups for r in g["rules"] if r.get("state") == "firing"}
    assert "HermeneutStageDown" not in firing_rules and "HermeneutPartitionStalled" not in firing_rules


def _stored_rows(settings: Settings) -> list[dict[str, Any]]:
    [rows] = flux_rows(
        settings,
        f'from(bucket: "{settings.influxdb.bucket}") |> range(start: 0) '
        f'|> filter(fn: (r) => r._measurement == "gpu" and r.cluster == "{settings.cluster}" and r._field == "verdict")'
        " |> group()",
    )
    return rows
