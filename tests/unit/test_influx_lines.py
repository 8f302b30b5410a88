from __future__ import annotations

from pipeline.events import GpuSample, InterpretedBatch, InterpretedEvent, Verdict, Workload
from sinks.influxdb import batch_lines


def event_line(e: InterpretedEvent) -> str:
    (line,) = batch_lines([InterpretedBatch.from_events([e])])
    return line


def _event(**kw: object) -> InterpretedEvent:
    sample = GpuSample(
        "dc 1",
        "node,7",
        "GPU-x=1",
        3,
        "NVIDIA H100 80GB HBM3",
        1_700_000_000_123_999_999,
        {"power_watts": 312.5, "memory_used_bytes": 2**40 - 1},
    )
    return InterpretedEvent(sample, {"power_ratio_of_limit": 0.45}, **kw)  # type: ignore[arg-type]


def test_line_protocol_escapes_tags_and_keeps_sorted_order() -> None:
    line = event_line(_event())
    assert line.startswith(
        r"gpu,cluster=dc\ 1,gpu=GPU-x\=1,gpu_index=3,gpu_model=NVIDIA\ H100\ 80GB\ HBM3,node=node\,7 "
    )
    assert line.rsplit(" ", 1)[1] == "1700000000123"  # milliseconds, truncated


def test_fields_are_floats_and_strings_are_quoted() -> None:
    line = event_line(
        _event(workload=Workload("bert", 'job "7"', "ana", "slurm", 1.0), verdict=Verdict.UNUSUAL, score=2.5)
    )
    assert "application=bert," in line
    assert "power_watts=312.5," in line
    assert "memory_used_bytes=1099511627775.0," in line  # ints are written as floats: one type per field
    assert 'verdict="unusual"' in line
    assert "score=2.5" in line
    assert r'job_id="job \"7\""' in line
    assert 'user="ana"' in line


def test_unknown_workload_adds_no_empty_tag() -> None:
    line = event_line(_event())
    assert "application=" not in line and "job_id" not in line
