"""Acceptance scenarios from a real fleet's issues (NVIDIA NVSentinel): what an operator of GB200/H100 nodes saw a
health monitor get wrong, replayed through the detectors.

- #1701: NVLinks are briefly down after every node boot while they train; a maintenance reboot is not "NVLink down"
  (the first boot, and a return after a silence).
- #1447: the SW power-cap reason flaps healthy <-> unhealthy at every sample on a busy GPU (boost clocks meeting
  the power limit, normal): no finding at all, and a real cap whose reason flaps is one finding, not hundreds.
- #1666: a continuously asserted hardware power brake (bit 0x80) on two GPUs of a node is found and said.
- #1481: an A100 80GB PCIe without an NVLink bridge reports its 12 link slots inactive; DCGM's health watch read that
  as "NvLink link 0 ... 11 is currently down" on every such GPU. No bridge is no NVLink; a bridged pair's link that
  drops is still found.
- #1629, #1710: XID 45 (the driver's cleanup of an aborted application's channels) comes in bursts at every job
  crash's teardown and with normal application churn; NVIDIA's Xid catalogue says "Solo: RESTART_APP / Not solo:
  IGNORE (follow other Xid)". Neither a teardown's burst nor hours of churn is a storm or a page, and an XID 45 after
  a real XID does not take its place.
"""

from __future__ import annotations

import numpy as np
import pynvml

from pipeline.config import DetectorSettings
from pipeline.events import EventKind, GpuEvent
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


def _xid(t: int, gpu: int, code: int) -> GpuEvent:
    return GpuEvent("c1", "node-1", f"GPU-{gpu}", gpu, T0 + t * S, EventKind.XID, code, "")


def test_a_crashed_jobs_teardown_burst_of_xid_45_on_every_gpu_is_no_storm_and_no_page() -> None:
    """A multi-GPU job crashes at t=300: the driver tears down its channels on all 8 GPUs, 12 XID 45 on each within
    6 s (NVSentinel #1629: one such crash flagged 77 nodes of a GB300 NVL72 cluster). One info finding per GPU, no
    storm, nothing that pages or changes a GPU's health."""

    def events(t: int) -> list[GpuEvent]:
        return [_xid(t, g, 45) for g in range(8) for _ in range(2)] if 300 <= t < 306 else []

    _det, found, _ = run(900, events=events)
    assert kinds(found) == {("xid", f"GPU-{g}") for g in range(8)}
    assert {f.severity for f in found} == {"info"}
    assert len(starts(found)) == 8 and all("XID 45" in f.summary for f in starts(found))


def test_hours_of_xid_45_from_application_churn_are_never_a_storm() -> None:
    """Two hours of XID 45 every 40 s on GPU 3 (NVSentinel #1710: 168,924 XID 45 against 10 of every other XID in
    two days of a GB200 fleet's normal churn): 7 or more in every 5 minutes, never a storm, never above info."""

    def events(t: int) -> list[GpuEvent]:
        return [_xid(t, 3, 45)] if t % 40 == 0 else []

    _det, found, _ = run(7200, events=events, rounds_per_batch=60)
    assert {f.detector for f in found} == {"xid"} and {f.severity for f in found} == {"info"}


def test_an_xid_45_follows_the_xid_before_it_and_a_worse_one_after_it_is_said_at_once() -> None:
    """GPU 1: XID 13 (an illegal instruction) and the teardown's three XID 45 after it: one warning that keeps naming
    XID 13. GPU 2: an XID 45 alone (info), then 20 s later XID 119 (GSP RPC timeout): the same episode, said at once
    as critical with its reset."""

    def events(t: int) -> list[GpuEvent]:
        out = [_xid(t, 1, 13)] if t == 100 else []
        out += [_xid(t, 1, 45)] if 101 <= t <= 103 else []
        out += [_xid(t, 2, 45)] if t == 200 else []
        out += [_xid(t, 2, 119)] if t == 220 else []
        return out

    _det, found, _ = run(900, events=events)
    one = [f for f in found if f.gpu_uuid == "GPU-1" and f.active]
    assert {f.detector for f in one} == {"xid"} and len({f.since_ns for f in one}) == 1
    assert all("XID 13" in f.summary and f.severity == "warning" and f.evidence["xid"] == 13 for f in one)
    two = [f for f in found if f.gpu_uuid == "GPU-2" and f.active]
    assert len({f.since_ns for f in two}) == 1 and two[0].severity == "info"
    raised = next(f for f in two if f.severity == "critical")
    assert raised.ts_ns == T0 + 220 * S and "XID 119" in raised.summary and "reset" in raised.action


def test_pcie_cards_without_an_nvlink_bridge_are_not_nvlink_down_and_a_bridged_pair_still_is() -> None:
    """Four A100 80GB PCIe cards, as NVML reads them: 12 NVLink slots each (nvlink_links_max), no link ever up on
    GPUs 2 and 3 (no bridge); GPUs 0 and 1 bridged, all 12 up, until GPU 1's bridge loses 4 links at t=600. One
    finding: GPU 1's, from t=600 on."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        up = 12.0 if gpu in (0, 1) else 0.0
        if gpu == 1 and t >= 600:
            up = 8.0
        return m | {"nvlink_links_max": 12.0, "nvlink_links_active": up}

    _det, found, _ = run(1200, shape, gpus=4, model="NVIDIA A100 80GB PCIe")
    assert kinds(found) == {("nvlink-down", "GPU-1")}
    (down,) = starts(found)
    assert T0 + 600 * S <= down.ts_ns <= T0 + 615 * S
    # the same unbridged slots on an SXM board are links that never trained: found once the boot's 2 minutes end
    _det, found, _ = run(400, shape, gpus=4, model="NVIDIA A100-SXM4-80GB")
    assert kinds(found) == {("nvlink-down", "GPU-2"), ("nvlink-down", "GPU-3")}
