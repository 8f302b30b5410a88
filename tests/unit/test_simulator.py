from __future__ import annotations

import pytest

from pipeline.events import METRIC_INDEX
from producers.simulator import MODELS, Fleet


def test_same_seed_same_fleet_and_readings() -> None:
    a, b = Fleet(4, 8, seed=42), Fleet(4, 8, seed=42)
    assert a.uuids == b.uuids
    assert a.tick(10**18) == b.tick(10**18)
    assert Fleet(4, 8, seed=43).uuids != a.uuids


def test_one_batch_per_node_with_its_gpus() -> None:
    batches = Fleet(3, 4, cluster="c", seed=1).tick(10**18)
    assert [b.node for b in batches] == ["node-0000", "node-0001", "node-0002"]
    assert all([s.gpu_index for s in b.samples] == [0, 1, 2, 3] for b in batches)
    assert len({s.gpu_uuid for b in batches for s in b.samples}) == 12


def test_unsupported_fields_are_absent_not_zero() -> None:
    fleet = Fleet(40, 2, seed=3)
    for batch in fleet.tick(10**18):
        for sample in batch.samples:
            assert set(sample.metrics) <= set(METRIC_INDEX)
            has_nvlink = MODELS[sample.gpu_model].nvlink
            assert ("nvlink_tx_bytes_per_second" in sample.metrics) == has_nvlink


def test_energy_accumulates_power_over_time() -> None:
    fleet = Fleet(1, 1, seed=0)
    first = fleet.tick(10**18)[0].samples[0]
    second = fleet.tick(10**18 + 2 * 10**9)[0].samples[0]
    gained = second.metrics["energy_joules"] - first.metrics["energy_joules"]
    assert gained == pytest.approx(second.metrics["power_watts"] * 2, abs=0.011)  # power is reported to 0.01 W


def test_empty_fleet_is_refused() -> None:
    with pytest.raises(ValueError):
        Fleet(0, 8)
