"""The closing summary of ``hermeneut import``: counts that add up (or say what is missing), the intervals found,
and the next commands for the imported range."""

from __future__ import annotations

from collections import Counter

from hermeneut.jobs.importjob import ImportOutcome, summary
from pipeline.config import Settings
from producers.importers.driver import ImportReport

T0 = 1_758_685_303_487_000_000  # 2025-09-24T03:41:43.487Z


def report(**kw: object) -> ImportReport:
    base: dict[str, object] = {
        "rows_read": 6241, "samples": 6240, "first_ns": T0, "last_ns": T0 + 265_947_000_000,
        "intervals": {f"g150/g150-gpu{g}": 0.331 for g in range(8)}, "gpus": [f"g150/g150-gpu{g}" for g in range(8)],
        "nodes": ["g150"], "jobs": ["nanogpt-pr643"], "applications": ["llm-pretraining"], "runs": ["r1"],
    }  # fmt: skip
    return ImportReport(**(base | kw))  # type: ignore[arg-type]


def test_a_complete_import_says_where_everything_went_and_what_to_run_next() -> None:
    lines = "\n".join(summary(ImportOutcome(report(), 6240, Counter({"duplicate": 1}), True), Settings(), "http://d"))
    assert "rows read        6241\nstored           6240\ndead-lettered    1 (1 duplicate)" in lines
    assert "NOT ACCOUNTED" not in lines
    assert "intervals        0.331 s (8 series)" in lines
    assert "time range       2025-09-24T03:41:43Z .. 2025-09-24T03:46:10Z (4m25s)" in lines
    assert "hermeneut baselines train --range 5m --stop 2025-09-24T03:46:10Z" in lines
    assert "hermeneut anomalies --start 2025-09-24T03:41:43Z --stop 2025-09-24T03:46:10Z" in lines
    assert "http://d/#/job/nanogpt-pr643?start=2025-09-24T03:41:43Z&stop=2025-09-24T03:46:10Z" in lines


def test_rows_not_yet_accounted_for_are_said_and_unknown_applications_cannot_train() -> None:
    outcome = ImportOutcome(report(applications=["unknown"], intervals={}), 6000, Counter(), False)
    lines = "\n".join(summary(outcome, Settings(), None))
    assert "NOT ACCOUNTED    241 rows are neither stored nor dead-lettered yet" in lines
    assert "no application is known for these rows" in lines and "baselines train --range" not in lines
    assert "8 series with a single sample (no interval)" in lines and "dashboard" not in lines


def test_the_hint_names_the_pipeline_the_import_went_through() -> None:
    """Issue 37: with the main job's stages running, 'is the pipeline running?' was asked when two were. The hint
    names the processor and sink the import used: its own (with their logs), the main job's (pids), or one run
    elsewhere (--no-pipeline: then the question is the right one)."""
    from pathlib import Path

    from hermeneut.jobs.importjob import pipeline_used

    kept = pipeline_used([], {"process": 41, "sink": 42, "alerts": 43}, None, {"process": 1, "sink": 1})
    assert kept == "the main job's process (pid 41) and sink (pid 42), left running with the local services"
    mixed = pipeline_used(["sink"], {"process": 41}, Path("/s/imports/k/r"), {"process": 1})
    assert mixed == "the import's own sink (logs in /s/imports/k/r); the main job's process (pid 41), left running " \
        "with the local services"  # fmt: skip
    assert pipeline_used([], {}, None, {}) == "a pipeline running elsewhere (--no-pipeline)"
    by_hand = pipeline_used(["sink"], {}, Path("/r"), {"process": 2})  # `hermeneut process` started by hand, twice
    assert by_hand == "the import's own sink (logs in /r); the running process (2 in its consumer group)"

    def hint(through: str) -> str:
        lines = summary(ImportOutcome(report(), 6000, Counter(), False, through=through), Settings(), None)
        return next(line for line in lines if line.startswith("NOT ACCOUNTED"))

    assert "through the main job's process (pid 41)" in hint(kept) and "is a processor" not in hint(kept)
    assert "hermeneut services status" in hint(kept)
    assert "is a processor and a sink running" in hint(pipeline_used([], {}, None, {}))


def test_the_summary_names_the_detectors_the_columns_cannot_feed() -> None:
    """Issue 38: nothing told the user which detectors cannot fire on the columns imported. nanoGPT's log
    (utilization, power and temperature every 0.33 s, one job of 8 GPUs): no memory, no clock-event reasons, no
    links, no error counters or XIDs; its straggler and silence rules can fire. With every reading, none is named."""
    nanogpt = ["power_watts", "temperature_gpu_celsius", "utilization_gpu_percent"]
    lines = summary(ImportOutcome(report(columns=nanogpt), 6240, Counter(), True), Settings(), None)
    head = next(i for i, line in enumerate(lines) if line.startswith("cannot see"))
    named = {line.split(":")[0].strip(): line for line in lines[head + 1 :] if line.startswith(" " * 17)}
    assert {"memory-leak", "memory-collapse", "power-brake", "xid", "nvlink-down"} <= set(named)
    assert "memory_used_bytes" in named["memory-leak"] and "throttle_reasons_mask" in named["power-brake"]
    assert {"straggler", "job-slowdown", "fallen-off-bus", "idle-capacity"} & set(named) == set()
    assert lines[head].startswith(f"cannot see       {len(named)} of ")

    from pipeline.events import METRIC_NAMES

    everything = report(columns=list(METRIC_NAMES), events=3)
    assert not any(line.startswith("cannot see") for line in summary(ImportOutcome(everything, 6240, Counter(), True),
                                                                      Settings(), None))  # fmt: skip
