"""The main job end to end, against servers configured as external (so it must start nothing local)."""

from __future__ import annotations

import pytest

from pipeline import services
from pipeline.config import Settings
from pipeline.mainjob import main_job

from .harness import stored_points

pytestmark = pytest.mark.integration


def test_main_job_accounts_for_every_sample(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_job(settings, nodes=2, gpus=4, duration_s=4, stop_services=False)
    out = capsys.readouterr().out
    assert services.read_state(settings) is None, "external servers configured: nothing local may start"
    rows = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    report = dict(row.rsplit(None, 1) for row in rows if row[-1].isdigit())
    produced = int(report["samples produced"])
    assert produced >= 2 * 4 * 3
    assert int(report["stored in InfluxDB"]) == produced
    assert int(report["dead-lettered"]) == 0
    assert len(stored_points(settings)) == produced
    assert "mean(power_watts)" in out and "NVIDIA" in out  # the trend read back from InfluxDB
