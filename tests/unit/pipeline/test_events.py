"""The interpreted batch: ``take`` cuts every per-row column alike and decides once where the node extras go."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.codec import decode_interpreted, encode_interpreted
from pipeline.events import (
    Driver,
    EventKind,
    GpuEvent,
    GpuProcess,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    NvLinkSample,
    Verdict,
    Workload,
)

XID = GpuEvent("c", "n", "GPU-1", 1, 10**18, EventKind.XID, 13)


def _batch(n: int = 5) -> InterpretedBatch:
    events = [
        InterpretedEvent(
            GpuSample(
                "c", "n", f"GPU-{i}", i, "H100", 10**18 + i, {"power_watts": float(100 + i)},
                links=(NvLinkSample(0, True),) if i % 2 else None,
                processes=(GpuProcess(100 + i, "python", 2**30),) if i % 3 == 0 else None,
            ),
            relative={"power_ratio_of_limit": i / 10},
            workload=Workload("hashing") if i % 2 else None,
            score=float(i),
            verdict=Verdict.NORMAL,
            baseline=f"b{i}",
            explanation=f"row {i}",
            phase="compute" if i % 2 else None,
            drivers=(Driver("power_ratio_of_limit", i / 10, 0.5, 0.4, 0.6),) if i == 3 else (),
        )
        for i in range(n)
    ]  # fmt: skip
    batch = InterpretedBatch.from_events(events, (XID,))
    return dataclasses.replace(batch, features=np.arange(n * 2, dtype=np.float64).reshape(n, 2))


def _rows(batch: InterpretedBatch) -> list[tuple[object, ...]]:
    """Every per-row value of a batch, row by row (the derived features included)."""
    assert batch.features is not None
    return [
        (e.sample, tuple(e.relative.items()), e.workload, e.score, e.verdict, e.baseline, e.explanation, e.phase,
         e.drivers, tuple(f))
        for e, f in zip(batch.events(), batch.features.tolist(), strict=True)
    ]  # fmt: skip


@pytest.mark.parametrize(
    "rows",
    [slice(1, 4), slice(3, None), np.array([4, 0, 2]), np.array([True, False, True, True, False]), np.array([], int)],
)
def test_take_cuts_every_column_alike(rows: slice | np.ndarray) -> None:
    batch = _batch()
    picked = np.arange(len(batch))[rows].tolist()
    part = batch.take(rows)
    assert len(part) == len(picked)
    assert _rows(part) == [_rows(batch)[i] for i in picked]
    assert part.gpu_events == (XID,) and part.schema_version == batch.schema_version


def test_node_extras_go_with_one_part_only() -> None:
    batch = _batch()
    first, rest = batch.take(slice(0, 2)), batch.take(slice(2, None), extras=False)
    assert first.gpu_events == (XID,) and rest.gpu_events == () and rest.nics == ()
    assert _rows(first) + _rows(rest) == _rows(batch)


def test_features_are_derived_and_stay_off_the_wire() -> None:
    batch = _batch()
    assert decode_interpreted(encode_interpreted(batch)).features is None
    assert batch.take(slice(0, 1)).features is not None
    assert dataclasses.replace(batch, features=None).take(slice(0, 2)).features is None
