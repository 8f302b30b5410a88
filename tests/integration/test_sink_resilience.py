"""InfluxDB stops in the middle of a stream and comes back: no sample lost, none duplicated."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pipeline.config import Settings
from producers.simulator import Fleet

from .conftest import InfluxServer
from .harness import publish_batches, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration


def test_influxdb_restart_mid_stream_loses_nothing(
    settings: Settings, influx_server: InfluxServer, tmp_path: Path
) -> None:
    fleet = Fleet(nodes=4, gpus_per_node=4, cluster=settings.cluster, seed=5)
    start_ms = time.time_ns() // 1_000_000 - 120_000
    rounds = 60
    with running_pipeline(settings, tmp_path) as (_processor, sink):

        def produce() -> None:
            for r in range(rounds):
                publish_batches(settings, fleet.tick((start_ms + r * 1000) * 1_000_000))
                time.sleep(0.1)

        producer = threading.Thread(target=produce)
        producer.start()
        assert wait_for_points(sink, 100)
        influx_server.stop()
        time.sleep(3)  # the sink keeps consuming into its retry loop meanwhile
        influx_server.start()
        producer.join()
        stats = wait_stored(sink, rounds * 16)

    assert stats["write_retries"] > 0, "the sink never saw the outage"
    rows = stored_points(settings)
    keys = [(r["gpu"], r["_time"]) for r in rows]
    assert len(keys) == rounds * 16
    assert len(set(keys)) == len(keys)


def wait_for_points(sink: object, n: int) -> bool:
    from pipeline.mainjob import wait_for

    return wait_for(lambda: sink.stats().get("points_written", 0) >= n, 60)  # type: ignore[attr-defined]
