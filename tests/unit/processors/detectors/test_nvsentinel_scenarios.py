"""Acceptance scenarios from a real fleet's issues (NVIDIA NVSentinel): what an operator of GB200/H100 nodes saw a
health monitor get wrong, replayed through the detectors.

- #1701: NVLinks are briefly down after every node boot while they train; a maintenance reboot is not "NVLink down"
  (the first boot, and a return after a silence).
- #1447: the SW power-cap reason flaps healthy <-> unhealthy at every sample on a busy GPU (boost clocks meeting
  the power limit, normal): no finding at all, and a real cap whose reason flaps is one finding, not hundreds.
- #1666: a continuously asserted hardware power brake (bit 0x80) on two GPUs of a node is found and said.
"""

from __future__ import annotations

import numpy as np
import pynvml

from pipeline.config import DetectorSettings
from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink
from processors.detectors.stage import Detectors
from tests.unit.processors.detectors.driver import MODEL, SW_POWER_CAP, T0, S, kinds, run, starts

HW_POWER_BRAKE = pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown


def _nvswitch_node(gpus: int) -> Detectors:
    topo = NodeTopology(
        "c1", "node-1", T0,
        tuple(TopologyGpu(f"GPU-{i}", i, MODEL, f"0000:{i:02x}:00.0", numa_node=0, nvlink_links=18)
              for i in range(gpus)),
        tuple(TopologyLink(f"GPU-{a}", f"GPU-{b}", "NV18", 18) for a in range(gpus) for b in range(a + 1, gpus)),
    )  # fmt: skip
    return Detectors(DetectorSettings(), lambda _cluster, _node: topo)


def test_nvlinks_training_after_a_boot_are_not_down_and_one_that_never_trains_is() -> None:
    """The node boots at t=0: its GPUs' 18 links come up one by one over 40 s (traffic once all are up). GPU 2's
    link 17 never trains: that one is NVLink down, found once the boot's two minutes are over."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        up = min(18.0, float(t * 18 // 40))
        if gpu == 2:
            up = min(up, 17.0)
        busy = up == 18.0
        return m | {"nvlink_links_active": up, "nvlink_tx_bytes_per_second": 120e9 if busy else 0.0,
                    "nvlink_rx_bytes_per_second": 120e9 if busy else 0.0}  # fmt: skip

    _det, found, _ = run(400, shape, gpus=4, detectors=_nvswitch_node(4))
    assert kinds(found) == {("nvlink-down", "GPU-2")}
    (down,) = starts(found)
    assert T0 + 120 * S <= down.ts_ns <= T0 + 130 * S
    assert down.evidence["links_active"] == 17 and down.evidence["links_expected"] == 18


def test_a_maintenance_reboot_of_a_node_seen_for_hours_is_a_boot_too() -> None:
    """The node ran for 10 minutes with every link up, went silent for 5 minutes (a maintenance reboot), and
    trains its links again over 40 s when it is back: a boot, not NVLink down (the GPU's first sample is long past,
    so only its return after the silence tells). GPU 1 comes back with a link that never trains: found."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        if 600 <= t < 900:
            return None  # rebooting: no samples
        up = 18.0 if t < 600 else min(18.0, float((t - 900) * 18 // 40))
        if gpu == 1 and t >= 900:
            up = min(up, 17.0)
        return m | {"nvlink_links_active": up}

    _det, found, _ = run(1200, shape, gpus=4, detectors=_nvswitch_node(4))
    assert {(f.detector, f.gpu_uuid) for f in found if f.detector == "nvlink-down"} == {("nvlink-down", "GPU-1")}
    (down,) = [f for f in starts(found) if f.detector == "nvlink-down"]
    assert T0 + 1020 * S <= down.ts_ns <= T0 + 1035 * S  # the boot's two minutes after the return


def test_a_power_cap_reason_flapping_at_every_sample_is_no_finding_and_a_real_cap_is_one() -> None:
    """8 busy H100s at their default limit, the SW power-cap reason on at random on half the samples for 20 minutes:
    how boost clocks meet the limit, no finding. Then GPU 5's limit is lowered to 450 W for 10 minutes while its
    reason keeps flapping: one power-capping episode."""
    rng = np.random.default_rng(1447)
    flaps = rng.random((1800, 8)) < 0.5

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        m = m | {"throttle_reasons_mask": float(SW_POWER_CAP) if flaps[t, gpu] else 0.0, "power_watts": 695.0}
        if gpu == 5 and 1200 <= t < 1800:
            m |= {"power_limit_watts": 450.0, "power_watts": 448.0}
        return m

    _det, found, _ = run(1800, shape)
    assert {f.detector for f in found} == {"power-capping"}
    assert len({(f.detector, f.since_ns) for f in found}) == 1
    assert all(f.ts_ns >= T0 + 1200 * S for f in found)


def test_a_hardware_power_brake_held_on_two_gpus_is_found_and_said() -> None:
    """A datacenter power event asserts the HW power brake on GPUs 1 and 6 of a node from t=120 on, cool (62 C) and
    clock-limited: a power-brake warning on each, naming the brake and the power supply, not cooling."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu in (1, 6) and t >= 120:
            return m | {"throttle_reasons_mask": float(HW_POWER_BRAKE), "sm_clock_mhz": 690.0, "power_watts": 290.0,
                        "temperature_gpu_celsius": 62.0}  # fmt: skip
        return m

    _det, found, _ = run(900, shape)
    assert kinds(found) == {("power-brake", "GPU-1"), ("power-brake", "GPU-6")}
    first = starts(found)[0]
    assert T0 + 120 * S <= first.ts_ns <= T0 + 135 * S and first.severity == "warning"
    assert "HW power brake" in first.summary and "35%" in first.summary
    assert "power supplies" in first.action and "cooling" not in first.action
