"""The real multi-GPU telemetry time series in tests/testdata import whole through their mapping files: every row,
no dead letter, the GPU count of the job, and the readings as the file writes them (each trace's README says where
it comes from and what happens in it)."""

from __future__ import annotations

import csv
from dataclasses import dataclass

import numpy as np
import pytest

from pipeline import registry
from pipeline.config import Settings
from producers.importers.rows import Block
from tests import TESTDATA


@dataclass(frozen=True)
class Trace:
    folder: str
    file: str
    rows: int
    gpus: int
    #: schema field -> the file's column, compared value for value
    columns: tuple[tuple[str, str], ...]


TRACES = (
    Trace(
        "nanogpt-pr643-h100x8-colocation-timeseries",
        "gpu_metrics_b443a1c3.csv",
        36112,
        8,
        (
            ("power_watts", "power_W"),
            ("utilization_gpu_percent", "utilization_gpu_percent"),
            ("temperature_gpu_celsius", "temperature_C"),
        ),
    ),
)


def imported(trace: Trace) -> list[Block]:
    folder = TESTDATA / trace.folder
    importer = registry.create(
        "importer", "table", Settings(cluster="dc1"), paths=(folder / trace.file,), mapping=folder / "mapping.toml"
    )
    importer.open()
    try:
        return list(importer.blocks())
    finally:
        importer.close()


@pytest.mark.parametrize("trace", TRACES, ids=[t.folder for t in TRACES])
def test_trace_imports_every_row_of_every_gpu(trace: Trace) -> None:
    blocks = imported(trace)
    assert [len(b.rejected) for b in blocks] == [0] * len(blocks)
    assert sum(len(b.rows) for b in blocks) == trace.rows
    assert len({uuid for b in blocks for uuid in b.rows.gpu_uuid}) == trace.gpus
    with (TESTDATA / trace.folder / trace.file).open(newline="") as f:
        source = list(csv.DictReader(f, skipinitialspace=True))
    assert len(source) == trace.rows
    for field, column in trace.columns:
        got = np.concatenate([b.rows.metrics[field] for b in blocks])
        assert got.tolist() == [float(row[column]) for row in source], field
    # every sample of one GPU is later than the one before: the time column is read, not replaced
    for b in blocks:
        for uuid in set(b.rows.gpu_uuid):
            ts = b.rows.ts_ns[np.array(b.rows.gpu_uuid) == uuid]
            assert np.all(np.diff(ts) > 0), uuid
