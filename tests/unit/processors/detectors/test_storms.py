"""Error-rate storms against DCGM's limits: NVLink CRC errors at 100/s, PCIe replays at 8/min, corrected ECC errors
at 10/s (DCGM #313's GPU leaked 17,700/s), PCIe AER correctable errors at the replay limit and any uncorrectable one:
found above the limit, not below it, cleared after two quiet minutes, the same however the data is batched."""

from __future__ import annotations

import pytest

from pipeline.health.fold import FiringFinding, reason_of
from pipeline.health.states import Health, Remedy
from tests.unit.processors.detectors.driver import T0, S, Shape, kinds, run, starts


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


def aer(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
    """GPU 1: AER correctable errors at the link partner, 12 a minute from t=100 to 400 (the GPU's own replay counter
    stays put); GPU 2: 6 a minute, below the limit; GPU 3: a quiet link with one nonfatal error at t=250; GPU 4: no
    AER counters at all (absent, not zero)."""
    m = m | {"pcie_aer_correctable_total": 40.0, "pcie_aer_uncorrectable_total": 0.0, "pcie_replay_total": 3.0}
    if gpu == 1:
        return m | {"pcie_aer_correctable_total": 40.0 + (min(max(t, 100), 400) - 100) // 5}
    if gpu == 2:
        return m | {"pcie_aer_correctable_total": 40.0 + t // 10}
    if gpu == 3:
        return m | {"pcie_aer_uncorrectable_total": float(t >= 250)}
    if gpu == 4:
        return {k: v for k, v in m.items() if not k.startswith("pcie_aer")}
    return m


@pytest.mark.parametrize("rounds_per_batch", [1, 97])
def test_an_aer_storm_at_dcgms_replay_limit_and_any_uncorrectable_error(rounds_per_batch: int) -> None:
    _det, found, _ = run(700, aer, gpus=5, rounds_per_batch=rounds_per_batch)
    assert kinds(found) == {("pcie-aer-storm", "GPU-1"), ("pcie-aer-storm", "GPU-3")}
    link = starts(found, "pcie-aer-storm")[0]
    assert link.gpu_uuid == "GPU-1" and T0 + 100 * S < link.ts_ns <= T0 + 221 * S
    assert "PCIe AER correctable errors (GPU and upstream port) at 12.0/min" in link.summary
    assert "DCGM's limit 8/min" in link.summary and "uncorrectable" not in link.summary
    assert "replay counter may show nothing" in link.action and link.evidence["uncorrectable"] == 0
    severe = starts(found, "pcie-aer-storm")[1]
    # one nonfatal error: found at the end of its window, whatever the correctable rate (0 here)
    assert severe.gpu_uuid == "GPU-3" and T0 + 250 * S <= severe.ts_ns <= T0 + 311 * S
    assert severe.evidence["rate_per_s"] == 0 and severe.evidence["uncorrectable"] == 1
    assert severe.evidence["uncorrectable_total"] == 1
    assert "1 uncorrectable (nonfatal or fatal) since it began, 1 in all" in severe.summary
    cleared = {f.gpu_uuid: f.ts_ns for f in found if not f.active}
    assert T0 + 400 * S < cleared["GPU-1"] <= T0 + 541 * S and T0 + 250 * S < cleared["GPU-3"] <= T0 + 431 * S


@pytest.mark.parametrize(("kind", "readings", "gpus"), [("ecc-sbe-storm", shape, 5), ("pcie-aer-storm", aer, 2)])
def test_a_storm_degrades_its_gpu_and_asks_for_an_inspection(kind: str, readings: Shape, gpus: int) -> None:
    _det, found, _ = run(300, readings, gpus=gpus)
    storm = starts(found, kind)[0]
    labels = {"detector": storm.detector, "severity": storm.severity.value}
    reason = reason_of(FiringFinding(labels, storm.summary, storm.since_ns, storm.evidence))
    assert reason is not None and (reason.state, reason.remedy) == (Health.DEGRADED, Remedy.INSPECT)


def sparse(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
    """``shape``'s counters read only every 30th round (the collector's costly readings: a real H100's replay
    counter costs 0.17 ms of CPU per read), absent in between."""
    out = shape(t, gpu, m)
    return out if t % 30 == 0 else {k: v for k, v in out.items() if not k.endswith("_total")}


@pytest.mark.parametrize("rounds_per_batch", [1, 97])
def test_counters_read_every_nth_round_rise_by_what_they_gained_over_the_gap(rounds_per_batch: int) -> None:
    _det, found, _ = run(700, sparse, gpus=6, rounds_per_batch=rounds_per_batch)
    assert kinds(found) == {("nvlink-crc-storm", "GPU-1"), ("pcie-replay-storm", "GPU-2"), ("ecc-sbe-storm", "GPU-4")}
    replay = starts(found, "pcie-replay-storm")[0]
    assert T0 + 100 * S < replay.ts_ns <= T0 + 221 * S
