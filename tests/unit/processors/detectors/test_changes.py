"""Abrupt changes of state as events: a memory collapse (a restart or an unload), a utilization cliff (a job that
stopped computing without ending), a phase shift (checkpoints taking the job's time); and what is none of them."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.events import GpuProcess, Workload
from processors.detectors.changes import collapses
from tests.unit.processors.detectors.driver import T0, S, kinds, run, starts

GIB = 2**30


def test_collapse_rule() -> None:
    total = np.full(4, 80.0 * GIB)
    before = np.array([40.0, 40.0, 8.0, 40.0]) * GIB
    after = np.array([0.5, 3.0, 0.5, np.nan]) * GIB
    assert collapses(before, after, total).tolist() == [True, False, False, False]


@pytest.mark.parametrize("interval", [1, 10, 57])
def test_a_reload_is_one_info_event_and_not_a_leak(interval: int) -> None:
    """A server unloads its model (memory to 0.4 GiB) and loads it again within two minutes, then stays flat for
    10 minutes, with the same process: one info event, no leak (the reload is no growth that goes on)."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu != 1:
            return m
        used = 50.0
        if 1800 <= t < 1800 + 2 * interval:
            used = 0.4
        elif 1800 + 2 * interval <= t < 1920 + 2 * interval:
            used = 0.4 + 49.6 * (t - 1800 - 2 * interval) / 120
        return m | {"memory_used_bytes": used * GIB}

    _det, found, _ = run(2700 + 2 * interval, shape, interval=interval, processes=_same_process)
    assert kinds(found) == {("memory-collapse", "GPU-1")}
    (event,) = starts(found)
    assert event.severity == "info" and "unloaded" in event.summary
    assert event.evidence["memory_before_bytes"] == pytest.approx(50 * GIB)
    (clear,) = [f for f in found if not f.active]
    assert clear.ts_ns - event.ts_ns == pytest.approx(300 * S, abs=interval * S)


def test_a_restart_is_a_warning() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"memory_used_bytes": (0.3 if gpu == 2 and 600 <= t < 640 else 60.0) * GIB}

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        return (GpuProcess(5000 + gpu + (500 if gpu == 2 and t >= 600 else 0), "python", None),)

    _det, found, _ = run(900, shape, processes=processes)
    (event,) = starts(found)
    assert (event.detector, event.gpu_uuid, event.severity) == ("memory-collapse", "GPU-2", "warning")
    assert "restarted" in event.summary and "why the process died" in event.action


def test_a_job_that_stops_computing_without_ending_is_a_cliff() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 5 and t >= 1200:
            return m | {"utilization_gpu_percent": 0.0, "sm_clock_mhz": 1980.0, "power_watts": 90.0}
        return m

    _det, found, _ = run(1800, shape, processes=_same_process)
    (event,) = starts(found, "utilization-cliff")
    assert (event.gpu_uuid, event.severity) == ("GPU-5", "warning")
    assert T0 + 1320 * S <= event.ts_ns <= T0 + 1330 * S
    # the condition still holds when the finding clears: it does not fire again until the GPU works again
    assert len([f for f in found if f.detector == "utilization-cliff" and not f.active]) == 1


def test_an_idle_gpu_that_never_worked_and_a_job_that_ended_are_no_cliff() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 0 or (gpu == 1 and t >= 1200):
            return m | {"utilization_gpu_percent": 0.0, "power_watts": 80.0}
        return m

    def job(t: int, gpu: int) -> Workload | None:
        if gpu == 1 and t >= 1200:
            return None  # the job ended: the scheduler says nothing runs any more
        return Workload("llm-pretraining", job_id="job-7", source="simulator", job_gpus=8)

    _det, found, _ = run(1800, shape, job)
    assert not [f for f in found if f.detector == "utilization-cliff"]


def test_a_server_between_requests_and_a_job_that_left_only_the_display_server_are_no_cliff() -> None:
    """No job id from a scheduler here: GPU 3 serves requests and has a quiet spell; on GPU 4 the compute process
    ends and its memory goes with it, only the display server's graphics process stays (as on a workstation)."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu in (3, 4) and t >= 1200:
            return m | {"utilization_gpu_percent": 0.0, "power_watts": 80.0, "memory_used_bytes": 0.01 * GIB}
        return m | {"memory_used_bytes": 40.0 * GIB}

    def job(_t: int, gpu: int) -> Workload | None:
        return Workload("stable-diffusion-inference" if gpu == 3 else "llm-finetuning", source="inferred")

    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        display = (GpuProcess(1200, "Xorg", 22 * 2**20, "graphics"),)
        if gpu == 4 and t >= 1200:
            return display
        return (*display, GpuProcess(9100 if gpu == 3 else 7000 + gpu, "python", None))  # the server: its own

    _det, found, _ = run(1800, shape, job, processes=processes)
    assert not [f for f in found if f.detector == "utilization-cliff"]
    # the server let its model go while it still runs: that is an event; the ended job's memory is not
    assert kinds(starts(found)) == {("memory-collapse", "GPU-3")}


def test_checkpoints_taking_the_jobs_time_are_a_phase_shift() -> None:
    """A job checkpoints 1 minute of every 40 for two hours, then one minute of every two: each GPU says so once."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        every = 2400 if t < 7200 else 120
        if t % every < 60:  # every rank checkpoints at once
            return m | {"utilization_gpu_percent": 10.0, "sm_active_percent": 2.0, "power_watts": 150.0,
                        "pcie_tx_bytes_per_second": 20e9}  # fmt: skip
        return m

    _det, found, batches = run(10_800, shape, interval=10)
    assert "checkpoint" in {p for b in batches for p in b.phase}
    assert kinds(found) == {("phase-shift", f"GPU-{g}") for g in range(8)}
    event = starts(found)[0]
    assert event.severity == "info" and T0 + 7200 * S < event.ts_ns < T0 + 9000 * S
    assert event.evidence["checkpoint_share_recent"] >= 5 * event.evidence["checkpoint_share_earlier"]


def _same_process(_t: int, gpu: int) -> tuple[GpuProcess, ...]:
    return (GpuProcess(7000 + gpu, "python", None),)
