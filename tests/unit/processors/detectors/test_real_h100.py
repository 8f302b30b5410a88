"""A real H100 read through the NVML source (tests/testdata/nvml-h100-lent): 15 s idle, 45 s of a bf16 matmul at
its 700 W limit (99 % busy, clocks at 69-70 % of their maximum, the software power-cap reason set: how an H100 runs
such work), 15 s idle. Judged by the detectors as a live processor would, one round at a time."""

from __future__ import annotations

import json

import pytest

from pipeline.config import DetectorSettings
from pipeline.events import EventKind, Finding, GpuEvent, GpuProcess, GpuSample, InterpretedEvent, Workload
from processors.detectors.stage import Detectors
from tests import TESTDATA
from tests.unit.processors.detectors.driver import batch_of

READINGS = TESTDATA / "nvml-h100-lent" / "readings.jsonl"


def judge(workload: Workload | None) -> tuple[list[Finding], int]:
    det = Detectors(DetectorSettings())
    found: list[Finding] = []
    t0 = 0
    for line in READINGS.read_text().splitlines():
        batch = json.loads(line)
        (s,) = batch["samples"]
        t0 = t0 or s["ts_ns"]
        processes = tuple(GpuProcess(**p) for p in s["processes"])
        sample = GpuSample(s["cluster"], s["node"], s["gpu_uuid"], s["gpu_index"], s["gpu_model"], s["ts_ns"],
                           s["metrics"], None, processes)  # fmt: skip
        events = tuple(GpuEvent(**(e | {"kind": EventKind(e["kind"])})) for e in batch["events"])
        _, findings = det.apply(batch_of([InterpretedEvent(sample, workload=workload)], events), s["ts_ns"])
        found += findings + det.tick(s["ts_ns"])
    return found, t0


def test_the_readings_are_what_the_module_says() -> None:
    rows = [json.loads(line)["samples"][0]["metrics"] for line in READINGS.read_text().splitlines()]
    busy = [m for m in rows if m["utilization_gpu_percent"] >= 95]
    assert len(rows) == 75 and 40 <= len(busy) <= 46
    assert all(m["power_watts"] >= 0.97 * m["power_limit_watts"] for m in busy[2:])
    assert all(0.65 <= m["sm_clock_mhz"] / m["sm_clock_max_mhz"] <= 0.75 for m in busy[2:])
    assert all(int(m["throttle_reasons_mask"]) & 4 for m in busy[2:])  # nvmlClocksThrottleReasonSwPowerCap


@pytest.mark.parametrize("in_a_job", [False, True])
def test_a_real_h100_at_its_power_limit_is_not_a_fault(in_a_job: bool) -> None:
    """Nothing to warn of or page for: running at the power limit with clocks pulled back is the power
    management doing its work. In a job (a scheduler says it is still running) the process's end is told as an
    info: its memory collapsed (31 GiB to 0 between two samples)."""
    job = Workload("llm-pretraining", job_id="bench-1", source="slurm", confidence=1.0, job_gpus=1)
    found, t0 = judge(job if in_a_job else None)
    assert [f for f in found if f.severity != "info"] == []
    if in_a_job:
        (collapse,) = found
        assert collapse.detector == "memory-collapse" and 60 <= (collapse.ts_ns - t0) / 1e9 <= 75
        assert "31.0 GiB to 0.0 GiB" in collapse.summary
    else:
        assert found == []
