"""Abrupt changes of state as events: a memory collapse (a restart or an unload), a utilization cliff (a job that
stopped computing without ending), a phase shift (checkpoints taking the job's time); and what is none of them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pynvml
import pytest

from pipeline.events import GpuProcess, Workload
from processors.detectors.changes import collapses
from tests.unit.processors.detectors.driver import T0, S, kinds, pretraining, run, starts

HW_POWER_BRAKE = pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown

GIB = 2**30


def _serving(_t: int, _gpu: int) -> Workload:
    return Workload("llm-serving", job_id="serve-1", source="simulator", confidence=1.0, job_gpus=1)


def _same_process(_t: int, gpu: int) -> tuple[GpuProcess, ...]:
    return (GpuProcess(7000 + gpu, "python", None),)


@pytest.mark.parametrize(
    ("before", "after", "total", "collapse"),
    [
        (11.5, 0.5, 48, True),  # a real serving trace's collapses from 10 to 11.5 GiB of 48 GiB, missed before
        (10.0, 0.5, 48, True),
        (60.0, 3.0, 80, True),  # a tenth of 60 GiB is above 1 GiB: what an unloading server keeps
        (60.0, 6.5, 80, False),
        (10.0, 2.0, 80, False),  # a fifth left: a job freeing activations
        (10.0, 0.9, 80, True),
        (4.2, 0.5, 48, True),
        (3.9, 0.0, 48, False),  # no model's level to fall from
        (3.0, 0.0, 48, False),
        (10.0, 0.5, 192, True),  # 5 % of 192 GiB is 9.6 GiB
        (9.5, 0.5, 192, False),
        (40.0, np.nan, 80, False),  # no reading is no fall
        (np.nan, 0.5, 80, False),
        (40.0, 0.5, np.nan, False),
    ],
)
def test_collapse_rule(before: float, after: float, total: float, collapse: bool) -> None:
    """From a model's level (above 4 GiB and 5 % of the GPU) to below 1 GiB or a tenth of the level before."""
    got = collapses(np.array([before * GIB]), np.array([after * GIB]), np.array([total * GIB]))
    assert got.tolist() == [collapse]


