"""``bench.pipeline`` at a tiny size on its own Kafka and influxd: its live phase runs the whole interpreted path
(topology and workload context published, learned baselines loaded), so the figures the README quotes for a live
fleet include what the judgement costs. Nothing here asserts a speed."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from bench import pipeline


def test_the_live_phase_is_judged_like_the_drain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the benchmark keeps its stages' logs there
    out = tmp_path / "bench.json"
    argv = ["--gpus", "16", "--duration", "8", "--backlog", "4000", "--learn-nodes", "32", "--learn-rounds", "120"]
    assert pipeline.main([*argv, "--skip-ceilings", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    drain = results["saturation"][0]
    assert sum(drain["verdicts"].values()) == drain["samples"], drain["verdicts"]
    live = results["live"]
    assert live["drained"] and live["stored"] == live["samples"] > 0 and live["dead_lettered"] == 0
    assert live["baselines"] > 0 and live["baselines_version"] == 1
    assert sum(live["verdicts"].values()) == live["samples"]
    # every GPU-second judged as the application its context names (or idle): with samples only, about half of
    # them were "unknown" until the classifier inferred one
    seconds = live["gpu_seconds_by_application"]
    assert sum(seconds.values()) > 0 and seconds.get("unknown", 0.0) == 0.0, seconds
