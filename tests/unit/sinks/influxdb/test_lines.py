from __future__ import annotations

import re
from dataclasses import replace

from pipeline.codec import encode_samples
from pipeline.config import ValidationSettings
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
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan
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
    line = event_line(InterpretedEvent(replace(_event().sample, gpu_model="")))
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
    infinite = replace(f, evidence={"temperature_gpu_celsius": 89.0, "ratio": float("inf"), "gone": float("nan")})
    assert finding_line(infinite) == line  # InfluxDB refuses inf: left out, like NaN


def _parse(line: str) -> tuple[str, str, int, dict[str, str]]:
    """(measurement, gpu, ts_ms, fields) of a line without commas in its string fields' values."""
    head, rest = re.split(r"(?<!\\) ", line, maxsplit=1)
    fields, ts = rest.rsplit(" ", 1)
    measurement, _, tags = head.partition(",")
    gpu = dict(t.split("=", 1) for t in tags.split(","))["gpu"]
    return measurement, gpu, int(ts), dict(f.split("=", 1) for f in fields.split(","))


def test_what_is_written_on_change_gives_every_row_back_when_filled_forward() -> None:
    """The sink writes states, counters and the interpretation only when they change (and at the first sample of
    every 10 minutes); filling each GPU's fields forward gives exactly the rows written in full."""
    fleet = Fleet(2, 8, seed=3, faults=FaultPlan.for_evaluation(2, 900, 4))
    start = 1_800_000_000_000_000_000 - 300 * 10**9  # 5 minutes before a 10-minute boundary
    tracker, written, full = InfoTracker(), 0, 0
    state: dict[str, dict[str, str]] = {}
    for r in range(0, 720, 3):
        msgs = [RawMessage(b.kafka_key, encode_samples(b), "t") for r2 in range(r, r + 3)
                for b in fleet.tick(start + r2 * 10**9)]  # fmt: skip
        batches = [b for _, b in process_raw(msgs, start + r * 10**9, ValidationSettings()).forward]
        batches = [replace(b, phase=tuple("compute" if i % 7 else "eval" for i in range(len(b)))) for b in batches]
        sparse = [_parse(x) for x in batch_lines(batches, tracker) if x.startswith("gpu,") and "explanation=" not in x]
        dense = [_parse(x) for x in batch_lines(batches) if x.startswith("gpu,") and "explanation=" not in x]
        assert [(g, t) for _, g, t, _ in sparse] == [(g, t) for _, g, t, _ in dense]
        for (_, gpu, ts, fields), (_, _, _, want) in zip(sparse, dense, strict=True):
            known = state.setdefault(gpu, {})
            known.update(fields)
            assert {k: known[k] for k in want} == want, (gpu, ts)
            if ts // 600_000 != (ts - 1000) // 600_000:
                assert fields == want  # the first sample of a refresh period carries everything
            written += len(fields)
            full += len(want)
    assert written < 0.75 * full


def test_tags_are_built_once_per_gpu_and_are_the_same_as_without_a_tracker() -> None:
    fleet = Fleet(2, 8, seed=1)
    msgs = [RawMessage(b.kafka_key, encode_samples(b), "t") for b in fleet.tick(1_800_000_000_000_000_000)]
    batches = [b for _, b in process_raw(msgs, 1_800_000_000_000_000_000, ValidationSettings()).forward]
    tracker = InfoTracker()
    with_tracker = [x.split(" ", 1)[0] for x in batch_lines(batches, tracker) if x.startswith("gpu,")]
    assert with_tracker == [x.split(" ", 1)[0] for x in batch_lines(batches) if x.startswith("gpu,")]
    assert len(tracker.tags) == 16