@pytest.mark.parametrize("interval", [1, 10, 57])
def test_a_reload_is_one_info_event_and_not_a_leak(interval: int) -> None:
    """A server unloads its model (memory to 0.4 GiB) and loads it again within two minutes, then stays flat for
    10 minutes, with the same process: one info event, no leak (the reload is no growth that goes on). Its repeats
    and its clear still say where memory fell to, and where it is now apart from that."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu != 1:
            return m
        used = 50.0
        if 1800 <= t < 1800 + 2 * interval:
            used = 0.4
        elif 1800 + 2 * interval <= t < 1920 + 2 * interval:
            used = 0.4 + 49.6 * (t - 1800 - 2 * interval) / 120
        return m | {"memory_used_bytes": used * GIB}

    _det, found, _ = run(2700 + 2 * interval, shape, _serving, interval=interval, processes=_same_process)
    assert kinds(found) == {("memory-collapse", "GPU-1")}
    (event,) = starts(found)
    assert event.severity == "info" and "unloaded" in event.summary
    assert "fell from 50.0 GiB to 0.4 GiB between two samples while" in event.summary
    assert event.evidence["memory_before_bytes"] == pytest.approx(50 * GIB)
    assert event.evidence["memory_after_bytes"] == pytest.approx(0.4 * GIB)
    records = [f for f in found if f.detector == "memory-collapse"]
    assert len(records) >= 3 and {f.severity for f in records} == {"info"}  # a server letting its model go
    assert all("to 0.4 GiB" in f.summary and f.evidence["memory_after_bytes"] == event.evidence["memory_after_bytes"]
               for f in records)  # fmt: skip
    (clear,) = [f for f in found if not f.active]
    assert clear.ts_ns - event.ts_ns == pytest.approx(300 * S, abs=interval * S)
    assert "(now 50.0 GiB)" in clear.summary and clear.evidence["memory_used_bytes"] == pytest.approx(50 * GIB)


@pytest.mark.parametrize("rounds_per_batch", [1, 7])
def test_a_running_job_that_lost_its_model_is_a_warning_once_it_goes_on(rounds_per_batch: int) -> None:
    """A training job's memory falls from 60 GiB to 2 GiB and its process goes on (a caught out-of-memory error,
    a model moved off the GPU), then reloads: info at the fall, a warning once the same process has held the GPU
    for 60 s more in the same job; the 'to' value stays 2 GiB while memory comes back. Live (a round a batch) or
    replayed (7 rounds a batch)."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        used = 60.0 if gpu != 1 or t < 600 else 2.0 if t < 700 else 40.0
        return m | {"memory_used_bytes": used * GIB}

    _det, found, _ = run(1200, shape, interval=10, processes=_same_process, rounds_per_batch=rounds_per_batch)
    records = [f for f in found if f.detector == "memory-collapse"]
    assert {f.gpu_uuid for f in records} == {"GPU-1"}
    (event,) = starts(found)
    assert event.ts_ns == T0 + 600 * S and event.severity == "info"
    warning = next(f for f in records if f.severity == "warning")
    assert [f.severity for f in records if f.ts_ns < warning.ts_ns] == ["info"]
    assert {f.severity for f in records if f.ts_ns >= warning.ts_ns} == {"warning"}
    assert warning.active and warning.ts_ns == T0 + 660 * S and warning.since_ns == event.ts_ns
    assert "same compute processes still hold it 60 s later" in warning.summary
    assert "a running job lost its model" in warning.summary and warning.evidence["went_on_s"] == 60.0
    # the clear, memory back at 40 GiB: fell to 2 GiB, now 40 GiB; still the warning it became
    (clear,) = [f for f in records if not f.active]
    assert "fell from 60.0 GiB to 2.0 GiB between two samples (now 40.0 GiB)" in clear.summary
    assert clear.severity == "warning" and clear.evidence["memory_after_bytes"] == 2.0 * GIB


def _ended(t: int, gpu: int) -> tuple[GpuProcess, ...]:
    """GPU 1's process exits 20 s after its memory went (at t=600)."""
    return () if gpu == 1 and t >= 620 else _same_process(t, gpu)


def _new_job(t: int, gpu: int) -> Workload:
    """GPU 1 gets another job 30 s after its memory went."""
    return Workload("llm-pretraining", job_id="job-8" if gpu == 1 and t >= 630 else "job-7", source="simulator",
                    confidence=1.0, job_gpus=8)  # fmt: skip


@pytest.mark.parametrize(
    ("job", "processes", "rounds_per_batch"),
    [
        (pretraining, _ended, 1),  # the job ends: its process frees its memory, then exits
        (pretraining, _ended, 7),  # the same, replayed 7 rounds a batch
        (pretraining, None, 1),  # no process list: whether the process goes on is not known
        (_new_job, _same_process, 1),  # a job boundary within the minute
        (_serving, _same_process, 1),  # a server scales in
    ],
)
def test_a_collapse_the_job_does_not_go_on_from_stays_info(
    job: Callable[[int, int], Workload],
    processes: Callable[[int, int], tuple[GpuProcess, ...]] | None,
    rounds_per_batch: int,
) -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"memory_used_bytes": (60.0 if gpu != 1 or t < 600 else 0.5) * GIB}

    _det, found, _ = run(1200, shape, job, interval=10, processes=processes, rounds_per_batch=rounds_per_batch)
    records = [f for f in found if f.detector == "memory-collapse"]
    assert kinds(found) == {("memory-collapse", "GPU-1")}
    assert {f.severity for f in records} == {"info"} and not any("went_on_s" in f.evidence for f in records)


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


