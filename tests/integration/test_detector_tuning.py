"""The tuned detectors through the real processor, Kafka and InfluxDB, without a context source (as in
``hermeneut evaluate`` before the Enricher): a failed power supply on node n1 is stored as ONE node-level
``power-capping`` finding (``gpu`` tag ``-``), a fast memory leak on n1 is found minutes before its process runs
out of memory, and on node n2 a miner whose process lowers its GPU's power limit when it starts raises nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pynvml
import pytest

from pipeline.config import Settings
from pipeline.events import GpuProcess, GpuSample, SampleBatch
from pipeline.services.stages import wait_for

from .harness import publish_batches, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration

S = 1_000_000_000
GIB = 2**30
MODEL = "NVIDIA H100 80GB HBM3"
GTX = "NVIDIA GeForce GTX 1080 Ti"
SECONDS = 720
PSU_AT, PSU_END = 60, 420
LEAK_AT = 200
LEAK_BYTES_PER_S = 150 * 2**20
OOM_AT = LEAK_AT + int((0.985 * 80 * GIB - 0.3 * 80 * GIB) / LEAK_BYTES_PER_S)
MINER_AT = 300
SW_POWER_CAP = float(pynvml.nvmlClocksThrottleReasonSwPowerCap)


def h100(t: int, gpu: int, rng: np.random.Generator) -> tuple[dict[str, float], None, tuple[GpuProcess, ...]]:
    """n1: a busy H100 of a training job; GPU 0's process leaks from LEAK_AT until it dies at OOM_AT.
    Returns the metrics, the per-link NVLink samples (not reported) and the processes."""
    used = 0.3 * 80 * GIB
    if gpu == 0 and t >= LEAK_AT:
        used = used + (t - LEAK_AT) * LEAK_BYTES_PER_S if t < OOM_AT else 0.5 * GIB
    m = {
        "utilization_gpu_percent": float(np.clip(96 + rng.normal(0, 1.5), 0, 100)),
        "memory_used_bytes": float(np.floor(used / 2**20) * 2**20),
        "memory_total_bytes": 80.0 * GIB,
        "sm_clock_mhz": float(round(1830 + rng.normal(0, 8))),
        "sm_clock_max_mhz": 1980.0,
        "temperature_gpu_celsius": 68.0,
        "temperature_slowdown_celsius": 90.0,
        "power_watts": float(610 + rng.normal(0, 10)),
        "power_limit_watts": 700.0,
        "power_default_limit_watts": 700.0,
        "throttle_reasons_mask": 0.0,
        "process_count": 1.0,
    }
    if PSU_AT <= t < PSU_END:
        m |= {"power_limit_watts": 420.0, "power_watts": 418.0, "sm_clock_mhz": 1500.0,
              "throttle_reasons_mask": SW_POWER_CAP}  # fmt: skip
    return m, None, (GpuProcess(5100 + gpu, "python", int(used)),)


def gtx(t: int, gpu: int) -> tuple[dict[str, float], None, tuple[GpuProcess, ...]]:
    """n2: idle GeForce GPUs; at MINER_AT a miner starts on GPU 1 and lowers its limit to 173 W."""
    m = {
        "utilization_gpu_percent": 0.0,
        "memory_used_bytes": 3.0 * 2**20,
        "memory_total_bytes": 11.0 * GIB,
        "sm_clock_mhz": 139.0,
        "sm_clock_max_mhz": 1911.0,
        "temperature_gpu_celsius": 35.0,
        "temperature_slowdown_celsius": 91.0,
        "power_watts": 12.0,
        "power_limit_watts": 250.0,
        "power_default_limit_watts": 250.0,
        "throttle_reasons_mask": 1.0,
        "process_count": 0.0,
    }
    if gpu != 1 or t < MINER_AT:
        return m, None, ()
    m |= {"utilization_gpu_percent": 100.0, "memory_used_bytes": 2.5 * GIB, "sm_clock_mhz": 1480.0,
          "power_watts": 170.0, "power_limit_watts": 173.0, "throttle_reasons_mask": SW_POWER_CAP,
          "process_count": 1.0}  # fmt: skip
    return m, None, (GpuProcess(3207845, "t-rex", int(2.5 * GIB)),)


def test_node_level_power_cap_fast_leak_and_a_miners_setting(settings: Settings, tmp_path: Path) -> None:
    cluster = settings.cluster
    start = time.time_ns() - (SECONDS + 5) * S
    rng = np.random.default_rng(5)
    batches, samples = [], 0
    for t in range(SECONDS):
        ts = start + t * S
        n1 = [GpuSample(cluster, "n1", f"n1-GPU-{g}", g, MODEL, ts, *h100(t, g, rng)) for g in range(8)]
        n2 = [GpuSample(cluster, "n2", f"n2-GPU-{g}", g, GTX, ts, *gtx(t, g)) for g in range(4)]
        batches += [SampleBatch(cluster, "n1", tuple(n1)), SampleBatch(cluster, "n2", tuple(n2))]
        samples += len(n1) + len(n2)

    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches)
        wait_stored(sink, samples, timeout_s=360)
        # the clears of both findings are the last ones the data implies
        assert wait_for(lambda: sink.stats().get("findings_written", 0) >= 4, 60), sink.stats()
        seen = [-1]

        def settled() -> bool:  # no new finding stored for 3 s
            now = sink.stats().get("findings_written", 0)
            done, seen[0] = now == seen[0], now
            return done

        assert wait_for(settled, 60, interval_s=3.0)

    findings = stored_points(settings, "finding")
    assert {f["node"] for f in findings} == {"n1"}, "the miner's own limit at its start is a setting"
    power = [f for f in findings if f["detector"] == "power-capping"]
    assert {f["gpu"] for f in power} == {"-"}, "one finding for the node, not one per GPU"
    assert len({f["_time"] for f in power if f["active"] == 1.0 and "cleared" not in f["summary"]}) >= 1
    first = min(power, key=lambda f: f["_time"])
    assert "power capping on 8 of 8 GPUs at once" in first["summary"] and "power supplies" in first["action"]
    assert first["ev_gpus_capped"] == 8.0
    assert any(f["active"] == 0.0 for f in power), "cleared when the limits came back"

    leak = [f for f in findings if f["detector"] == "memory-leak"]
    assert {f["gpu"] for f in leak} == {"n1-GPU-0"}
    found = min(leak, key=lambda f: f["_time"])
    assert found["_time"].timestamp() <= (start + (OOM_AT - 60) * S) / S, "found at least a minute before the OOM"
    assert found["severity"] == "critical" and "full in ~" in found["summary"]
    # the OOM the leak finding foretold: GPU 0's memory fell from full to half a GiB under the same job, told by the
    # leak's cleared record (how it ended), not as a memory collapse of its own
    ended = [f for f in leak if f["active"] == 0.0]
    assert ended and "then fell from" in ended[0]["summary"], ended
    assert min(f["_time"] for f in ended).timestamp() >= (start + (OOM_AT - 1) * S) / S
    assert {f["detector"] for f in findings} == {"power-capping", "memory-leak"}
