"""Which stages an import starts and that it stops them: none where the main job left its processor and sink
running (a second processor in their consumer group would take half the partitions), and a SIGTERM to the import
stops the ones it started (issue 37: they stayed up); imports run one at a time, a second waiting for the first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermeneut.jobs import importjob
from pipeline.config import KafkaSettings, ServiceSettings, Settings
from pipeline.services.stages import Stage


class _Importer:
    name = "fake"

    def open(self) -> None: ...

    def close(self) -> None: ...


class _Terminating:
    """The import driver, SIGTERMed while it publishes."""

    def __init__(self, *_a: Any, **_kw: Any) -> None:
        self.raw_ends: dict[int, int] = {}

    def run(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the import")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Stage]:
    """The stages the import starts (real child processes that would run for a minute), with nothing else
    connected: topics, storage, publisher and importer are stand-ins."""
    out: list[Stage] = []

    def start_stage(name: str, _settings: Settings, run_dir: Path, *_a: Any, **_kw: Any) -> Stage:
        run_dir.mkdir(parents=True, exist_ok=True)
        stats = run_dir / f"{name}.stats.json"
        stats.write_text('{"assigned": true}')
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        out.append(Stage(name, proc, run_dir / f"{name}.log", stats))
        return out[-1]

    monkeypatch.setattr(importjob, "start_stage", start_stage)
    monkeypatch.setattr(importjob, "ensure_topics", lambda *_a, **_kw: None)
    monkeypatch.setattr(importjob, "group_members", lambda _s: {"process": 0, "sink": 0})
    monkeypatch.setattr("pipeline.registry.create", lambda *_a, **_kw: _Importer())
    monkeypatch.setattr("sinks.retention.setup", lambda *_a, **_kw: None)
    monkeypatch.setattr("pipeline.publisher.Publisher", lambda *_a, **_kw: type("P", (), {"close": lambda s: 0})())
    monkeypatch.setattr("producers.importers.driver.ImportDriver", _Terminating)
    return out


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),  # never connected to: every client is a stand-in
        services=ServiceSettings(state_dir=tmp_path / "state", cache_dir=tmp_path / "cache"),
    )


def test_sigterm_stops_the_processor_and_sink_the_import_started(started: list[Stage], tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_:
        importjob.run_import(_settings(tmp_path), "fake", {}, progress=False)
    assert exit_.value.code == 128 + signal.SIGTERM
    assert [s.name for s in started] == ["process", "sink"]
    assert [s.proc.poll() for s in started] == [-signal.SIGTERM, -signal.SIGTERM]  # stopped, not left running
    assert signal.getsignal(signal.SIGTERM) == before
    said: list[str] = []
    lock = importjob.ImportLock(tmp_path / "state" / "imports" / "running.lock")
    lock.acquire("next", said.append)
    lock.release()
    assert said == []  # the import's lock went with it


def test_a_second_import_waits_for_the_first_and_says_for_whom(tmp_path: Path) -> None:
    """Issue 37: imports of the same range merge by field only once the first import's points are stored; two at
    once (and a second going through the first's stages, stopped when the first is done) did not. A real second
    process holds the lock: this one waits until it lets go, and says whom it waits for."""
    path, done = tmp_path / "imports" / "running.lock", tmp_path / "first-done"
    first = _holder(path, f"time.sleep(1.0); pathlib.Path({str(done)!r}).touch(); lock.release(); time.sleep(60)")
    try:
        said: list[str] = []
        lock = importjob.ImportLock(path)
        lock.acquire("the import second", said.append)
        assert done.exists()  # not before the first let go
        assert len(said) == 1 and said[0].startswith(f"waiting for the import first (pid {first.pid}) to finish")
        lock.release()
    finally:
        first.kill()
        first.wait()


def test_an_import_killed_holding_the_lock_frees_it(tmp_path: Path) -> None:
    path = tmp_path / "imports" / "running.lock"
    first = _holder(path, "time.sleep(60)")
    first.kill()
    first.wait()
    said: list[str] = []
    lock = importjob.ImportLock(path)
    lock.acquire("the import second", said.append)
    lock.release()
    assert said == []


def _holder(path: Path, then: str) -> subprocess.Popen[str]:
    """Another process that takes the import lock as "the import first", says so, then runs ``then``."""
    code = (f"import pathlib, time\nfrom hermeneut.jobs.importjob import ImportLock\n"
            f"lock = ImportLock(pathlib.Path({str(path)!r}))\nlock.acquire('the import first', print)\n"
            f"print('held', flush=True)\n{then.replace('; ', chr(10))}\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_an_import_uses_the_stages_the_main_job_left_running(
    started: list[Stage], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importjob, "running_stages", lambda _s: {"process": 41, "sink": 42, "alerts": 43})
    monkeypatch.setattr(importjob, "group_members", lambda _s: {"process": 1, "sink": 1})
    said: list[str] = []
    with pytest.raises(SystemExit):
        importjob.run_import(_settings(tmp_path), "fake", {}, progress=False, echo=said.append)
    assert started == []  # no second processor in the running one's consumer group
    assert said == ["the import goes through the main job's process (pid 41) and sink (pid 42), left running with "
                    "the local services"]  # fmt: skip


def test_an_import_starts_only_the_stage_whose_consumer_group_is_empty(
    started: list[Stage], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hermeneut process` runs (started by hand: not recorded anywhere but in its consumer group); the sink does
    not: the import starts a sink only."""
    monkeypatch.setattr(importjob, "group_members", lambda _s: {"process": 1, "sink": 0})
    with pytest.raises(SystemExit):
        importjob.run_import(_settings(tmp_path), "fake", {}, progress=False, echo=lambda _l: None)
    assert [s.name for s in started] == ["sink"]


def test_an_import_never_starts_the_dashboard(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`services up --no-web`, then `hermeneut import`: no dashboard was started, and none is (issue 37: one was,
    and stayed up); the summary links a dashboard only where one runs."""
    from collections import Counter

    from click.testing import CliRunner

    from hermeneut.cli import cli
    from pipeline import services
    from producers.importers.driver import ImportReport
    from tests import TESTDATA

    settings = _settings(tmp_path)
    started: list[object] = []
    brought_up: list[object] = []
    monkeypatch.setattr(services, "start_web", lambda *a, **_kw: started.append(a))
    # the local servers are brought up (services.up starts Kafka and InfluxDB, never the dashboard): counted here,
    # not started, so the test neither waits for them nor leaves them running
    monkeypatch.setattr(services, "up", lambda *a, **_kw: brought_up.append(a))
    monkeypatch.setattr(services, "read_state", lambda _s: services.LocalState(run_dir=str(tmp_path)))
    monkeypatch.setattr("hermeneut.cli.importing.resolved", lambda _ctx: settings)
    outcome = importjob.ImportOutcome(ImportReport(), 0, Counter(), True)
    monkeypatch.setattr(importjob, "run_import", lambda *_a, **_kw: outcome)
    nanogpt = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
    args = ["import", "table", str(nanogpt / "gpu_metrics_f4f827dd.csv"), "--mapping", str(nanogpt / "mapping.toml")]
    result = CliRunner().invoke(cli, args, obj={"settings": settings}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(brought_up) == int(settings.uses_local_kafka or settings.uses_local_influxdb)
    assert started == [] and "dashboard" not in result.output
