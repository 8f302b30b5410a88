"""The dashboard's live fleet reads the interpreted and alerts topics in no set order: a finding read before its
GPU's first reading must still be shown on that GPU, and one cleared before it must not."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr

from hermeneut.web.live import LiveFleet
from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings
from pipeline.events import Finding, GpuSample, InterpretedBatch, InterpretedEvent, Severity, Verdict

H100 = "NVIDIA H100 80GB HBM3"
S = 1_000_000_000


def _fleet(tmp_path: Path) -> LiveFleet:
    return LiveFleet(
        Settings(
            kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),
            influxdb=InfluxSettings(url="http://127.0.0.1:9", token=SecretStr("t")),
            services=ServiceSettings(state_dir=tmp_path, cache_dir=tmp_path),
        )
    )


def _reading(gpu: str, ts_s: int) -> InterpretedBatch:
    sample = GpuSample("c", "n", gpu, 3, H100, ts_s * S, {"power_watts": 300.0})
    return InterpretedBatch.from_events([InterpretedEvent(sample, {}, None, 0.1, Verdict.NORMAL, "", "", "compute")])


def _finding(detector: str, gpu: str, active: bool, ts_s: int) -> Finding:
    return Finding(detector, Severity.CRITICAL, active, "c", "n", gpu, H100, ts_s * S, 20 * S, f"{detector} on {gpu}")


def test_a_finding_read_before_the_gpus_first_reading_is_shown_on_it(tmp_path: Path) -> None:
    live = _fleet(tmp_path)
    live.apply_finding(_finding("nvlink-down", "GPU-a", True, 30))
    live.apply_finding(_finding("xid", "GPU-a", True, 31))
    live.apply_finding(_finding("xid", "GPU-a", False, 32))  # cleared before any reading: not shown
    live.apply_finding(_finding("thermal", "GPU-b", True, 30))
    live.apply_batch(_reading("GPU-a", 29))
    (state,) = live.snapshot()
    assert set(state.findings) == {"nvlink-down"}
    assert state.findings["nvlink-down"]["summary"] == "nvlink-down on GPU-a"
    assert state.findings["nvlink-down"]["since_ms"] == 20_000
    # the next reading keeps it; a later clear removes it
    live.apply_batch(_reading("GPU-a", 30))
    assert set(live.snapshot()[0].findings) == {"nvlink-down"}
    live.apply_finding(_finding("nvlink-down", "GPU-a", False, 40))
    assert live.snapshot()[0].findings == {}
    # GPU-b's early finding waits for GPU-b, and is not given to GPU-a
    live.apply_batch(_reading("GPU-b", 29))
    assert {s.uuid: set(s.findings) for s in live.snapshot()} == {"GPU-a": set(), "GPU-b": {"thermal"}}


def test_the_findings_held_for_unseen_gpus_are_bounded(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("hermeneut.web.live._EARLY_GPUS", 3)
    live = _fleet(tmp_path)
    for i in range(5):
        live.apply_finding(_finding("xid", f"GPU-{i}", True, 30))
    for i in range(5):
        live.apply_batch(_reading(f"GPU-{i}", 31))
    shown = {s.uuid: set(s.findings) for s in live.snapshot()}
    assert shown == {"GPU-0": set(), "GPU-1": set(), "GPU-2": {"xid"}, "GPU-3": {"xid"}, "GPU-4": {"xid"}}
