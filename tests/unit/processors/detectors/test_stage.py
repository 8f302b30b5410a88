"""The detectors stage on hand-built batches: a healthy busy node and healthy behaviour that looks alarming
(checkpoint dips, idle PCIe downshift, idle GPUs) raise nothing; a finding describes the row it started on;
fast-forward batches find what live ones find; a disabled stage passes batches through."""

from __future__ import annotations

from pipeline.config import DetectorSettings
from pipeline.events import (
    Workload,
)
from processors.detectors.stage import Detectors
from tests.fakes.readings import GIB
from tests.unit.processors.detectors.driver import (
    HW_THERMAL,
    pretraining,
    run,
    starts,
)


def test_healthy_busy_node_raises_nothing() -> None:
    _det, found, _ = run(1800)
    assert found == []


def test_checkpoint_dips_idle_downshift_and_idle_gpus_are_normal() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu >= 6:  # idle GPUs: gen 1 at idle is normal, the width stays
            m |= {
                "utilization_gpu_percent": 0.0,
                "pcie_link_gen": 1.0,
                "sm_clock_mhz": 345.0,
                "power_watts": 70.0,
                "memory_used_bytes": 0.5 * GIB,
                "nvlink_tx_bytes_per_second": 0.0,
                "throttle_reasons_mask": 1.0,
            }
        elif t % 600 < 45:  # a checkpoint every 10 min: util collapses, the link downshifts, PCIe bursts
            m |= {
                "utilization_gpu_percent": 3.0,
                "pcie_link_gen": 2.0,
                "pcie_tx_bytes_per_second": 20e9,
                "sm_clock_mhz": 600.0,
            }
        return m  # fmt: skip

    def job(_t: int, gpu: int) -> Workload | None:
        return pretraining(_t, gpu) if gpu < 6 else None

    _det, found, _ = run(3600, shape, job)
    assert found == []


def test_a_finding_describes_the_row_it_started_on() -> None:
    """After a gap in the data (a collector restart, a replay), a fault can be confirmed on its first row: the
    summary must quote that row, not the healthy one before the gap."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        if 100 <= t < 160:
            return None  # nothing reported for a minute
        if gpu == 1 and t >= 160:
            return m | {"nvlink_links_active": 0.0, "nvlink_tx_bytes_per_second": 0.0,
                        "nvlink_rx_bytes_per_second": 0.0, "pcie_tx_bytes_per_second": 24e9,
                        "pcie_rx_bytes_per_second": 24e9}  # fmt: skip
        return m

    _det, found, _ = run(200, shape, gpus=2)
    first = next(f for f in starts(found) if f.detector == "nvlink-down")
    assert "0 of 18 links active" in first.summary, first.summary
    assert first.evidence["links_active"] == 0


def test_fast_forward_batches_find_the_same_as_live_ones() -> None:
    """Many rounds per batch (fast-forward replay) give the same findings at the same data times."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float] | None:
        if gpu == 3 and 300 <= t < 600:
            m |= {"temperature_gpu_celsius": 89.0, "throttle_reasons_mask": float(HW_THERMAL), "sm_clock_mhz": 1200.0}
        if gpu == 5 and t >= 900:
            m |= {"sm_clock_mhz": 1300.0}
        return None if gpu == 7 and t >= 1000 else m

    _d, live, _ = run(1300, shape)
    _d, replayed, _ = run(1300, shape, rounds_per_batch=37)
    key = [(f.detector, f.gpu_uuid, f.active, f.since_ns) for f in starts(live)]
    assert key == [(f.detector, f.gpu_uuid, f.active, f.since_ns) for f in starts(replayed)]
    assert {f.detector for f in starts(live)} == {"thermal-throttling", "straggler", "fallen-off-bus"}


def test_disabled_stage_passes_batches_through() -> None:
    det = Detectors(DetectorSettings(enabled=False))

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"nvlink_links_active": 0.0}

    _d, found, _ = run(100, shape, detectors=det)
    assert found == []