def _stops_at_1200(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
    if gpu == 5 and t >= 1200:
        return m | {"utilization_gpu_percent": 0.0, "power_watts": 90.0}
    return m


def test_a_cliff_without_a_process_list_is_info_and_says_a_finished_job_looks_alike() -> None:
    """An imported nvidia-smi log whose context declares the job for the whole file (issue 38's co-located nanoGPT
    run idles its last 2.5 min): with no process list, a hung job and one that finished its work look alike."""
    _det, found, _ = run(1800, _stops_at_1200)
    (event,) = starts(found, "utilization-cliff")
    assert (event.gpu_uuid, event.severity) == ("GPU-5", "info")
    assert "no process list" in event.summary and "look alike" in event.summary
    assert "compute processes" not in event.summary


def test_a_cliff_whose_process_list_shows_no_compute_process_left_is_none() -> None:
    def processes(t: int, gpu: int) -> tuple[GpuProcess, ...]:
        return () if gpu == 5 and t >= 1200 else _same_process(t, gpu)

    _det, found, _ = run(1800, _stops_at_1200, processes=processes)
    assert not starts(found, "utilization-cliff")


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


def test_a_power_brake_is_not_read_as_checkpoints() -> None:
    """The same job as below, checkpointing 1 minute in 40 throughout; from t=7200 a power brake holds GPU 1 at 150 W
    (issue 39's seeds: a brake or a downed NVLink turned into "phase shift: 37% of the last 30 min in checkpoints").
    GPU 1 says power-brake and nothing about checkpoints; the other GPUs say nothing."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t % 2400 < 60:
            return m | {"utilization_gpu_percent": 10.0, "sm_active_percent": 2.0, "power_watts": 150.0,
                        "pcie_tx_bytes_per_second": 20e9}  # fmt: skip
        if gpu == 1 and t >= 7200:
            return m | {"throttle_reasons_mask": float(HW_POWER_BRAKE), "sm_clock_mhz": 690.0, "power_watts": 150.0}
        return m

    _det, found, _ = run(10_800, shape, interval=10)
    assert kinds(found) == {("power-brake", "GPU-1")}


def test_a_job_waiting_on_one_of_its_gpus_is_not_read_as_checkpoints() -> None:
    """The same job, checkpointing 1 minute in 40 throughout; from t=7200 GPU 1's NVLinks are down (10 of 18) and the
    other GPUs wait on it in every other step, at 250 W of their 690 W (issue 39's seed 11213 at 60 s: the peers of a
    straggler and of a downed NVLink read "phase shift: 31% of the last 30 min in checkpoints"). GPU 1 says NVLink
    down, naming the GPUs that wait on it; none of them says anything about checkpoints."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t % 2400 < 60:
            return m | {"utilization_gpu_percent": 10.0, "sm_active_percent": 2.0, "power_watts": 150.0,
                        "pcie_tx_bytes_per_second": 20e9}  # fmt: skip
        if t >= 7200 and gpu == 1:
            return m | {"nvlink_links_active": 10.0}
        if t >= 7200 and t // 10 % 2:
            return m | {"power_watts": 250.0}
        return m

    _det, found, _ = run(10_800, shape, interval=10)
    assert kinds(found) == {("nvlink-down", "GPU-1")}


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


def test_a_fall_of_demand_on_a_gpu_whose_application_nobody_named_is_no_phase_shift() -> None:
    """Seed 44556's day one at 60 s: an LLM server on a node without context (no classifier yet) served at 90%
    utilization for 1.5 hours, then its evening came (10%, a fifth of its power). Its low power read as 42% of its
    time in checkpoint-like dips, a phase shift; nobody said it trains. GPUs 0-3 run unnamed compute processes, GPUs
    4-7 a named pre-training job: only the named job's dips are checkpoints."""

    def shape(t: int, _gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t >= 5400:
            return m | {"utilization_gpu_percent": 10.0, "sm_active_percent": 6.0, "power_watts": 110.0}
        return m

    def job(_t: int, gpu: int) -> Workload | None:
        return pretraining(_t, gpu) if gpu >= 4 else None

    _det, found, _ = run(9000, shape, job=job, interval=60, processes=_same_process)
    assert kinds(found) == {("phase-shift", f"GPU-{g}") for g in range(4, 8)}
