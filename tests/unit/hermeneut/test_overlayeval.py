"""Scoring faults laid over a real trace (hermeneut/jobs/overlayeval.py): matching by kind, place and time, delay,
the wording checks, the bars, with hand-made findings; and ``hermeneut evaluate --overlay`` end to end on the
nanoGPT trace at 10 s (that it runs, scores every visible class, names the invisible one, and reports the control;
the detectors' recall is the CLI's exit code, not asserted here while they are being rebuilt)."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.jobs.overlay import CLASSES, Truth
from hermeneut.jobs.overlayeval import (
    FOUND_BY,
    ClassScore,
    Hit,
    Judged,
    Result,
    evidence_ns,
    matches,
    score_run,
    wording_problems,
)
from pipeline import kinds
from pipeline.events import Finding, Severity
from tests import TESTDATA

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
_S = 1_000_000_000
T0 = 1_000 * _S


def _finding(kind: str, gpu: str | None, at_s: float, summary: str = "", since_s: float | None = None,
             severity: Severity = Severity.WARNING, active: bool = True) -> Finding:  # fmt: skip
    ts = T0 + round(at_s * _S)
    since = ts if since_s is None else T0 + round(since_s * _S)
    return Finding(kind, severity, active, "c", "n", gpu, "m", ts, since, summary)


STRAGGLER = Truth("straggler", False, "g1", "j", T0 + 60 * _S, T0 + 300 * _S, 0.8)


def test_every_class_maps_to_kinds_the_detectors_have() -> None:
    assert set(FOUND_BY) == set(CLASSES)
    assert all(k in kinds.DETECTORS for found_by in FOUND_BY.values() for k in found_by)


def test_a_fault_is_found_by_its_kind_on_its_gpu_in_its_time_only() -> None:
    findings = [
        _finding(kinds.STRAGGLER, "g2", 100),  # another GPU
        _finding(kinds.THERMAL, "g1", 100),  # another kind
        _finding(kinds.STRAGGLER, "g1", 100, since_s=0),  # an episode that began well before the fault
        _finding(kinds.STRAGGLER, "g1", 700),  # after the end + grace
        _finding(kinds.STRAGGLER, "g1", 150, active=False),  # a clear
        _finding(kinds.STRAGGLER, "g1", 130, "GPU 1: straggler: 25% slower than its peers"),
        _finding(kinds.STRAGGLER, "g1", 140),
    ]
    found = matches(STRAGGLER, findings, ["g0", "g1", "g2"])
    assert [f.ts_ns for f in found] == [T0 + 130 * _S, T0 + 140 * _S]
    hit = score_run(STRAGGLER, Judged(findings, {}))
    assert hit.found and hit.delay_s == 70.0 and hit.problems == []
    job = Truth("job-power-brake", False, None, "j", T0, T0 + 240 * _S, 0.45, 315.0)
    assert matches(job, [_finding(kinds.BRAKE, None, 30), _finding(kinds.BRAKE, "g9", 40)], ["g0"])[0].ts_ns == (
        T0 + 30 * _S
    )  # the job itself or its GPUs, not a GPU outside it


def test_wording_must_state_true_numbers() -> None:
    def problems(summary: str, truth: Truth = STRAGGLER, at_s: float = 130, last_seen: int | None = None) -> list[str]:
        return wording_problems(_finding(truth.cls, truth.gpu_uuid, at_s, summary), truth, last_seen)

    assert problems("straggler: 25% slower (robust z 20.5)") == []
    assert problems("straggler: 21% slower") == []  # 20% less work per second, within 10%
    assert problems("straggler: 30% slower") == ["30% slower, truly 25.0% or 20.0%"]
    assert problems("straggler: ? slower (robust z ?)") == ["states '?'"]
    assert problems("straggler: 0% slower") == ["says 0% slower", "0% slower, truly 25.0% or 20.0%"]
    leak = Truth("memory-leak", False, "g1", "j", T0, T0 + 600 * _S, 0.02, 80e9)
    assert problems("grows 2.1% of its memory per minute, steadily for 2.0 min", leak, at_s=120) == []
    assert problems("grows 1.7% of its memory per minute, steadily for 2.2 min", leak, at_s=105) == [
        "grows 1.7% per minute, truly 2%",
        "for 2.2 min, truly 105 s",
    ]
    gone = Truth("stops-reporting", False, "g1", "j", T0, T0 + 100 * _S, 0.0)
    assert problems("silent for 30 s", gone, at_s=40, last_seen=T0 + 10 * _S) == []
    assert problems("silent for 26 s", gone, at_s=25, last_seen=T0 + 10 * _S) == ["silent for 26 s, truly 15 s"]


def test_a_silent_gpus_delay_counts_from_the_first_poll_it_missed() -> None:
    seen = {"g0": np.arange(0, 100, 10) * _S + T0, "g1": np.arange(0, 40, 10) * _S + T0}
    gone = Truth("stops-reporting", False, "g1", "j", T0 + 35 * _S, T0 + 110 * _S, 0.0)
    assert evidence_ns(gone, seen) == T0 + 40 * _S
    hit = score_run(gone, Judged([_finding(kinds.LOST_BUS, "g1", 70, "silent for 40 s")], seen))
    assert hit.delay_s == 30.0 and hit.problems == []


def test_a_gpu_slow_from_its_first_sample_is_timed_from_the_first_poll_once_the_job_computes() -> None:
    """Slowness needs work: the idle seconds before the job computes show no pace, so the delay counts from the
    first poll at or after the job's busy start (40 s here), not from the trace's first sample; a fault that starts
    after the busy start, or a run without a busy start, counts from the fault's start."""
    seen = {"g0": np.arange(0, 300, 10) * _S + T0, "g1": np.arange(0, 300, 10) * _S + T0}
    slow = Truth("slow-from-start", False, "g1", "j", T0, T0 + 300 * _S, 0.85)
    found = Judged([_finding(kinds.STRAGGLER, "g1", 100, "straggler: 18% slower")], seen)
    assert evidence_ns(slow, seen, T0 + 38 * _S) == T0 + 40 * _S
    assert score_run(slow, found, T0 + 38 * _S).delay_s == 60.0
    assert score_run(slow, found).delay_s == 100.0
    later = Truth("straggler", False, "g1", "j", T0 + 50 * _S, T0 + 300 * _S, 0.8)
    assert evidence_ns(later, seen, T0 + 38 * _S) == T0 + 50 * _S


