"""Saved AMD device-metrics-exporter scrapes as an importer: the live mapping per file, times, workloads, AFIDs
across files, a bad file as one dead letter."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from pipeline import registry
from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.events import EventKind
from producers.importers.rows import Block
from tests import TESTDATA

AMD = TESTDATA / "amd"
MI300X_VF = AMD / "device-metrics-exporter-issues" / "mi300x-vf-issue171.prom"
NOON_NS = 1_772_798_400_000_000_000  # 2026-03-06T12:00:00Z


def blocks(**options: Any) -> list[Block]:
    importer = registry.create("importer", "amd-exporter", Settings(cluster="dc1"), **options)
    importer.open()
    try:
        return list(importer.blocks())
    finally:
        importer.close()


def line(name: str, value: float, ts_ms: int | None = None, **labels: str) -> str:
    """One series on the real MI300X VF's label set, ``labels`` set or added."""
    real = MI300X_VF.read_text().splitlines()[2]
    pairs = dict(re.findall(r'(\w+)="([^"]*)"', real[real.index("{") : real.rindex("}")])) | labels
    rendered = ",".join(f'{k}="{v}"' for k, v in pairs.items())
    return f"{name}{{{rendered}}} {value}" + ("" if ts_ms is None else f" {ts_ms}") + "\n"


def test_the_documented_examples_and_the_real_line_as_files() -> None:
    found = {b.label: b for b in blocks(paths=(AMD / "device-metrics-exporter-docs",), time="2026-03-06T12:00:00Z")}
    rows = found["metricslist-examples.prom"].rows
    assert rows.gpu_uuid == ("xxxx/0",) and rows.node == ("xxxx",) and int(rows.ts_ns[0]) == NOON_NS
    assert rows.metrics["sm_clock_mhz"][0] == 132.0 and rows.metrics["memory_clock_mhz"][0] == 900.0
    (vf,) = blocks(paths=(MI300X_VF,))
    assert len(vf.rows) == 0 and vf.rejected == ()  # its one series is a 0 degC edge sensor: no reading, no row


def test_timestamped_scrapes_workloads_and_afids_across_files(tmp_path: Path) -> None:
    t1, t2, t3 = 1_772_798_400_000, 1_772_798_401_000, 1_772_798_402_000
    fatal = {"afid_index": "0", "severity": "fatal"}
    for name, t, activity, afid, labels in (
        ("a.prom", t1, 97, 30, {"pod": "train-0", "namespace": "ml"}),
        ("b.prom", t2, 98, 30, {"pod": "train-0", "namespace": "ml"}),
        ("c.prom", t3, 5, 12, {"job_id": "4242"}),
    ):
        text = line("gpu_gfx_activity", activity, t, **labels) + line("gpu_afid_errors", afid, t, **fatal)
        (tmp_path / name).write_text(text)
    a, b, c = blocks(paths=(tmp_path,), application="llm-pretraining")
    assert [blk.rows.metrics["utilization_gpu_percent"][0] for blk in (a, b, c)] == [97.0, 98.0, 5.0]
    assert [int(blk.rows.ts_ns[0]) for blk in (a, b, c)] == [t1 * 10**6, t2 * 10**6, t3 * 10**6]
    assert a.rows.node == ("master-1",) and a.rows.workload is not None and a.rows.workload[0] is not None
    assert a.rows.workload[0].job_id == "ml/train-0" and a.rows.workload[0].application == "llm-pretraining"
    assert [(e.kind, e.code) for e in a.rows.events] == [(EventKind.AFID, 30)]
    assert b.rows.events == ()  # the same AFID as the previous file: no new event
    assert [e.code for e in c.rows.events] == [12]
    assert c.rows.workload is not None and c.rows.workload[0] is not None and c.rows.workload[0].job_id == "4242"


def test_a_series_twice_in_one_file_is_malformed(tmp_path: Path) -> None:
    (tmp_path / "two.prom").write_text(line("gpu_gfx_activity", 1, 1_000) + line("gpu_gfx_activity", 2, 2_000))
    (block,) = blocks(paths=(tmp_path,))
    assert [r.reason for r in block.rejected] == ["malformed"] and "repeats a series" in block.rejected[0].detail


def test_a_file_that_is_not_exposition_text_is_one_dead_letter(tmp_path: Path) -> None:
    (tmp_path / "cut.prom").write_text(line("gpu_gfx_activity", 1) + 'gpu_umc_activity{gpu_id="0" 3\n')
    (block,) = blocks(paths=(tmp_path,))
    (bad,) = block.rejected
    assert bad.reason == "malformed" and bad.detail.startswith("line 2") and len(block.rows) == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "give scrape files"),
        ({"paths": (Path("/nonexistent.prom"),)}, "does not exist"),
        ({"paths": (MI300X_VF,), "time": "noon"}, "--time"),
        ({"paths": (MI300X_VF,), "application": "chess"}, "is not one of"),
    ],
)
def test_bad_options_are_one_line_before_anything_is_read(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        registry.create("importer", "amd-exporter", Settings(cluster="dc1"), **options)


def test_the_command_is_there() -> None:
    result = CliRunner().invoke(cli, ["import", "amd-exporter", "--help"])
    assert result.exit_code == 0 and "Saved AMD device-metrics-exporter scrapes" in result.output
