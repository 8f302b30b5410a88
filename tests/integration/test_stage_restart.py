"""Processor and sink killed hard (SIGKILL) mid-stream and restarted: every acknowledged sample is stored once."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from hermeneut.stages import start_stage
from pipeline.config import Settings
from pipeline.services.stages import wait_for
from producers.simulator import Fleet

from .harness import publish_batches, running_pipeline, stored_points

pytestmark = pytest.mark.integration


def test_killed_stages_lose_nothing_after_restart(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet(nodes=4, gpus_per_node=4, cluster=settings.cluster, seed=9)
    start_ms = time.time_ns() // 1_000_000 - 300_000
    rounds = [fleet.tick((start_ms + r * 1000) * 1_000_000) for r in range(40)]
    first_run = tmp_path / "first"
    processor = start_stage("process", settings, first_run)
    sink = start_stage("sink", settings, first_run)
    try:
        assert wait_for(lambda: processor.stats().get("assigned") and sink.stats().get("assigned"), 90)
        for batches in rounds[:20]:
            publish_batches(settings, batches)
        assert wait_for(lambda: sink.stats().get("points_written", 0) > 0, 60)
        for batches in rounds[20:]:
            publish_batches(settings, batches)
        processor.proc.send_signal(signal.SIGKILL)
        sink.proc.send_signal(signal.SIGKILL)
        processor.proc.wait(10)
        sink.proc.wait(10)
    finally:
        processor.stop()
        sink.stop()
    stored_before = len(stored_points(settings))
    with running_pipeline(settings, tmp_path / "second"):
        wait_for(lambda: len(stored_points(settings)) >= 40 * 16, 90, interval_s=1.0)
    rows = stored_points(settings)
    keys = {(r["gpu"], r["_time"]) for r in rows}
    assert len(rows) == len(keys) == 40 * 16, f"stored before the kill: {stored_before}"
