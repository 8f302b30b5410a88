"""AMD device-metrics-exporter scrapes through the real pipeline (a local Kafka and InfluxDB started by the
project, a processor and a sink as child processes): every row read is stored or dead-lettered, what InfluxDB
holds is each mapped field in the schema's unit, the catalogue's limits sit in ``gpu_info``, an AFID is a
``gpu_event`` of kind ``afid`` and the processor judged it: a ``ras-event`` finding."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Settings
from pipeline.services.stages import wait_for
from sinks.query import Store
from sinks.retention import setup, task_specs
from tests import TESTDATA
from tests.unit.producers.amd.test_exporter import UNITS, lines

from .conftest import InfluxServer, KafkaServer
from .harness import running_pipeline, stored_points
from .test_import import accounted, import_settings, imported

pytestmark = pytest.mark.integration

MI300X_VF = "17ff74b5-0000-1000-805c-37b0fbe69430"
#: the fields the sink keeps in gpu_info (limits) rather than with every sample
LIMITS = {"memory_total_bytes", "pcie_link_gen_max"}


@pytest.fixture(scope="module")
def amd_settings(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """A cluster, bucket and pipeline of this module's own (as the import tests make theirs), removed after."""
    s = import_settings(kafka_server, influx_server, defaults, tmp_path_factory.mktemp("amd-import-state"))
    setup(s)
    with running_pipeline(s, tmp_path_factory.mktemp("amd-import-pipeline")):
        yield s
    with Store.from_settings(s) as store:
        for spec in task_specs(s):
            for task in store.client.tasks_api().find_tasks(name=spec.name):
                store.client.tasks_api().delete_task(task.id)
        for name in (s.influxdb.bucket, f"{s.influxdb.bucket}_1m", f"{s.influxdb.bucket}_jobs"):
            found = store.client.buckets_api().find_bucket_by_name(name)
            if found is not None:
                store.client.buckets_api().delete_bucket(found)


def test_amd_scrapes_are_stored_in_the_schemas_units_with_their_afids(amd_settings: Settings, tmp_path: Path) -> None:
    settings = amd_settings
    scrape = tmp_path / "mi300x.prom"
    scrape.write_text(
        lines({name: printed for name, printed, _, _ in UNITS})
        + lines({"gpu_afid_errors": 30}, afid_index="0", severity="fatal")
    )
    paths = (
        scrape,
        TESTDATA / "amd" / "device-metrics-exporter-docs",
        TESTDATA / "amd" / "device-metrics-exporter-issues",
    )
    outcome = imported(settings, "amd-exporter", {"paths": paths, "time": "2026-12-01T00:00:00Z"}, paths)
    accounted(outcome)
    assert outcome.report.rows_read == 2 and outcome.stored == 2 and outcome.dead_total == 0  # MI300X, docs' GPU 0

    want = {field: value for _, _, field, value in UNITS}
    (row,) = [r for r in stored_points(settings) if r["gpu"] == MI300X_VF]
    (info,) = [r for r in stored_points(settings, "gpu_info") if r["gpu"] == MI300X_VF][:1]
    stored = {f: row[f] for f in want if f in row} | {f: info[f] for f in LIMITS & set(want) if f in info}
    assert set(stored) == set(want), sorted(set(want) - set(stored))
    assert stored == pytest.approx(want, rel=1e-9)
    assert info["power_limit_watts"] == 750.0  # the catalogue's MI300X TDP: the exporter prints no cap
    assert row["gpu_model"] == "AMD Instinct MI300X"  # the vendor in the model's first word

    events = [e for e in stored_points(settings, "gpu_event") if e["gpu"] == MI300X_VF]
    assert [(e["kind"], e["code"]) for e in events] == [("afid", "30")]
    assert events[0]["detail"].startswith("fatal: fatal hardware error (AFID 30)")

    # judged: a critical ras-event finding on that GPU, in the words of its CPER severity
    def ras() -> list[dict[str, Any]]:
        found = stored_points(settings, "finding")
        return [f for f in found if f["detector"] == "ras-event" and f["gpu"] == MI300X_VF]

    assert wait_for(lambda: bool(ras()), 60)
    first = min(ras(), key=lambda f: f["_time"])
    assert first["severity"] == "critical" and first["active"] == 1.0
    assert "AMD RAS event: fatal hardware error (CPER severity fatal, AFID 30)" in first["summary"]
    docs = [r for r in stored_points(settings) if r["gpu"] == "xxxx/0"]
    assert [(r["sm_clock_mhz"], r["memory_clock_mhz"]) for r in docs] == [(132.0, 900.0)]
