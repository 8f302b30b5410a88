from __future__ import annotations

import dataclasses

from pipeline.events import (
    EventKind,
    Finding,
    GpuEvent,
    GpuProcess,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    NicSample,
    NvLinkSample,
    Severity,
    Verdict,
    Workload,
)
from sinks.influxdb.lines import InfoTracker, batch_lines, finding_line


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


def test_a_gpu_nobody_named_the_model_of_has_no_empty_model_tag() -> None:
    # NVIDIA's A100 MIG scrape has no modelName label: an empty tag value would make InfluxDB refuse the whole write
    line = event_line(InterpretedEvent(dataclasses.replace(_event().sample, gpu_model="")))
    assert line.startswith(r"gpu,cluster=dc\ 1,gpu=GPU-x\=1,gpu_index=3,node=node\,7 ")


def test_events_nics_links_and_processes_become_their_own_points() -> None:
    sample = GpuSample(
        "c",
        "n",
        "GPU-1",
        0,
        "H100",
        1_700_000_000_000_000_000,
        {"power_watts": 1.0},
        links=(NvLinkSample(2, True, 1e9, 2e9, 5, 0, 0),),
        processes=(GpuProcess(42, "python", 3 * 2**20),),
    )
    event = GpuEvent("c", "n", "GPU-1", 0, 1_700_000_000_000_000_000, EventKind.XID, 79, 'bus "gone"')
    nic = NicSample("c", "n", "mlx5_0", 1, 1_700_000_000_000_000_000, {"rx_bytes_per_second": 5.0})
    batch = InterpretedBatch.from_events([InterpretedEvent(sample)], (event,), (nic,))
    info = InfoTracker()
    lines = batch_lines([batch], info)
    by_measurement = {line.split(",", 1)[0]: line for line in lines}
    assert set(by_measurement) == {"gpu", "nvlink", "gpu_process", "gpu_event", "nic"}
    assert ",kind=xid," in by_measurement["gpu_event"] and ",code=79," in by_measurement["gpu_event"]
    assert r'detail="bus \"gone\""' in by_measurement["gpu_event"]
    assert by_measurement["nvlink"].startswith("nvlink,cluster=c,gpu=GPU-1,gpu_index=0,gpu_model=H100,node=n,link=2 ")
    assert 'processes="42 python 3MiB"' in by_measurement["gpu_process"]
    # links and processes are written again only when they change
    again = batch_lines([batch], info)
    assert {line.split(",", 1)[0] for line in again} == {"gpu", "gpu_event", "nic"}


def test_finding_line() -> None:
    f = Finding(
        "thermal-throttling", Severity.WARNING, True, "c", "n", "GPU-1", "H100", 2_000_000, 1_000_000,
        "held by HW slowdown", "check cooling", {"temperature_gpu_celsius": 89.0}, Workload("bert-training", "j1"),
    )  # fmt: skip
    line = finding_line(f)
    assert line.startswith(
        "finding,application=bert-training,cluster=c,detector=thermal-throttling,gpu=GPU-1,node=n,severity=warning "
    )
    assert "active=1.0," in line and 'job_id="j1"' in line and "ev_temperature_gpu_celsius=89.0" in line
    assert line.endswith(" 2")
