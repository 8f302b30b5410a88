"""The job-level brake where the GPUs log an SM clock: the clock tells a held-back job from lighter work.

Every GPU of an 8-GPU job drops to 60% of its busy power at the same utilization from minute 5 (the case the power
and utilization columns alone leave open, tests/unit/processors/detectors/test_real_overlays.py); what the SM clock
does meanwhile decides. Magnitudes on both sides of the 0.95 clock ratio (job_pace.CLOCK_RATIO).
"""

from __future__ import annotations

import pytest

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
