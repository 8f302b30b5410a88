"""Real parts for the alerting integration tests: a local HTTP receiver (aiohttp, records every request and
checks HMAC signatures), a local SMTP server (aiosmtpd), the alert manager as a child process, findings
published through the real Publisher, and reads of the notification history from InfluxDB."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from aiosmtpd.controller import Controller

from alerting.receivers import SIGNATURE_HEADER, verify_signature
from hermeneut.stages import start_stage
from pipeline import services
from pipeline.codec import encode_record
from pipeline.config import AlertSettings, Settings
from pipeline.events import Finding, Severity, Workload
from pipeline.publisher import Publisher
from pipeline.services.stages import Stage, wait_for
from sinks.query.alerts import HistoryQuery, NotificationRow, run_history


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fast_alerts(**overrides: Any) -> AlertSettings:
    """Timers short enough for a test (the defaults are minutes and hours)."""
    base: dict[str, Any] = {
        "group_wait_s": 0.5,
        "group_interval_s": 1.0,
        "repeat_interval_s": 3600.0,
        "retry_initial_s": 0.2,
        "retry_max_s": 1.0,
        "retry_max_age_s": 600.0,
        "http_timeout_s": 3.0,
        "tick_s": 0.1,
        "flap_threshold": 4,
        "flap_window_s": 60.0,
        "flap_quiet_s": 3.0,
        "external_url": "http://hermeneut.test",
        # the test's receivers listen on loopback, which webhook targets may not name unless allowed
        "allowed_targets": "127.0.0.1",
    }
    return AlertSettings(**(base | overrides))


def with_alerts(settings: Settings, **overrides: Any) -> Settings:
    return settings.model_copy(update={"alerts": fast_alerts(**overrides)})


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


class HttpReceiver:
    """An HTTP server on 127.0.0.1 in its own thread; every POST is recorded and answered ``status``."""

    def __init__(self, port: int | None = None, status: int = 200) -> None:
        self.port = port or free_port()
        self.status = status
        self.requests: list[Received] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def start(self) -> HttpReceiver:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            self.requests.append(Received(request.path, dict(request.headers), body, time.monotonic()))
            return web.Response(status=self.status)

        async def up() -> None:
            app = web.Application()
            app.router.add_post("/{tail:.*}", handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        self._thread.start()
        asyncio.run_coroutine_threadsafe(up(), self._loop).result(10)
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def on(self, path: str) -> list[Received]:
        return [r for r in self.requests if r.path == path]

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def signed_ok(r: Received, secret: str) -> bool:
    return verify_signature(secret, r.headers.get(SIGNATURE_HEADER, ""), r.body, time.time())


class _Mailbox:
    def __init__(self) -> None:
        self.messages: list[tuple[list[str], bytes]] = []

    async def handle_DATA(self, _server: Any, _session: Any, envelope: Any) -> str:
        self.messages.append((list(envelope.rcpt_tos), bytes(envelope.content)))
        return "250 OK"


class SmtpReceiver:
    """aiosmtpd on 127.0.0.1: a real SMTP conversation, every message kept."""

    def __init__(self) -> None:
        self.port = free_port()
        self._box = _Mailbox()
        self._controller = Controller(self._box, hostname="127.0.0.1", port=self.port)

    @property
    def messages(self) -> list[tuple[list[str], bytes]]:
        return self._box.messages

    def start(self) -> SmtpReceiver:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()


def start_manager(settings: Settings, run_dir: Path, env: dict[str, str] | None = None) -> Stage:
    """``hermeneut alerts run`` as a child process with the test's settings; waits until it is ready."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log, stats = run_dir / "alerts.log", run_dir / "alerts.stats.json"
    stats.unlink(missing_ok=True)
    child_env = services.child_env(settings) | {"PYTHONUNBUFFERED": "1"} | (env or {})
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hermeneut.cli", "-v", "alerts", "run", "--stats-file", str(stats)],
            env=child_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=os.getcwd(),
        )
    stage = Stage("alerts", proc, log, stats)
    ready = wait_for(lambda: bool(stage.stats().get("assigned")) or not stage.alive(), 90)
    assert ready and stage.alive(), tail(stage)
    return stage


@contextmanager
def storing_history(settings: Settings, run_dir: Path) -> Iterator[Stage]:
    """The InfluxDB sink as a child process (``hermeneut sink``): it stores the manager's notification history from
    its topic, as it does in every deployment."""
    sink = start_stage("sink", settings, run_dir)
    try:
        assert wait_for(lambda: bool(sink.stats().get("assigned")) or not sink.alive(), 90) and sink.alive(), tail(sink)
        yield sink
    finally:
        sink.stop()


def tail(stage: Stage) -> str:
    return f"--- {stage.name} log ---\n" + "\n".join(stage.log.read_text(errors="replace").splitlines()[-40:])


def fault(
    settings: Settings,
    active: bool,
    detector: str = "thermal-throttling",
    gpu: str | None = "GPU-1",
    node: str = "n1",
    severity: Severity = Severity.WARNING,
    application: str = "llm-pretraining",
    ts_ns: int | None = None,
) -> Finding:
    ts = time.time_ns() if ts_ns is None else ts_ns
    return Finding(
        detector,
        severity,
        active,
        settings.cluster,
        node,
        gpu,
        "H100-SXM5-80GB",
        ts,
        ts,
        f"{detector} on {node}/{gpu}",
        action="look at it",
        workload=Workload(application, job_id="job-7", user="alice", tenant="team-a"),
    )


def publish_findings(settings: Settings, findings: list[Finding]) -> None:
    """The processor's path: findings on the alerts topic, keyed by their dedup key."""
    pub = Publisher(settings.kafka.client_config())
    for f in findings:
        pub.publish(settings.topics.alerts, f.dedup_key.encode(), encode_record(f))
    assert pub.close(30) == 0 and pub.stats.delivered == len(findings), pub.stats


def publish_findings_raw(settings: Settings, value: bytes) -> None:
    pub = Publisher(settings.kafka.client_config())
    pub.publish(settings.topics.alerts, b"junk", value)
    assert pub.close(30) == 0


def history(settings: Settings, **filters: Any) -> list[NotificationRow]:
    return run_history(settings, HistoryQuery("1h", cluster=settings.cluster, **filters))


def wait_history(settings: Settings, check: Any, timeout_s: float = 30, **filters: Any) -> list[NotificationRow]:
    rows: list[NotificationRow] = []

    def done() -> bool:
        nonlocal rows
        rows = history(settings, **filters)
        return bool(check(rows))

    wait_for(done, timeout_s, 0.5)
    return rows
