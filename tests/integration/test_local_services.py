"""The local servers the project starts are started the way the measurements say."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

import pytest

from bench.pipeline import influxd_cache_bytes
from pipeline.services import influxdb
from sinks.influxdb.write import InfluxWriter

from .conftest import InfluxServer

pytestmark = pytest.mark.integration


def test_influxd_runs_with_the_measured_settings_unless_the_operator_set_them(influx_server: InfluxServer) -> None:
    """GOGC=400 cut influxd's CPU per written point by 15-25%, a 64 MiB cache snapshot its CPU per sample of a live
    10,000-GPU fleet by about a quarter (docs/performance.md); an operator's own settings win."""
    environ = Path(f"/proc/{influx_server.proc.pid}/environ").read_bytes().split(b"\0")
    for name, measured in influxdb.ENVIRONMENT.items():
        expected = os.environ.get(name, measured)
        assert [v for v in environ if v.startswith(f"{name}=".encode())] == [f"{name}={expected}".encode()]


def test_influxd_applies_the_cache_snapshot_size_and_reports_what_its_cache_holds(influx_server: InfluxServer) -> None:
    """influxd took the setting (its own /api/v2/config says so), and what the benchmark reads to wait for a phase's
    cache to be written out (its /metrics) is there and counts a write."""
    p = influx_server.proc
    request = urllib.request.Request(f"{p.url}/api/v2/config", headers={"Authorization": f"Token {p.token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        config = json.load(response)["config"]
    expected = os.environ.get("INFLUXD_STORAGE_CACHE_SNAPSHOT_MEMORY_SIZE", str(influxdb.CACHE_SNAPSHOT_BYTES))
    assert config["storage-cache-snapshot-memory-size"] == int(expected)
    before = influxd_cache_bytes(p.url)
    writer = InfluxWriter(p.url, p.token, p.org, p.bucket)
    now_ms = time.time_ns() // 1_000_000
    writer.write([f"local_services_probe,test=cache value={i}.0 {now_ms - i}" for i in range(1000)])
    writer.close()
    assert influxd_cache_bytes(p.url) >= before + 1000 * 16  # a timestamp and a float per value, at least
