"""The local servers the project starts are started the way the measurements say."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.services import influxdb

from .conftest import InfluxServer

pytestmark = pytest.mark.integration


def test_influxd_runs_with_the_measured_gc_target_unless_the_operator_set_one(influx_server: InfluxServer) -> None:
    """GOGC=400 cut influxd's CPU per written point by 15-25% (docs/performance.md); an operator's own GOGC wins."""
    environ = Path(f"/proc/{influx_server.proc.pid}/environ").read_bytes().split(b"\0")
    expected = os.environ.get("GOGC", influxdb.GOGC)
    assert [v for v in environ if v.startswith(b"GOGC=")] == [f"GOGC={expected}".encode()]
