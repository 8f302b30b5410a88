"""The watch loop's logic with scripted sources and a recording sink (the real Kafka run is in
tests/integration/test_context.py): changes only, tombstones, re-assertion, failing sources, manual records."""

from __future__ import annotations

import logging
import threading

import pytest

from pipeline.errors import SourceUnavailable
from pipeline.events import GpuContext, Workload, gpu_key
from producers.context.watch import Watcher
from tests.fakes.clock import Clock
from tests.fakes.context import Recorder, Scripted

JOB = Workload("llm-pretraining", job_id="4242", source="slurm", confidence=0.95, job_gpus=16)
OTHER = Workload("unknown", job_id="4300", source="slurm")
VLLM = Workload("llm-serving", source="process", confidence=0.7, framework="vllm")


def make(sources: list[Scripted], clock: Clock, **kwargs: object) -> tuple[Watcher, Recorder]:
    sink = Recorder()
    watcher = Watcher("dc1", "gpu01", sources, sink, clock=clock, clock_ns=lambda: 1_700_000_000 * 10**9, **kwargs)  # type: ignore[arg-type]
    return watcher, sink


def test_publishes_changes_and_tombstones() -> None:
    clock = Clock()
    slurm = Scripted("slurm", {"GPU-a": JOB, "GPU-b": JOB})
    watcher, sink = make([slurm], clock)
    assert watcher.step() == 2
    first = sink.records
    assert [k for k, _ in first] == [
        gpu_key("dc1", "gpu01", "GPU-a").decode(),
        gpu_key("dc1", "gpu01", "GPU-b").decode(),
    ]
    assert first[0][1] == GpuContext("dc1", "gpu01", "GPU-a", 1_700_000_000 * 10**9, JOB)
    sink.take()
    assert watcher.step() == 0 and sink.take() == {}  # nothing changed: nothing sent
    slurm.answer = {"GPU-a": OTHER}
    assert watcher.step() == 2
    assert sink.take() == {"GPU-a": OTHER, "GPU-b": None}  # a new job on a, the job on b ended
    assert watcher.current == {"GPU-a": OTHER}


def test_reassert_repeats_state_and_recent_tombstones() -> None:
    clock = Clock()
    slurm = Scripted("slurm", {"GPU-a": JOB, "GPU-b": JOB})
    watcher, sink = make([slurm], clock, reassert_s=600.0)
    watcher.step()
    slurm.answer = {"GPU-a": JOB}
    clock.now = 300.0
    watcher.step()
    assert sink.take() == {"GPU-a": JOB, "GPU-b": JOB} | {"GPU-b": None}
    clock.now = 599.0
    assert watcher.step() == 0
    clock.now = 600.0
    assert watcher.step() == 2
    assert sink.take() == {"GPU-a": JOB, "GPU-b": None}
    clock.now = 1200.0
    watcher.step()
    assert sink.take() == {"GPU-a": JOB}  # the old tombstone is repeated once, not forever
    assert watcher.stats.reasserts == 2


def test_reassert_never_resends_a_tombstone_over_a_new_workload() -> None:
    clock = Clock()
    slurm = Scripted("slurm", {"GPU-a": JOB})
    watcher, sink = make([slurm], clock, reassert_s=600.0)
    watcher.step()
    slurm.answer = {}
    clock.now = 10.0
    watcher.step()
    slurm.answer = {"GPU-a": OTHER}
    clock.now = 20.0
    watcher.step()
    sink.take()
    clock.now = 600.0
    watcher.step()
    assert sink.take() == {"GPU-a": OTHER}


def test_failing_source_keeps_its_last_state_and_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    clock = Clock()
    k8s = Scripted("kubernetes", {"GPU-a": JOB})
    procs = Scripted("process", {"GPU-b": VLLM})
    watcher, sink = make([k8s, procs], clock, backoff_initial_s=5.0, backoff_max_s=60.0)
    watcher.step()
    sink.take()
    k8s.answer = SourceUnavailable("kubelet pod-resources: UNAVAILABLE")
    procs.answer = {}
    assert watcher.step() == 1
    assert sink.take() == {"GPU-b": None}  # the other source still moves; GPU-a keeps the last known job
    assert watcher.current == {"GPU-a": JOB} and watcher.stats.failing == ["kubernetes"]
    polls = k8s.polls
    for t in (1.0, 2.0, 3.0):
        clock.now = t
        watcher.step()
    assert k8s.polls == polls  # backing off (5 s +-20%)
    clock.now = 30.0
    watcher.step()
    assert k8s.polls == polls + 1
    assert sum("failed" in r.getMessage() for r in caplog.records) == 1  # logged once
    k8s.answer = {"GPU-a": OTHER}
    clock.now = 100.0
    watcher.step()
    assert sink.take() == {"GPU-a": OTHER}
    assert any("recovered after 2 failures" in r.getMessage() for r in caplog.records)
    assert watcher.stats.failing == [] and watcher.stats.source_failures == {"kubernetes": 2}


def test_manual_records_override_and_are_not_republished() -> None:
    clock = Clock()
    manual = {"GPU-a": Workload("idle", source="manual", confidence=1.0)}
    slurm = Scripted("slurm", {"GPU-a": JOB})
    # the topic already holds the manual record (published by `hermeneut context set`)
    watcher, sink = make([slurm], clock, manual=lambda: manual, published=dict(manual))
    assert watcher.step() == 0
    manual.clear()  # `hermeneut context clear` tombstoned it
    assert watcher.step() == 1
    assert sink.take() == {"GPU-a": JOB}


def test_restart_with_the_topic_state_publishes_only_differences() -> None:
    clock = Clock()
    slurm = Scripted("slurm", {"GPU-a": JOB})
    watcher, sink = make([slurm], clock, published={"GPU-a": JOB, "GPU-z": OTHER})
    assert watcher.step() == 1
    assert sink.take() == {"GPU-z": None}  # the job that ended while the watch was down


def test_run_stops_and_forces_a_reassert_after_a_lost_delivery() -> None:
    clock = Clock()
    watcher, sink = make([Scripted("slurm", {"GPU-a": JOB})], clock)
    stop = threading.Event()
    answers = iter([True, False, False])

    def after_step() -> bool:
        lost = next(answers, False)
        if watcher.stats.steps >= 3:
            stop.set()
        return lost

    watcher.run(stop, 0.001, after_step)
    assert watcher.stats.steps == 3
    assert [w for _, c in sink.records for w in [c.workload if c else None]] == [JOB, JOB]  # step 1, forced step 2
