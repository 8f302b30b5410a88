"""The provisioned Grafana dashboards' Flux queries run against the real InfluxDB with data written by the real
pipeline: every panel and variable query parses and executes, and the panels that must show data do.

Grafana itself is not available on this machine; Grafana only adds its ``v`` record (time range, window) and
substitutes the dashboard variables, which the test does the same way.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Settings
from producers.simulator import Fleet
from sinks.query.store import Store

from .harness import publish_batches, running_pipeline, wait_stored

pytestmark = pytest.mark.integration

DASHBOARDS = Path(__file__).resolve().parents[2] / "grafana" / "dashboards"
#: panels that must return rows on a healthy simulated fleet with no job context
MUST_SHOW = {
    "GPUs reporting",
    "mean power / limit",
    "mean utilization",
    "power / limit by GPU model",
    "hottest GPUs: temperature / slowdown (max)",
    "utilization",
    "temperature / slowdown threshold",
}


def _queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    out = [(f"variable {v['name']}", v["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]
    out += [(p["title"], t["query"]) for p in dashboard["panels"] for t in p["targets"]]
    return out


def _grafana_render(flux: str, variables: dict[str, str]) -> str:
    """Substitute ${var} / ${var:regex} like Grafana and define its ``v`` record after any imports."""
    for name, value in variables.items():
        flux = flux.replace(f"${{{name}:regex}}", re.escape(value)).replace(f"${{{name}}}", value)
    assert "${" not in flux, f"unsubstituted variable in {flux!r}"
    lines = flux.splitlines()
    imports = [line for line in lines if line.startswith("import ")]
    rest = [line for line in lines if not line.startswith("import ")]
    return "\n".join([*imports, "v = {timeRangeStart: -1h, timeRangeStop: now(), windowPeriod: 10s}", *rest])


def test_dashboards_are_provisioned_against_the_provisioned_datasource() -> None:
    names = sorted(p.stem for p in DASHBOARDS.glob("*.json"))
    assert names == ["fleet", "gpu", "job"]
    uids = set()
    for path in DASHBOARDS.glob("*.json"):
        d = json.loads(path.read_text())
        uids.add(d["uid"])
        for panel in d["panels"]:
            assert panel["datasource"]["uid"] == "hermeneut-influxdb", panel["title"]
            assert panel["targets"], panel["title"]
    assert len(uids) == 3


def test_every_dashboard_query_runs_on_pipeline_data(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet(nodes=2, gpus_per_node=4, cluster=settings.cluster, seed=5)
    start_ms = time.time_ns() // 1_000_000 - 300_000
    # a minute of rounds, and one round 4 minutes later: the sink writes a minute's rollups (which the fleet
    # panels read) once it has seen a sample a minute past it
    times = [start_ms + r * 2000 for r in range(30)] + [start_ms + 240_000]
    batches = [b for t in times for b in fleet.tick(t * 1_000_000)]
    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches)
        wait_stored(sink, 31 * 8)
    i = settings.influxdb
    store = Store.from_settings(settings)
    variables = {"bucket": i.bucket, "cluster": settings.cluster, "gpu": fleet.uuids[0], "job": "no-such-job"}
    try:
        for path in sorted(DASHBOARDS.glob("*.json")):
            for title, flux in _queries(json.loads(path.read_text())):
                rows = store.flux_records(_grafana_render(flux, variables))  # raises on a Flux error
                if title in MUST_SHOW:
                    assert rows, f"{path.name}: panel {title!r} shows nothing"
                if title == "GPUs reporting":
                    assert rows[0]["_value"] == 8
                if title == "variable gpu":
                    assert {r["_value"] for r in rows} == set(fleet.uuids)
    finally:
        store.close()
