"""InfluxDB stops in the middle of a stream and comes back: no sample lost, none duplicated, writes resume as soon
as it answers again (no request grown past the batch size, no rollup task piling up runs on it)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.errors import TransientWriteError
from pipeline.services.stages import wait_for
from producers.simulator import Fleet
from sinks.influxdb.write import InfluxWriter

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
        assert wait_for(lambda: sink.stats().get("points_written", 0) >= 100, 60)
        influx_server.stop()
        time.sleep(3)  # the sink keeps consuming into its retry loop meanwhile
        influx_server.start()
        back = time.monotonic()
        producer.join()
        stats = wait_stored(sink, rounds * 16)
        caught_up_s = time.monotonic() - back

    assert stats["write_retries"] > 0, "the sink never saw the outage"
    # its longest pause between retries is 10 s (15 with jitter): well within a minute, even on a loaded machine
    assert caught_up_s < 60, f"writes took {caught_up_s:.0f}s to catch up after InfluxDB came back"
    assert 0 < stats["max_request_lines"] <= settings.influxdb.batch_size
    rows = stored_points(settings)
    keys = [(r["gpu"], r["_time"]) for r in rows]
    assert len(keys) == rounds * 16
    assert len(set(keys)) == len(keys)


def test_a_write_that_timed_out_is_given_more_time_and_stored_once(
    settings: Settings, influx_server: InfluxServer
) -> None:
    """A hung influxd (SIGSTOP: connections accepted, never answered) times the request out; the writer gives the
    next ones twice the time, the same request sent again once influxd answers is stored once, and fast answers
    take the stretch back."""
    writer = InfluxWriter.from_settings(settings.influxdb)
    now_ms = time.time_ns() // 1_000_000
    lines = [f"gpu,cluster={settings.cluster},gpu=g{i} power_w={100.0 + i} {now_ms}" for i in range(10)]
    own = writer.timeout_for(len(lines))
    influx_server.proc_signal(signal.SIGSTOP)
    try:
        with pytest.raises(TransientWriteError, match="Timeout"):
            writer.write(lines)
    finally:
        influx_server.proc_signal(signal.SIGCONT)
    assert writer.timeout_for(len(lines)) == 2 * own
    writer.write(lines)
    for _ in range(5):  # answers within a quarter of their time take the stretch back
        if writer.timeout_for(len(lines)) == own:
            break
        writer.write(lines[:1])
    assert writer.timeout_for(len(lines)) == own
    writer.close()
    rows = stored_points(settings)
    assert sorted((r["gpu"], r["power_w"]) for r in rows) == [(f"g{i}", 100.0 + i) for i in range(10)]


def test_sink_stops_within_its_grace_while_influxdb_is_down_and_loses_nothing(
    settings: Settings, influx_server: InfluxServer, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"influxdb": settings.influxdb.model_copy(update={"shutdown_grace_s": 2.0})})
    fleet = Fleet(nodes=4, gpus_per_node=4, cluster=settings.cluster, seed=8)
    start_ms = time.time_ns() // 1_000_000 - 60_000
    rounds = [fleet.tick((start_ms + r * 1000) * 1_000_000) for r in range(20)]
    with running_pipeline(settings, tmp_path / "first") as (processor, sink):
        for batches in rounds[:10]:
            publish_batches(settings, batches)
        wait_stored(sink, 10 * 16)
        influx_server.stop()
        try:
            for batches in rounds[10:]:
                publish_batches(settings, batches)
            assert wait_for(lambda: processor.stats().get("samples_ok", 0) >= 20 * 16, 60)
            time.sleep(1.0)  # the sink has them and is retrying
            started = time.monotonic()
            sink.proc.terminate()
            sink.proc.wait(60)
            stopped_after = time.monotonic() - started
        finally:
            influx_server.start()
    assert stopped_after < 20, f"sink took {stopped_after:.1f}s to stop with a 2 s grace"
    with running_pipeline(settings, tmp_path / "second"):
        wait_for(lambda: len(stored_points(settings)) >= 20 * 16, 60, interval_s=1.0)
    keys = [(r["gpu"], r["_time"]) for r in stored_points(settings)]
    assert len(keys) == len(set(keys)) == 20 * 16
