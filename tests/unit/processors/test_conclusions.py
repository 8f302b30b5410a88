"""What the processor exposes of its conclusions: each GPU's latest verdict (a state set) and score, open findings,
samples by verdict, and GPU time per application with its idle (held by a job, under 5% utilization) part; bounded
labels; a GPU or finding not heard of for a while leaves."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from pipeline.events import Finding, GpuSample, InterpretedBatch, InterpretedEvent, Severity, Verdict, Workload
from processors.conclusions import VERDICTS, Conclusions
from tests.fakes.clock import Clock

S = 1_000_000_000
T0 = 1_750_000_000 * S
H100 = "NVIDIA H100 80GB HBM3"
TRAINING = Workload("llm-pretraining", job_id="job-1", source="slurm", confidence=0.95)


def row(
    gpu: int, t: float, util: float, verdict: Verdict, score: float | None, workload: Workload | None
) -> InterpretedEvent:
    sample = GpuSample("c1", "n1", f"GPU-{gpu}", gpu, H100, T0 + int(t * S), {"utilization_gpu_percent": util})
    return InterpretedEvent(sample, workload=workload, score=score, verdict=verdict)


def batch(*rows: InterpretedEvent) -> InterpretedBatch:
    return InterpretedBatch.from_events(list(rows))


def exposed(conclusions: Conclusions) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(conclusions)
    return registry


def gpu(i: int) -> dict[str, str]:
    return {"cluster": "c1", "node": "n1", "gpu": f"GPU-{i}", "gpu_index": str(i), "gpu_model": H100}


def test_each_gpu_shows_its_latest_verdict_and_score() -> None:
    c = Conclusions()
    c.observe(batch(row(0, 0, 90, Verdict.NORMAL, 1.5, TRAINING), row(1, 0, 90, Verdict.UNSCORED, None, None)))
    c.observe(batch(row(0, 1, 90, Verdict.ANOMALOUS, 9.0, TRAINING), row(0, 0.5, 90, Verdict.NORMAL, 1.0, TRAINING)))
    r = exposed(c)
    for v in VERDICTS:
        assert r.get_sample_value("hermeneut_gpu_verdict", gpu(0) | {"verdict": v}) == float(v == "anomalous")
        assert r.get_sample_value("hermeneut_gpu_verdict", gpu(1) | {"verdict": v}) == float(v == "unscored")
    assert r.get_sample_value("hermeneut_gpu_score", gpu(0)) == 9.0  # the late row did not overwrite it
    assert r.get_sample_value("hermeneut_gpu_score", gpu(1)) is None  # unscored: no score
    judged = {v: r.get_sample_value("hermeneut_processor_verdicts_total", {"verdict": v}) for v in VERDICTS}
    assert judged == {"unscored": 1.0, "normal": 2.0, "unusual": 0.0, "anomalous": 1.0}


def test_gpu_time_per_application_and_its_idle_part() -> None:
    c = Conclusions()
    idle_job = [row(0, t, 1.0, Verdict.NORMAL, 1.0, TRAINING) for t in range(11)]  # held by a job, idle
    busy = [row(1, t, 97.0, Verdict.NORMAL, 1.0, TRAINING) for t in range(11)]
    no_job = [row(2, t, 0.0, Verdict.UNSCORED, None, None) for t in range(11)]  # idle, but nobody holds it
    c.observe(batch(*idle_job[:5], *busy[:5], *no_job[:5]))
    c.observe(batch(*idle_job[5:], *busy[5:], *no_job[5:]))
    c.observe(batch(row(0, 200, 1.0, Verdict.NORMAL, 1.0, TRAINING)))  # after a silence: the gap does not count
    r = exposed(c)
    assert r.get_sample_value("hermeneut_gpu_seconds_total", {"application": "llm-pretraining"}) == 20.0
    assert r.get_sample_value("hermeneut_gpu_idle_seconds_total", {"application": "llm-pretraining"}) == 10.0
    assert r.get_sample_value("hermeneut_gpu_seconds_total", {"application": "unknown"}) == 10.0
    assert r.get_sample_value("hermeneut_gpu_idle_seconds_total", {"application": "unknown"}) == 0.0


def finding(detector: str, gpu_uuid: str | None, active: bool, severity: Severity = Severity.CRITICAL) -> Finding:
    return Finding(detector, severity, active, "c1", "n1", gpu_uuid, H100, T0, T0, "summary")


def test_open_findings_open_and_close_with_their_records() -> None:
    c = Conclusions()
    c.findings([finding("nvlink-down", "GPU-2", True), finding("power-capping", None, True, Severity.WARNING)])
    c.findings([finding("nvlink-down", "GPU-2", True), finding("xid-storm", "GPU-3", True)])  # a repeat, a new one
    c.findings([finding("xid-storm", "GPU-3", False)])
    r = exposed(c)
    labels = {"cluster": "c1", "node": "n1"}
    assert r.get_sample_value("hermeneut_finding_open", labels | {"gpu": "GPU-2", "detector": "nvlink-down",
                                                                   "severity": "critical"}) == 1.0  # fmt: skip
    assert r.get_sample_value("hermeneut_finding_open", labels | {"gpu": "", "detector": "power-capping",
                                                                   "severity": "warning"}) == 1.0  # fmt: skip
    assert b"xid-storm" not in generate_latest(r)


def test_what_is_not_heard_of_for_a_while_leaves() -> None:
    clock = Clock(100.0)
    c = Conclusions(stale_after_s=180.0, clock=clock)
    c.observe(batch(row(0, 0, 90, Verdict.NORMAL, 1.0, TRAINING), row(1, 0, 90, Verdict.NORMAL, 1.0, TRAINING)))
    c.findings([finding("nvlink-down", "GPU-0", True), finding("nvlink-down", "GPU-1", True)])
    clock.now += 120
    c.observe(batch(row(0, 120, 90, Verdict.NORMAL, 1.0, TRAINING)))
    c.findings([finding("nvlink-down", "GPU-0", True)])  # repeated: still open
    clock.now += 120  # GPU-1 and its finding: 240 s without a word (its partition moved, or its node went away)
    text = generate_latest(exposed(c)).decode()
    assert 'gpu="GPU-0"' in text and 'gpu="GPU-1"' not in text
    assert text.count("hermeneut_finding_open{") == 1
    # 120 s apart: a silence, not time seen (and no time seen is not a series)
    assert exposed(c).get_sample_value("hermeneut_gpu_seconds_total", {"application": "llm-pretraining"}) is None


def test_labels_identify_a_gpu_and_nothing_else() -> None:
    c = Conclusions()
    jobs = [Workload("llm-serving", job_id=f"job-{i}", user=f"user-{i}") for i in range(50)]
    c.observe(batch(*(row(0, t, 90, Verdict.NORMAL, 1.0, jobs[t]) for t in range(50))))
    text = generate_latest(exposed(c)).decode()
    assert "job-" not in text and "user-" not in text
    series = [line for line in text.splitlines() if line.startswith("hermeneut_gpu_verdict{")]
    assert len(series) == len(VERDICTS)  # 50 jobs on one GPU: still 4 series
