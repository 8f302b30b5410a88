"""The job-level brake where the GPUs log an SM clock: the clock tells a held-back job from lighter work.

Every GPU of an 8-GPU job drops to 60% of its busy power at the same utilization from minute 5 (the case the power
and utilization columns alone leave open, tests/unit/processors/detectors/test_real_overlays.py); what the SM clock
does meanwhile decides. Magnitudes on both sides of the 0.95 clock ratio (job_pace.CLOCK_RATIO).
"""

from __future__ import annotations

import pytest

from pipeline.events import GpuProcess, Workload
from processors.detectors.job_pace import CLOCK_RATIO
from tests.unit.processors.detectors.driver import T0, S, run, starts

AT = 300
#: busy_h100's SM clock
CLOCK_MHZ = 1830.0


def _job_at(clock_share: float | None, power_share: float = 0.6):
    """From AT, every GPU at ``power_share`` of its power and ``clock_share`` of its SM clock (None: no SM clock
    column at all, before or after)."""

    def shape(t: int, _gpu: int, m: dict[str, float]) -> dict[str, float]:
        if clock_share is None:
            m = {k: v for k, v in m.items() if k not in ("sm_clock_mhz", "sm_clock_max_mhz")}
        if t < AT:
            return m
        out = m | {"power_watts": m["power_watts"] * power_share}
        if clock_share is not None:
            out["sm_clock_mhz"] = round(m["sm_clock_mhz"] * clock_share)
        return out

    return shape


@pytest.mark.parametrize("clock_share", [0.5, 0.85, 0.92])
def test_a_job_held_at_a_lower_clock_is_a_confirmed_brake(clock_share: float) -> None:
    _det, found, _ = run(600, _job_at(clock_share))
    slow = starts(found)
    assert [(f.detector, f.gpu_uuid, f.severity) for f in slow] == [("job-slowdown", None, "warning")]
    assert T0 + AT * S < slow[0].ts_ns <= T0 + (AT + 180) * S
    assert f"SM clock {clock_share * CLOCK_MHZ / 1980 * 100:.0f}% of max" in slow[0].summary
    before = slow[0].evidence["reference_sm_clock_ratio"]
    assert before == pytest.approx(CLOCK_MHZ / 1980, rel=0.01)
    assert f"against {before * 100:.0f}% busy before" in slow[0].summary
    assert "lighter work" not in slow[0].summary
    assert slow[0].evidence["sm_clock_ratio"] == pytest.approx(clock_share * CLOCK_MHZ / 1980, rel=0.01)


@pytest.mark.parametrize("clock_share", [0.97, 1.0, 1.08])
def test_lower_power_at_the_same_clock_is_lighter_work_not_a_brake(clock_share: float) -> None:
    """The power fell by 40% while the clock stayed within 5% of where it was (or rose: a memory-bound phase with
    headroom): no brake can take that much power at that clock, so nothing is found."""
    assert clock_share > CLOCK_RATIO
    _det, found, _ = run(600, _job_at(clock_share))
    assert starts(found) == []


def test_without_an_sm_clock_the_brake_stays_an_info_that_names_both_readings() -> None:
    _det, found, _ = run(600, _job_at(None))
    slow = starts(found)
    assert [(f.detector, f.gpu_uuid, f.severity) for f in slow] == [("job-slowdown", None, "info")]
    assert "or at lighter work" in slow[0].summary
    assert "sm_clock_ratio" not in slow[0].evidence


def test_a_small_power_dip_is_no_brake_whatever_the_clock() -> None:
    """At 85% of its power (above the 0.75 power ratio) the job is not braked, even at a lower clock."""
    _det, found, _ = run(600, _job_at(0.8, power_share=0.85))
    assert starts(found) == []


def _python(_t: int, gpu: int) -> tuple[GpuProcess, ...]:
    return (GpuProcess(7000 + gpu, "python", None),)


def _idle_at(idle: set[int]):
    def shape(t: int, _gpu: int, m: dict[str, float]) -> dict[str, float]:
        if t in idle:
            return m | {"utilization_gpu_percent": 0.0, "sm_active_percent": 0.0, "power_watts": 90.0}
        return m

    return shape


def test_three_readings_30_s_apart_are_too_few_to_call_a_job_starved() -> None:
    """Seed 55667's day one at 30 s: a healthy job's data-loading pauses caught twice in three readings (idle, busy,
    idle) made 90 s "idle 67% of the time, in fits and starts", three false warnings. Nine readings are asked, as a
    10 s poller's 90 s hold: the same pauses are no finding, and a job idle in every other reading for ten minutes
    is one."""
    pauses = {900, 960, 2100, 2160}
    _det, found, _ = run(3600, _idle_at(pauses), gpus=2, interval=30)
    assert not [f for f in found if f.detector == "job-slowdown"]
    starved = set(range(900, 1500, 60))
    _det, found, _ = run(3600, _idle_at(starved), gpus=2, interval=30)
    (first,) = starts(found)
    assert first.detector == "job-slowdown" and "waits on its input" in first.summary
    assert T0 + 900 * S < first.ts_ns <= T0 + 1500 * S


@pytest.mark.parametrize("application", ["stable-diffusion-inference", None])
def test_a_server_idle_between_requests_is_not_starved(application: str | None) -> None:
    """Seed 55667's day one at 30 s: a 2-GPU Stable Diffusion server, busy in one reading of two or three for an hour,
    was "the job waits on its input" five times. A server idles between requests; a job nobody named may be one:
    neither is judged starved (the same readings of a training job are, above)."""

    def job(_t: int, _gpu: int) -> Workload | None:
        if application is None:
            return None
        return Workload(application, job_id="sd-1", source="simulator", confidence=1.0, job_gpus=2)

    starved = set(range(900, 1500, 60))
    _det, found, _ = run(3600, _idle_at(starved), job=job, gpus=2, interval=30, processes=_python)
    assert not [f for f in found if f.detector == "job-slowdown"]