def test_a_delay_counts_to_when_the_finding_was_sent_not_to_the_window_it_is_dated_by() -> None:
    """A straggler window is dated at its end (here 130 s) but judged with the first poll after it, which at 60 s
    sampling comes at 180 s: the delay is to the poll that sent it; a finding sent at its own time keeps it."""
    dated = _finding(kinds.STRAGGLER, "g1", 130, "straggler: 25% slower")
    hit = score_run(STRAGGLER, Judged([dated], {}, [], [T0 + 180 * _S]))
    assert hit.found and hit.delay_s == 120.0
    assert score_run(STRAGGLER, Judged([dated], {}, [], [T0 + 130 * _S])).delay_s == 70.0


def _hits(cls: str, delays: list[float | None], quiet: tuple[str, ...] = ()) -> ClassScore:
    t = Truth(cls, False, "g", "j", 0, 1, 0.8)
    q = Truth(cls, True, "g", "j", 0, 1, 0.97)
    score = ClassScore(cls, [Hit(t, d is not None, d) for d in delays])
    score.quiet = [Hit(q, bool(s), None, "", s) for s in quiet]
    return score


def test_the_bars_recall_delay_quiet_and_control() -> None:
    classes = {
        "straggler": _hits("straggler", [10.0] * 9 + [None]),  # 0.9 found, 10 s
        "stops-reporting": _hits("stops-reporting", [4.0, 6.0, 4.0]),  # median 4 s
        "memory-leak": ClassScore("memory-leak", invisible="no column memory_used_bytes"),
    }
    assert Result(10.0, "day-one", classes, []).failures() == []
    classes["straggler"] = _hits("straggler", [70.0] * 8 + [None] * 2, quiet=("info", "warning", ""))
    assert classes["straggler"].recall == 0.8 and classes["straggler"].quiet_alarms == 2
    control = [_finding(kinds.STRAGGLER, "g0", 5), _finding(kinds.IDLE, "g0", 5, severity=Severity.INFO)]
    assert Result(10.0, "day-one", classes, control).failures() == [
        "10 s, day-one: straggler recall 0.80 < 0.9",
        "10 s, day-one: straggler median delay 70 s > 60 s",
        "10 s, day-one: straggler quiet version raised a warning/critical in 1 run(s)",
        "10 s, day-one: 1 warning/critical finding(s) on the untouched trace",
    ]


def test_evaluate_overlay_runs_end_to_end_on_the_nanogpt_trace_at_10_s() -> None:
    trace, mapping = NANOGPT / "gpu_metrics_f4f827dd.csv", NANOGPT / "mapping.toml"
    args = ["evaluate", "--overlay", str(trace), "--mapping", str(mapping), "--intervals", "10"]
    result = CliRunner().invoke(cli, [*args, "--learning", "day-one", "--json"])
    assert result.exit_code in (0, 1), result.output
    out = json.loads(result.stdout)
    assert out["mode"] == "offline, overlay" and len(out["results"]) == 1
    r = out["results"][0]
    assert r["interval_s"] == 10.0 and r["learning"] == "day-one"
    assert isinstance(r["control"], list)  # every finding on the untouched trace, whatever they are
    assert r["classes"]["memory-leak"]["invisible"] == "no column memory_used_bytes"
    for cls in CLASSES:
        if cls != "memory-leak":
            c = r["classes"][cls]
            assert c["faults"] >= 2 and c["quiet"] >= 1 and 0 <= c["found"] <= c["faults"], cls
    assert (result.exit_code == 1) == bool(out["failures"])
