"""``hermeneut evaluate`` through Kafka, as a person runs it (a subprocess), stopped from outside (issue 39):

- SIGINT or SIGTERM to it: it exits within seconds with 128 + the signal and one line, prints no score, and leaves
  no process it started: simulator, processor and sink, and the local Kafka and influxd where it started them; a
  pair it did not start (the tests' servers) keeps running;
- SIGTERM to its simulator mid-history: the simulator drains and exits 0 with part of its history published; the
  run is truncated, so it is not scored (exit 4, one line), never scored as complete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline.config import ServiceSettings, Settings, settings_env
from pipeline.services.procs import pid_alive, port_open
from pipeline.services.stages import read_stats, wait_for

from .conftest import InfluxServer, KafkaServer

pytestmark = pytest.mark.integration

#: a small fleet whose fast-forward outlasts the test: 2 h at the tests' 1 s interval, no learning first
ARGS = ("evaluate", "--nodes", "1", "--gpus", "2", "--hours", "2", "--learn-hours", "0", "--faults-per-class", "1")
#: seconds an interrupted evaluation may take to stop everything (each child gets 5 s before SIGKILL, in parallel)
STOP_BOUND_S = 15.0


def descendants(pid: int) -> dict[int, str]:
    """The live processes under ``pid`` (from /proc), with their command lines."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: dict[int, str] = {}
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                except OSError:
                    continue
                frontier.append(child)
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stages(processes: dict[int, str]) -> set[str]:
    """The hermeneut commands among ``processes`` (``python -m hermeneut.cli -v <command> ...``)."""
    return {cmd.split()[4] for cmd in processes.values() if " hermeneut.cli -v " in cmd}


def simulator_of(pid: int) -> int | None:
    return next((p for p, cmd in descendants(pid).items() if " simulate " in cmd), None)


@contextmanager
def evaluate(env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    """``hermeneut evaluate`` in a session of its own (killed as a group if a test fails midway)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermeneut.cli", *ARGS],
        env=os.environ | env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def simulating(proc: subprocess.Popen[str], timeout_s: float = 180.0) -> tuple[int, dict[int, str]]:
    """Wait until the simulator publishes history; its pid and every process under the evaluation then."""
    assert wait_for(lambda: simulator_of(proc.pid) is not None or proc.poll() is not None, timeout_s), "no simulator"
    sim = simulator_of(proc.pid)
    assert sim is not None, proc.communicate()
    stats = Path(descendants(proc.pid)[sim].split(" --stats-file ")[1].split()[0])
    assert wait_for(lambda: read_stats(stats).get("fast_forward_rounds", 0) > 0, 60), "the simulator published nothing"
    return sim, descendants(proc.pid)


def interrupt(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[float, str, str]:
    """Send ``sig``; seconds until it exited, its stdout and stderr."""
    sent = time.monotonic()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return time.monotonic() - sent, out, err


def assert_stopped_unscored(rc: int, sig: signal.Signals, took: float, out: str, err: str) -> None:
    assert rc == 128 + sig, (rc, out, err)
    assert took < STOP_BOUND_S, (took, err)
    assert err.strip().splitlines()[-1] == (
        f"hermeneut: interrupted by {sig.name}: every process this evaluation started is stopped; nothing is scored"
    )
    assert "F1" not in out and "accepted" not in out, out


def test_sigint_stops_every_child_and_leaves_servers_it_did_not_start(
    settings: Settings, kafka_server: KafkaServer, influx_server: InfluxServer
) -> None:
    with evaluate(settings_env(settings)) as proc:
        _sim, children = simulating(proc)
        assert stages(children) == {"process", "sink", "simulate"}, children
        took, out, err = interrupt(proc, signal.SIGINT)
    assert_stopped_unscored(proc.returncode, signal.SIGINT, took, out, err)
    assert [cmd for pid, cmd in children.items() if running(pid)] == []
    # the tests' own servers were running before: never stopped by a command that did not start them
    assert pid_alive(kafka_server.proc.pid) and pid_alive(influx_server.proc.pid)


def test_sigterm_also_stops_the_local_servers_it_started(tmp_path: Path, defaults: Settings) -> None:
    local = Settings(services=ServiceSettings(cache_dir=defaults.services.cache_dir, state_dir=tmp_path / "state"))
    env = {k: v for k, v in settings_env(local).items() if k.startswith("HERMENEUT_SERVICES__")}
    with evaluate(env) as proc:
        _sim, children = simulating(proc)
        state = json.loads((tmp_path / "state" / "services.json").read_text())
        servers = {name: (int(state[name]["pid"]), int(state[name]["port"])) for name in ("kafka", "influxdb")}
        took, out, err = interrupt(proc, signal.SIGTERM)
    assert_stopped_unscored(proc.returncode, signal.SIGTERM, took, out, err)
    assert [cmd for pid, cmd in children.items() if running(pid)] == []
    # stopped after the stages, at exit: the servers' own shutdown is not bounded by STOP_BOUND_S
    assert wait_for(lambda: not any(running(pid) or port_open(port) for pid, port in servers.values()), 30), servers
    assert not (tmp_path / "state" / "services.json").exists()


def test_a_simulator_stopped_midway_is_truncated_not_scored(settings: Settings) -> None:
    with evaluate(settings_env(settings)) as proc:
        sim, children = simulating(proc)
        os.kill(sim, signal.SIGTERM)  # it drains what it read and exits 0: only its rounds tell it stopped short
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 4, (proc.returncode, out, err)
    line = err.strip().splitlines()[-1]
    assert line.startswith("hermeneut: the simulator exited with code 0 after "), line
    assert " of 7200 rounds " in line and "the run is truncated, not scored" in line, line
    assert "F1" not in out and "accepted" not in out, out
    assert [cmd for pid, cmd in children.items() if running(pid)] == []
