"""Every claim a finding's wording makes holds on the row it describes (issue 11: "while busy" said of an idle
GPU): hypothesis draws a state per GPU (utilization, temperature, clocks, the clocks-event reasons, PCIe generation
and width, NVLinks up) held from the 30th second on, after a healthy start; whatever the detectors conclude, what
they say of it must be what the state shows."""

from __future__ import annotations

import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.events import Finding
from pipeline.vocab import HW_POWER_BRAKE, HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from tests.unit.processors.detectors.driver import run

GPUS = 4
REASONS = (0, SW_POWER_CAP, HW_SLOWDOWN, HW_THERMAL, SW_THERMAL, HW_POWER_BRAKE)
STATE = st.fixed_dictionaries(
    {
        "utilization_gpu_percent": st.sampled_from([0.0, 12.0, 39.0, 41.0, 75.0, 99.0]),
        "temperature_gpu_celsius": st.sampled_from([35.0, 62.0, 86.0, 87.0, 89.0]),
        "sm_clock_mhz": st.sampled_from([690.0, 1230.0, 1830.0]),
        "throttle_reasons_mask": st.lists(st.sampled_from(REASONS), max_size=3).map(lambda r: float(sum(set(r)))),
        "pcie_link_gen": st.sampled_from([5.0, 4.0, 3.0]),
        "pcie_link_width": st.sampled_from([16.0, 8.0, 4.0]),
        "nvlink_links_active": st.sampled_from([18.0, 17.0, 0.0]),
    }
)


def _pct(text: str, label: str) -> float | None:
    found = re.search(label + r" ([0-9?]+)%", text)
    return None if found is None or found.group(1) == "?" else float(found.group(1))


def _check(f: Finding, state: dict[str, float]) -> None:
    util, mask = state["utilization_gpu_percent"], int(state["throttle_reasons_mask"])
    text = f.summary
    if "while busy" in text:
        assert util > 40, text
    if (said := _pct(text, "util")) is not None:
        assert said == round(util), text
    if f.detector == "thermal-throttling":
        assert f"at {state['temperature_gpu_celsius']:.0f} C" in text, text
        if "HW thermal slowdown" in text:
            assert mask & (HW_THERMAL | HW_SLOWDOWN), text
        if "SW thermal slowdown" in text:
            assert mask & SW_THERMAL, text
    if f.detector == "power-brake":
        assert ("HW power brake" in text) == bool(mask & HW_POWER_BRAKE), text
        assert "cooling" not in f.action
    if f.detector == "pcie-link-degraded":
        assert f"Gen{state['pcie_link_gen']:.0f} x{state['pcie_link_width']:.0f} of Gen5 x16" in text, text
    if f.detector == "nvlink-down":
        assert f.evidence["links_active"] == state["nvlink_links_active"] < 18, text
    if (clock := _pct(text, "SM clock at")) is not None:
        assert clock == round(state["sm_clock_mhz"] / 1980 * 100), text


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STATE, min_size=GPUS, max_size=GPUS))
def test_every_claim_of_every_finding_holds_on_its_row(states: list[dict[str, float]]) -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | states[gpu] if t >= 30 else m

    _det, found, _ = run(330, shape, gpus=GPUS)
    for f in found:
        if f.active and f.gpu_uuid is not None and f.ts_ns >= f.since_ns:
            _check(f, states[int(f.gpu_uuid.removeprefix("GPU-"))])
