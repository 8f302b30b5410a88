"""The benchmarks' accounting: CPU per sample per process from /proc, and py-spy's collapsed stacks read into the
functions with the most self time (the pipeline benchmark itself needs Kafka and InfluxDB and is run by hand)."""

from __future__ import annotations

import os
from pathlib import Path

from bench.cpu import CpuMeter, ceiling, central_sum, cpu_seconds, per_sample_us, rss_bytes
from bench.fields import field_budget
from bench.profile import self_time
from bench.soak import MIB, Series


def test_cpu_of_a_process_is_read_from_proc_and_charged_per_sample() -> None:
    meter = CpuMeter({"self": (os.getpid(),), "gone": (2**22 + 7,)}).start()
    sum(i * i for i in range(300_000))
    meter.stop()
    assert meter.spent["self"] > 0 and meter.spent["gone"] == 0.0
    assert cpu_seconds(os.getpid()) > 0 and rss_bytes(os.getpid()) > 0 and rss_bytes(2**22 + 7) == 0
    us = per_sample_us({"broker": 0.5, "sink": 0.25, "producer": 1.0}, {"broker": 10_000, "sink": 5_000})
    assert us["broker"] == 50.0 and us["sink"] == 50.0 and us["producer"] != us["producer"]  # NaN: no count
    assert central_sum({"broker": 50.0, "influxd": 30.0, "producer": 99.0}) == 80.0  # the producer is not central
    assert ceiling(100.0, cores=2) == 20_000


def test_work_after_a_phase_is_counted_from_where_the_meter_stopped() -> None:
    meter = CpuMeter({"self": (os.getpid(),)}).start()
    meter.stop()
    assert meter.since_stop("self") < 0.05
    sum(i * i for i in range(2_000_000))  # what a phase leaves behind, e.g. influxd writing out its cache
    assert meter.since_stop("self") > 0


def test_self_time_is_the_innermost_frame_of_each_stack(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "process 1;main (x.py:3);work (/repo/sinks/influxdb/lines.py:10) 6\n"
        "process 1;main (x.py:3);wait (/usr/lib/python3.11/threading.py:320) 3\n"
        "process 1;main (x.py:3) 1\n"
    )
    assert self_time(raw, top=2) == [("work (sinks/influxdb/lines.py)", 0.6), ("wait (threading.py)", 0.3)]


def test_field_budget_counts_fields_per_sample_by_kind_after_each_gpus_first_point() -> None:
    tags = r"gpu,cluster=c,gpu=G\ 1,gpu_index=0,gpu_model=M,node=n"
    lines = [
        f'{tags} power_watts=1.0,pcie_link_gen=4.0,verdict="normal" 1',  # the GPU's first point: left out
        f'{tags} power_watts=2.0,verdict="unusual",explanation="a, b" 2',
        f'{tags} power_watts=3.0,power_ratio_of_limit=0.5,verdict="normal",phase="compute" 3',
        "gpu_info,cluster=c,gpu=G power_limit_watts=700.0 3",
    ]
    budget = field_budget(lines)
    assert budget["moving readings"] == 1.0 and budget["relative values"] == 0.5
    assert budget["verdict, score, job id"] == 1.0 and budget["explanation, drivers"] == 0.5
    assert budget["interpretation (phase, baseline, user, source)"] == 0.5 and budget["states and counters"] == 0.0


def test_the_soak_tells_a_plateau_from_a_leak() -> None:
    """A process that fills up during the warm-up then holds is bounded; one that keeps growing at 10% of its warm
    memory per hour is not (the slope is fitted over the second half, in MiB per hour)."""
    t = [float(s) for s in range(0, 3601, 60)]
    plateau = Series("sink", 0, t, [int((200 + min(s, 600) / 600 * 50) * MIB) for s in t])
    leak = Series("processor", 0, t, [int((300 + s / 3600 * 30) * MIB) for s in t])
    flat = plateau.summary(warmup=0.25, bound=0.05)
    assert flat["bounded"] and abs(flat["slope_second_half_mib_per_h"]) < 1e-6 and flat["warm_mib"] == 250.0
    grew = leak.summary(warmup=0.25, bound=0.05)
    assert not grew["bounded"] and round(grew["slope_second_half_mib_per_h"], 3) == 30.0
    assert round(grew["growth_after_warmup_mib"], 1) == 22.5
