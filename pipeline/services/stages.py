"""Stages as child processes: how the main job, the evaluation, the integration tests and the benchmarks run
``hermeneut <stage>`` with resolved settings, read its stats file, find its ``/metrics`` and wait for a
condition."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.config import Settings
from pipeline.services import child_env
from pipeline.services.procs import free_port


def read_stats(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


def wait_for(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return check()


@dataclass
class Stage:
    """A hermeneut stage running as a child process, with its log, stats file and ``/metrics`` URL (None when
    ``metrics.enabled`` is off)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    stats_file: Path
    metrics_url: str | None = None

    def stats(self) -> dict[str, Any]:
        return read_stats(self.stats_file)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kept(self) -> dict[str, Any]:
        """How pipeline.services.keep_stages records it, to stop it later from another process."""
        return {"name": self.name, "pid": self.proc.pid, "log": str(self.log), "metrics": self.metrics_url}

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.alive():
            self.proc.terminate()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_stage(
    name: str,
    settings: Settings,
    run_dir: Path,
    *extra: str,
    entry: tuple[str, ...],
    command: tuple[str, ...] | None = None,
    session: bool = False,
) -> Stage:
    """Start ``<entry> <command or name>`` with the (resolved) settings handed over through the environment and its
    ``/metrics`` on a free port of ``metrics.host``. ``entry`` is the face's command line (the core does not name
    the face: hermeneut.stages passes it); ``session``: in a process group of its own, so it can
    outlive the caller and be stopped as a group (pipeline.services.keep_stages)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log, stats = run_dir / f"{name}.log", run_dir / f"{name}.stats.json"
    stats.unlink(missing_ok=True)
    env = child_env(settings) | {"PYTHONUNBUFFERED": "1"}
    argv = [*entry, "-v", *(command or (name,)), "--stats-file", str(stats)]
    metrics_url = None
    if settings.metrics.enabled:
        port = free_port()
        argv += ["--metrics-port", str(port)]
        metrics_url = f"http://{settings.metrics.host}:{port}/metrics"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*argv, *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=session,
        )
    return Stage(name, proc, log, stats, metrics_url)
