"""Error-rate storms against DCGM's limits: NVLink CRC errors at 100/s, PCIe replays at 8/min, corrected ECC errors
at 10/s (DCGM #313's GPU leaked 17,700/s): found above the limit, not below it, cleared after two quiet minutes,
the same however the data is batched."""

from __future__ import annotations

import pytest

from pipeline.health import FiringFinding, Health, Remedy, reason_of
from tests.unit.processors.detectors.driver import T0, S, kinds, run, starts


def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
    storm = 100 <= t < 400
    if gpu == 1:  # NVLink CRC errors at 150/s for five minutes
        return m | {"nvlink_crc_errors_total": 3.0 + 150 * (min(max(t, 100), 400) - 100)}
    if gpu == 2:  # a PCIe replay every 5 s: 12/min
        return m | {"pcie_replay_total": float((min(max(t, 100), 400) - 100) // 5)}
    if gpu == 3:  # one every 10 s: 6/min, below DCGM's 8
        return m | {"pcie_replay_total": float(t // 10)}
    if gpu == 4:  # DCGM #313: 17,700 corrected ECC errors a second
        return m | {"ecc_corrected_total": 17_700.0 * (min(max(t, 100), 400) - 100) if storm or t >= 400 else 0.0}
    if gpu == 5:  # a weak cell: 3 a second
        return m | {"ecc_corrected_total": 3.0 * t}
    return m


@pytest.mark.parametrize("rounds_per_batch", [1, 97])
def test_storms_above_dcgms_limits_and_not_below(rounds_per_batch: int) -> None:
    _det, found, _ = run(700, shape, gpus=6, rounds_per_batch=rounds_per_batch)
    assert kinds(found) == {("nvlink-crc-storm", "GPU-1"), ("pcie-replay-storm", "GPU-2"), ("ecc-sbe-storm", "GPU-4")}
    for f in starts(found):
        assert T0 + 100 * S < f.ts_ns <= T0 + 221 * S, f  # within two windows of the storm's start
        assert f.severity == "warning" and f.evidence["peak_per_s"] >= f.evidence["limit_per_s"]
    crc = starts(found, "nvlink-crc-storm")[0]
    assert "NVLink CRC errors at 150.0/s over the last 60 s" in crc.summary and "DCGM's limit 100/s" in crc.summary
    replay = starts(found, "pcie-replay-storm")[0]
    assert "PCIe replays at 12.0/min" in replay.summary and "reseat" in replay.action
    cleared = [f for f in found if not f.active]
    assert len(cleared) == 3 and all(T0 + 400 * S < f.ts_ns <= T0 + 541 * S for f in cleared)  # two quiet minutes


def test_a_storm_degrades_its_gpu_and_asks_for_an_inspection() -> None:
    _det, found, _ = run(300, shape, gpus=5)
    sbe = starts(found, "ecc-sbe-storm")[0]
    labels = {"detector": sbe.detector, "severity": sbe.severity.value}
    reason = reason_of(FiringFinding(labels, sbe.summary, sbe.since_ns, sbe.evidence))
    assert reason is not None and (reason.state, reason.remedy) == (Health.DEGRADED, Remedy.INSPECT)
