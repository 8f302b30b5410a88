"""The whole path on real servers: simulated samples -> Kafka -> faust processor -> sink -> InfluxDB."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.events import RELATIVE_FIELDS
from producers.simulator import Fleet

from .harness import publish_batches, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration


def test_known_samples_are_stored_exactly(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet(nodes=3, gpus_per_node=4, cluster=settings.cluster, seed=7)
    start_ms = time.time_ns() // 1_000_000 - 60_000
    batches = [b for r in range(5) for b in fleet.tick((start_ms + r * 1000) * 1_000_000)]
    sent = {(s.gpu_uuid, s.ts_ns // 1_000_000): s for b in batches for s in b.samples}
    assert len(sent) == 60

    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches)
        stats = wait_stored(sink, 60)
    assert stats["dead_lettered"] == 0

    rows = stored_points(settings)
    assert len(rows) == 60
    # limits go to gpu_info once per GPU (they do not change in these 5 s), readings to gpu every sample
    info = {r["gpu"]: r for r in stored_points(settings, "gpu_info")}
    assert len(info) == 12
    for point in rows:
        sample = sent.pop((point["gpu"], int(point["_time"].timestamp() * 1000)))
        row = info[point["gpu"]] | point
        assert row["node"] == sample.node
        assert row["gpu_model"] == sample.gpu_model
        assert row["gpu_index"] == str(sample.gpu_index)
        assert row["verdict"] == "unscored"
        for name, value in sample.metrics.items():
            assert row[name] == pytest.approx(value, rel=0, abs=0), name
        stored_fields = {k for k in row if not k.startswith("_") and k not in ("cluster", "node", "gpu", "gpu_index")}
        assert "power_limit_watts" in info[row["gpu"]] and "power_watts" not in info[row["gpu"]]
        assert "nvlink_tx_bytes_per_second" in stored_fields or "NVLink" not in sample.gpu_model
        assert row["power_ratio_of_limit"] == pytest.approx(
            sample.metrics["power_watts"] / sample.metrics["power_limit_watts"]
        )
        assert set(RELATIVE_FIELDS) <= stored_fields
    assert not sent, "samples missing from InfluxDB"


def test_replay_is_idempotent(settings: Settings, tmp_path: Path) -> None:
    """The same samples delivered twice (at-least-once replay) leave exactly one point each."""
    fleet = Fleet(nodes=2, gpus_per_node=2, cluster=settings.cluster, seed=3)
    ts = (time.time_ns() // 1_000_000 - 5_000) * 1_000_000
    batches = fleet.tick(ts)
    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches + batches)
        wait_stored(sink, 8)
    rows = stored_points(settings)
    assert len(rows) == 4
    assert {r["gpu"] for r in rows} == {s.gpu_uuid for b in batches for s in b.samples}
