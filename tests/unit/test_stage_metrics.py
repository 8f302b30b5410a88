"""Each stage's /metrics says what its stats file says, with what a flat file cannot hold besides: the collector
agent, the sink runner (with a scripted sink and a fake consumer), the context watch, the web app's requests; and
the pure parts of serving them (the metrics settings, the main job's lines, the Prometheus config written for a
test). A real Prometheus scraping the real stages is tests/integration/test_prometheus.py."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from hermeneut.jobs.mainjob import metrics_lines
from hermeneut.web.app import create_app
from pipeline.config import METRICS_STAGES, MetricsSettings, TopicSettings, WebSettings, env_names, load_settings
from pipeline.errors import BadSourceData, ServiceError, SourceUnavailable
from pipeline.metrics import StatsView, librdkafka_lag
from pipeline.services import prometheus
from pipeline.services.stages import Stage
from producers.agent import NodeAgent
from producers.context.watch import WATCH_FIELDS, Watcher
from sinks.runner import RunnerConfig, SinkRunner
from tests.fakes.context import Scripted
from tests.fakes.kafka import FakeConsumer, FakeMessage, RecordingPublisher
from tests.fakes.sinks import ScriptedSink
from tests.fakes.sources import ScriptedSource
from tests.unit.producers.test_agent import batch


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_the_agent_exposes_its_report_and_its_source() -> None:
    registry = CollectorRegistry(auto_describe=True)
    source = ScriptedSource([[batch(4)], BadSourceData("nan", "NaN power", b"\x00", "scrape"), [batch(4)]])
    publisher = RecordingPublisher()
    clock = itertools.count(10**18, 10**8)
    agent = NodeAgent(source, publisher, TopicSettings.with_prefix("t"), 0.001, clock=lambda: next(clock),  # type: ignore[arg-type]
                      registry=registry)  # fmt: skip
    stop = threading.Event()
    rounds = itertools.count(1)
    original = agent.round
    agent.round = lambda s: original(s) if next(rounds) < 3 else (original(s), stop.set())[0]  # type: ignore[method-assign]
    agent.run(stop)
    r = agent.report
    assert r.rounds == 3 and r.samples == 8 and r.dead_lettered == 1
    assert sample(registry, "hermeneut_collector_rounds_total") == r.rounds
    assert sample(registry, "hermeneut_collector_samples_total") == r.samples
    assert sample(registry, "hermeneut_dead_letters_total", reason="nan") == 1.0
    assert sample(registry, "hermeneut_collector_scripted_rounds_total") == 3.0  # the source's own counter
    assert sample(registry, "hermeneut_producer_messages_queued_total") == len(publisher.sent)
    assert sample(registry, "hermeneut_collector_round_read_seconds_count") == 3.0


def test_the_sink_runner_exposes_its_counts_batches_latency_and_lag() -> None:
    registry = CollectorRegistry(auto_describe=True)
    sink = ScriptedSink(reject=frozenset({b"d"}))
    consumer = FakeConsumer([FakeMessage("in", 0, o, v) for o, v in enumerate([b"a", b"bad", b"c", b"d", b"e"])])
    config = RunnerConfig(1, flush_interval_s=0.01, shutdown_grace_s=1.0, dead_letter_topic="dlq")
    runner = SinkRunner(sink, consumer, RecordingPublisher(), config, registry=registry)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    while consumer.committed().get(("in", 0)) != 5:
        thread.join(0.01)
    stop.set()
    thread.join(30)
    s = runner.stats
    assert s.messages == 5 and s.dead_lettered == 2
    for key, name in (("messages", "messages"), ("batches", "batches"), ("commits", "commits")):
        assert sample(registry, f"hermeneut_sink_{name}_total") == getattr(s, key), name
    assert sample(registry, "hermeneut_dead_letters_total", reason="malformed") == 1.0
    assert sample(registry, "hermeneut_dead_letters_total", reason="fake_rejected") == 1.0
    stored = sum(len(b) for b in sink.written)
    assert sample(registry, "hermeneut_sink_sample_stored_seconds_count") == stored  # one latency per stored sample
    assert sample(registry, "hermeneut_sink_batch_size_sum") == stored
    assert sample(registry, "hermeneut_sink_flush_seconds_count", outcome="rejected") == 1.0
    runner.lag.update(librdkafka_lag(consumer))
    assert sample(registry, "hermeneut_consumer_lag_messages", topic="in", partition="0") == 0.0


def test_the_context_watch_exposes_its_sources() -> None:
    good, bad = Scripted("static", {}), Scripted("slurm", SourceUnavailable("squeue timed out"))
    watcher = Watcher("dc1", "n1", [good, bad], lambda _k, _v: None)
    watcher.step()
    registry = CollectorRegistry()
    registry.register(StatsView(watcher.values, WATCH_FIELDS))
    assert sample(registry, "hermeneut_context_polls_total") == 1.0
    assert sample(registry, "hermeneut_context_source_up", source="static") == 1.0
    assert sample(registry, "hermeneut_context_source_up", source="slurm") == 0.0
    assert sample(registry, "hermeneut_context_source_failures_total", source="slurm") == 1.0
    assert sample(registry, "hermeneut_context_gpus") == 0.0


def test_the_web_app_counts_requests_by_route_pattern(tmp_path: Path) -> None:
    settings = load_settings(web=WebSettings(host="127.0.0.1"))
    registry = CollectorRegistry()

    async def visit() -> None:
        async with TestClient(TestServer(create_app(settings, store=object(), registry=registry))) as client:  # type: ignore[arg-type]
            for path in ("/healthz", "/healthz", "/no/such/page"):
                await client.get(path)
            await client.request("PROPFIND", "/healthz")  # a method aiohttp parses, counted as "other"

    asyncio.run(visit())
    assert sample(registry, "hermeneut_web_requests_total", route="/healthz", method="GET", status="200") == 2.0
    assert sample(registry, "hermeneut_web_requests_total", route="unmatched", method="GET", status="404") == 1.0
    assert sample(registry, "hermeneut_web_requests_total", route="unmatched", method="other", status="405") == 1.0
    assert sample(registry, "hermeneut_web_request_seconds_count", route="/healthz") == 2.0


def test_each_stage_has_its_own_port_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = MetricsSettings()
    assert defaults.host == "127.0.0.1"  # loopback unless told otherwise
    ports = [defaults.port(stage) for stage in METRICS_STAGES]
    assert len(set(ports)) == len(METRICS_STAGES)
    assert {f"HERMENEUT_METRICS__{stage.upper()}_PORT" for stage in METRICS_STAGES} <= env_names()
    monkeypatch.setenv("HERMENEUT_METRICS__SINK_PORT", "19474")
    assert load_settings().metrics.port("sink") == 19474


def test_the_main_job_lists_every_metrics_url() -> None:
    stages = [Stage(name, None, Path("l"), Path("s"), f"http://127.0.0.1:{p}/metrics")  # type: ignore[arg-type]
              for name, p in (("process", 1), ("sink", 2))]  # fmt: skip
    kept = metrics_lines(stages, "http://127.0.0.1:3/metrics", kept=True)
    assert kept.splitlines()[:3] == [
        "  metrics    http://127.0.0.1:1/metrics  (process)",
        "  metrics    http://127.0.0.1:2/metrics  (sink)",
        "  metrics    http://127.0.0.1:3/metrics  (web)",
    ]
    assert "until `hermeneut services down`" in kept
    assert "stopped with the job" in metrics_lines(stages, None, kept=False)
    assert "off" in metrics_lines([], None, kept=True)


def test_the_prometheus_config_scrapes_each_job() -> None:
    config = prometheus.scrape_config(
        {"hermeneut-sink": ["http://127.0.0.1:9474/metrics", "http://10.0.0.2:9474/metrics"]},
        interval_s=1.0,
        rule_files=[Path("/r.yml")],
    )
    assert config == {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["/r.yml"],
        "scrape_configs": [
            {
                "job_name": "hermeneut-sink",
                "scheme": "http",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": ["127.0.0.1:9474", "10.0.0.2:9474"]}],
            }
        ],
    }
    with pytest.raises(ValueError, match="one scheme and one path"):
        prometheus.scrape_config({"x": ["http://a:1/metrics", "http://b:1/other"]})


def test_a_missing_prometheus_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ServiceError, match="apt-get install -y --no-install-recommends prometheus"):
        prometheus.binary("promtool")


def test_docs_name_every_metric_the_stages_expose(tmp_path: Path) -> None:
    """docs/metrics.md lists each hermeneut_* metric a stage registers (the collector's per-source counters as the
    pattern it documents, with each source's names)."""
    from alerting.manager import MANAGER_FIELDS
    from pipeline.config import KafkaSettings, ServiceSettings, Settings
    from processors.app import create_app as processor_app
    from producers.agent import AGENT_FIELDS
    from sinks.runner import RUNNER_FIELDS

    registries = [CollectorRegistry() for _ in range(3)]
    settings = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),
                        services=ServiceSettings(state_dir=tmp_path, cache_dir=tmp_path))  # fmt: skip
    processor_app(settings, registry=registries[0])
    SinkRunner(ScriptedSink(), FakeConsumer([]), RecordingPublisher(), registry=registries[1])  # type: ignore[arg-type]
    web = load_settings(web=WebSettings(host="127.0.0.1"))
    create_app(web, store=object(), registry=registries[2])  # type: ignore[arg-type]
    # the scripted sink's own counter is a test's (docs give the pattern: hermeneut_sink_<counter>_total)
    names = {m.name for r in registries for m in r.collect()} - {f"hermeneut_sink_{k}" for k in ScriptedSink().stats()}
    names |= {f.name.removesuffix("_total") for f in (*AGENT_FIELDS, *WATCH_FIELDS, *RUNNER_FIELDS, *MANAGER_FIELDS)}
    names |= {"hermeneut_collector_round_read_seconds", "hermeneut_alerts_delivery_seconds"}  # their histograms
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"`(hermeneut_\w+?)(?:_total)?`", docs))
    missing = sorted(n for n in names if n.startswith("hermeneut_") and n not in documented)
    assert missing == [], missing
    for source in ("nvml_errors", "unsupported_readings", "scraped_series", "withheld_contexts"):
        assert f"`{source}`" in docs, source
