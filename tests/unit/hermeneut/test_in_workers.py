"""The offline evaluation's worker pool (``fleeteval.in_workers``) stops at once on SIGINT and SIGTERM, its
workers with it (issue 39: under ``ProcessPoolExecutor`` a SIGINT waited for the running seeds, minutes, and a
SIGTERM left them computing without a parent). Real processes: a script running 10-minute calls, signalled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermeneut.jobs.fleeteval import in_workers
from pipeline.services.stages import wait_for

#: {jobs}: the pool's size; "ready" once the imports are done
SCRIPT = """import time
from hermeneut.jobs.fleeteval import in_workers
print("ready", flush=True)
in_workers(time.sleep, [(600.0,), (600.0,)], {jobs})
"""


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_results_come_back_in_order() -> None:
    assert in_workers(divmod, [(7, 2), (9, 4), (1, 1)], 2) == [(3, 1), (2, 1), (1, 0)]


@pytest.mark.parametrize(("sig", "jobs"), [(signal.SIGINT, 2), (signal.SIGTERM, 2), (signal.SIGTERM, 1)])
def test_a_signal_stops_the_pool_and_its_workers_at_once(sig: signal.Signals, jobs: int) -> None:
    script = SCRIPT.format(jobs=jobs)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert wait_for(lambda: len(children(proc.pid)) >= (jobs if jobs > 1 else 0), 30), "no workers"
        workers = children(proc.pid)
        time.sleep(0.5)  # the calls are running
        sent = time.monotonic()
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert f"RunInterrupted: interrupted by {sig.name}" in err, err
    assert took < 5.0, took
    assert wait_for(lambda: not any(running(w) for w in workers), 5), workers
