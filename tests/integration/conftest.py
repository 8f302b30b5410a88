"""Real servers for integration tests: a local Kafka broker and a local influxd, started by the project's own
service code (installed/built into the user cache on first use). A server that cannot start is an error,
never a skip: in CI a missing server fails the run."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings, TopicSettings, load_settings
from pipeline.services import influxdb, kafka
from pipeline.topics import ensure_topics, topic_specs


class InfluxServer:
    """The session's influxd; ``restart`` keeps port, data and token (resilience tests stop/start it)."""

    def __init__(self, proc: influxdb.InfluxProcess, cache_dir: Path) -> None:
        self.proc, self.cache_dir = proc, cache_dir

    def stop(self) -> None:
        self.proc.stop()

    def proc_signal(self, sig: signal.Signals) -> None:
        """Send influxd a signal (SIGSTOP hangs it: connections are accepted and never answered; SIGCONT)."""
        os.kill(self.proc.pid, sig)

    def start(self) -> None:
        self.proc = influxdb.start(
            self.cache_dir,
            self.proc.version,
            self.proc.run_dir,
            self.proc.org,
            self.proc.bucket,
            self.proc.token,
            port=self.proc.port,
        )


class KafkaServer:
    """The session's broker; ``stop``/``start`` keep its ports and data (reliability tests restart it)."""

    def __init__(self, proc: kafka.KafkaProcess, cache_dir: Path) -> None:
        self.proc, self.cache_dir = proc, cache_dir

    @property
    def bootstrap_servers(self) -> str:
        return self.proc.bootstrap_servers

    def stop(self) -> None:
        self.proc.stop()

    def start(self) -> None:
        p = self.proc
        self.proc = kafka.start(self.cache_dir, p.version, p.run_dir, port=p.port, controller_port=p.controller_port)


@pytest.fixture(scope="session")
def defaults() -> Settings:
    return load_settings()


@pytest.fixture(scope="session")
def kafka_server(tmp_path_factory: pytest.TempPathFactory, defaults: Settings) -> Iterator[KafkaServer]:
    cache = defaults.services.cache_dir
    server = KafkaServer(kafka.start(cache, defaults.kafka.version, tmp_path_factory.mktemp("kafka")), cache)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def influx_server(tmp_path_factory: pytest.TempPathFactory, defaults: Settings) -> Iterator[InfluxServer]:
    cache = defaults.services.cache_dir
    proc = influxdb.start(
        cache, defaults.influxdb.version, tmp_path_factory.mktemp("influxdb"), "hermeneut", "telemetry"
    )
    server = InfluxServer(proc, cache)
    yield server
    server.stop()


def isolated_settings(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, state_dir: Path
) -> Settings:
    """Settings with their own topics, consumer groups and cluster tag on the shared servers (topics created)."""
    tag = uuid.uuid4().hex[:8]
    p = influx_server.proc
    s = Settings(
        cluster=f"test-{tag}",
        group_prefix=f"test-{tag}",
        sample_interval_s=1.0,
        kafka=KafkaSettings(bootstrap_servers=kafka_server.bootstrap_servers, session_timeout_s=6.0),
        influxdb=InfluxSettings(url=p.url, org=p.org, bucket=p.bucket, token=p.token, flush_interval_s=0.1),
        topics=TopicSettings.with_prefix(f"t{tag}", partitions=3),
        services=ServiceSettings(cache_dir=defaults.services.cache_dir, state_dir=state_dir),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return s


@pytest.fixture
def settings(kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path: Path) -> Settings:
    """Settings for one test: its own topics, consumer groups and cluster tag on the shared servers."""
    return isolated_settings(kafka_server, influx_server, defaults, tmp_path / "state")


# Chromium for the dashboard tests. A view has rendered. Null-safe: while a navigation (a form post, a link)
# replaces the document, it has no body yet.
READY = "document.body?.dataset.ready === '1'"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--no-first-run", "--disable-sync"],
        )  # fmt: skip
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    errors: list[str] = []
    p.on("pageerror", lambda exc: errors.append(str(exc)))
    yield p
    context.close()
    assert not errors, f"JavaScript errors: {errors}"
