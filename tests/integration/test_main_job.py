"""The main job end to end, against servers configured as external (so it must start no Kafka or InfluxDB of
its own): learn from healthy history, then live with faults; every sample accounted for, the baselines learned
and taken up by the running processor, findings reported, and the dashboard serving the fleet."""

from __future__ import annotations

import json
import urllib.request

import pytest

from pipeline import services
from pipeline.config import Settings
from pipeline.face.mainjob import main_job

from .harness import stored_points

pytestmark = pytest.mark.integration


def test_main_job_accounts_for_every_sample(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        assert main_job(settings, nodes=2, gpus=4, duration_s=20, stop_services=False, learn_s=240)
        state = services.read_state(settings)
        assert state is not None and state.kafka is None and state.influxdb is None, "external servers: none local"
        assert state.web is not None
        with urllib.request.urlopen(f"{state.web['url']}/api/v1/fleet", timeout=60) as resp:
            fleet = json.load(resp)
    finally:
        services.down(settings, quiet=True)
    out = capsys.readouterr().out
    rows = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    report = dict(row.rsplit(None, 1) for row in rows if row[-1].isdigit())
    produced = int(report["samples produced"])
    assert produced >= 8 * (240 + 18)
    assert int(report["stored in InfluxDB"]) == produced
    assert int(report["dead-lettered"]) == 0
    assert len(stored_points(settings)) == produced
    assert "switched to it without a restart" in out, out
    findings = next(line for line in out.splitlines() if line.startswith("Findings: "))
    assert "ecc-uncorrectable" in findings and "pcie-link-degraded" in findings, out  # confirmed within seconds
    p50 = float(report_line(out, "latency sample->stored p50/p99").split("s /")[0])
    assert p50 < 10, "latency of the live samples (not of the backfilled history)"
    assert "p95(power_ratio_of_limit)" in out and "NVIDIA" in out  # the trend read back from InfluxDB
    assert len(fleet["gpus"]) == 8


def report_line(out: str, label: str) -> str:
    return next(line for line in out.splitlines() if line.strip().startswith(label)).split(label, 1)[1].strip()
