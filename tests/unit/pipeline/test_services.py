"""The local services' bookkeeping with real processes standing in for the servers (a sleeping Python whose command
line names the server's run folder, as a broker's or influxd's does): a recorded server that runs but does not
answer, or whose process is gone, is reported in one line and nothing is stopped or started; a pid that another
process took (no run folder on its command line) is not the server. tests/integration/test_local_services.py does
the same with real Kafka and InfluxDB."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import services
from pipeline.config import ServiceSettings, Settings
from pipeline.errors import ServiceError
from pipeline.services.procs import free_port, pid_alive, runs_in
from pipeline.services.stages import wait_for


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose command line names tmp_path/run/kafka, like a broker started there."""
    folder = tmp_path / "run" / "kafka"
    folder.mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(folder / "server.properties")])
    # for a moment after exec the kernel shows an empty command line (as for a zombie): wait until it is there
    assert wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes() != b"", 10)
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_is_the_server_only_while_its_command_line_names_the_run_folder(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    assert runs_in(sleeper.pid, tmp_path / "run" / "kafka")
    assert not runs_in(sleeper.pid, tmp_path / "run" / "influxdb")  # a pid another process took
    sleeper.kill()
    sleeper.wait()
    assert not runs_in(sleeper.pid, tmp_path / "run" / "kafka")


def _recorded(tmp_path: Path, pid: int, port: int) -> Settings:
    settings = Settings(services=ServiceSettings(cache_dir=tmp_path / "cache", state_dir=tmp_path / "state"))
    kafka = {"version": "4.1.1", "port": port, "pid": pid, "bootstrap_servers": f"127.0.0.1:{port}",
             "log": str(tmp_path / "run" / "kafka" / "kafka.log")}  # fmt: skip
    state = {"run_dir": str(tmp_path / "run"), "kafka": kafka, "influxdb": None, "web": None, "stages": None}
    services.state_path(settings).parent.mkdir(parents=True)
    services.state_path(settings).write_text(json.dumps(state))
    return settings.model_copy(update={"influxdb": settings.influxdb.model_copy(update={"url": "http://x:1"})})


def test_a_recorded_broker_that_runs_but_does_not_answer_is_reported_and_left_running(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    port = free_port()  # nothing listens: the "broker" does not answer
    settings = _recorded(tmp_path, sleeper.pid, port)
    before = services.state_path(settings).read_text()
    for restart in (False, True):
        with pytest.raises(ServiceError) as caught:
            services.up(settings, restart=restart)
        assert str(caught.value) == (
            f"local Kafka (pid {sleeper.pid}, 127.0.0.1:{port}) runs but does not answer: if it is starting or "
            f"recovering, wait and retry; if it hangs, stop it (kill {sleeper.pid}) and run `hermeneut services up`, "
            f"which restarts it with its data on the same port (log: {tmp_path / 'run' / 'kafka' / 'kafka.log'})"
        )
    assert pid_alive(sleeper.pid) and services.state_path(settings).read_text() == before
    assert not (tmp_path / "state" / "runs").exists()  # no new run folder
    log = tmp_path / "run" / "kafka" / "kafka.log"
    assert services.status(settings)["kafka"] == f"not answering (pid {sleeper.pid} runs; log {log})"


def test_a_recorded_broker_whose_process_is_gone_is_reported_by_any_command_but_services_up(
    sleeper: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    settings = _recorded(tmp_path, sleeper.pid, free_port())
    sleeper.kill()
    sleeper.wait()
    with pytest.raises(ServiceError, match=r"is not running .* `hermeneut services up` restarts it with its data"):
        services.up(settings)
    assert not (tmp_path / "state" / "runs").exists()
    assert services.status(settings)["kafka"] == "down (local; `hermeneut services up` starts it)"
