"""Imports of the same range merge by field, not by point: a row takes the readings already stored at its point
where it has none, never in place of its own (issue 37: a second file's half-samples were judged alone and their
verdicts overwrote the first's). On the real nanoGPT PR #643 trace, split into two files' worth of fields."""

from __future__ import annotations

import dataclasses

import numpy as np

from hermeneut.jobs.importjob import Point, merge_stored
from pipeline import registry
from pipeline.config import Settings
from producers.importers.rows import Rows
from tests import TESTDATA

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"


def _trace() -> Rows:
    importer = registry.create(
        "importer", "table", Settings(), paths=(NANOGPT / "gpu_metrics_f4f827dd.csv",), mapping=NANOGPT / "mapping.toml"
    )
    importer.open()
    try:
        (block,) = list(importer.blocks())
    finally:
        importer.close()
    rows: Rows = block.rows
    return rows


def _points(rows: Rows, names: tuple[str, ...]) -> dict[Point, dict[str, float]]:
    return {
        (node, gpu, ts // 1_000_000): {n: float(rows.metrics[n][i]) for n in names}
        for i, (node, gpu, ts) in enumerate(zip(rows.node, rows.gpu_uuid, rows.ts_ns.tolist(), strict=True))
    }


def test_a_file_of_power_readings_takes_the_temperatures_stored_by_a_file_of_the_same_range() -> None:
    full = _trace()
    others = ("temperature_gpu_celsius", "utilization_gpu_percent")
    power_only = dataclasses.replace(full, metrics={"power_watts": full.metrics["power_watts"]})
    merged, took = merge_stored(power_only, _points(full, others))
    assert took == len(full) == 6240
    for name in ("power_watts", *others):
        assert np.array_equal(merged.metrics[name], full.metrics[name], equal_nan=True), name


def test_a_rows_own_reading_is_kept_and_points_elsewhere_are_not_touched() -> None:
    full = _trace()
    stored = _points(full, ("power_watts",))
    first = next(iter(stored))
    stored = {first: {"power_watts": 1.0, "memory_used_bytes": 2.0**30}}  # another value; a field the file lacks
    merged, took = merge_stored(full, stored)
    assert took == 1
    assert np.array_equal(merged.metrics["power_watts"], full.metrics["power_watts"])
    memory = merged.metrics["memory_used_bytes"]
    assert memory[0] == 2.0**30 and np.isnan(memory[1:]).all()
    assert merge_stored(full, {}) == (full, 0)
