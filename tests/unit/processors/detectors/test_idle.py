"""Idle capacity: a GPU allocated to a job and left idle."""

from __future__ import annotations

from tests.unit.processors.detectors.driver import (
    T0,
    S,
    kinds,
    run,
    starts,
)


def test_idle_but_allocated() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"utilization_gpu_percent": 0.0, "power_watts": 80.0} if gpu == 1 else m

    _det, found, _ = run(1800, shape, gpus=2)
    assert kinds(found) == {("idle-capacity", "GPU-1")}
    first = starts(found)[0]
    assert first.severity == "info" and T0 + 600 * S < first.ts_ns < T0 + 800 * S
