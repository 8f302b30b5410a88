"""Findings and settings for the alerting unit tests (pure logic, no servers)."""

from __future__ import annotations

from pipeline.config import AlertSettings
from pipeline.events import Finding, Severity, Workload

S = 1_000_000_000


def finding(
    active: bool,
    ts_s: float,
    detector: str = "thermal-throttling",
    gpu: str | None = "GPU-1",
    node: str = "n1",
    severity: Severity = Severity.WARNING,
    since_s: float | None = None,
    application: str = "llm-pretraining",
    cluster: str = "c1",
) -> Finding:
    return Finding(
        detector,
        severity,
        active,
        cluster,
        node,
        gpu,
        "H100-SXM5-80GB",
        int(ts_s * S),
        int((ts_s if since_s is None else since_s) * S),
        f"{detector} on {node}/{gpu}",
        action="look at it",
        evidence={"temperature_gpu_celsius": 91.0},
        workload=Workload(application, job_id="job-7", user="alice", tenant="team-a"),
        gpu_index=0,
    )


def settings(**overrides: object) -> AlertSettings:
    base: dict[str, object] = {
        "group_wait_s": 0.0,
        "group_interval_s": 10.0,
        "repeat_interval_s": 3600.0,
        "flap_threshold": 4,
        "flap_window_s": 600.0,
        "flap_quiet_s": 300.0,
    }
    return AlertSettings(**(base | overrides))  # type: ignore[arg-type]
