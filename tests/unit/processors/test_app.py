"""The processor's wiring: interpreted batches too big for one Kafka message are split into parts that keep every
row, in order; the interpretation stages share one per-GPU slot table."""

from __future__ import annotations

import numpy as np

from pipeline.codec import decode_interpreted
from pipeline.config import Settings
from pipeline.events import EventKind, GpuEvent, GpuSample, InterpretedBatch, InterpretedEvent
from processors.app import MAX_MESSAGE_BYTES, encoded_parts, interpreter_from
from processors.baselines.score import Scorer
from processors.detectors.stage import Detectors
from processors.enrich import Enricher


def test_big_batch_is_split_in_order_and_small_one_is_not() -> None:
    rng = np.random.default_rng(0)
    events = [
        InterpretedEvent(
            GpuSample("c", "n", f"GPU-{i % 8}", i % 8, "H100", 10**18 + i, {f: float(v) for f, v in zip(
                ("power_watts", "utilization_gpu_percent", "memory_used_bytes", "sm_clock_mhz", "energy_joules",
                 "temperature_gpu_celsius", "pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second"),
                rng.random(8) * 100, strict=True)}),
            explanation="x" * 200,
        )
        for i in range(6000)
    ]  # fmt: skip
    xid = GpuEvent("c", "n", "GPU-1", 1, 10**18, EventKind.XID, 13)
    batch = InterpretedBatch.from_events(events, (xid,))
    parts = encoded_parts(batch)
    assert len(parts) > 1 and all(len(p) <= MAX_MESSAGE_BYTES for p in parts)
    decoded = [decode_interpreted(p) for p in parts]
    assert np.array_equal(np.concatenate([d.ts_ns for d in decoded]), batch.ts_ns)
    assert sum((d.gpu_events for d in decoded), ()) == (xid,)
    assert np.array_equal(np.concatenate([d.metrics for d in decoded]), batch.metrics, equal_nan=True)
    assert len(encoded_parts(InterpretedBatch.from_events(events[:10]))) == 1


def test_the_stages_share_one_slot_table() -> None:
    interpreter = interpreter_from(Settings(), lambda _key: None, lambda _c, _n: None, lambda: None)
    enricher, scorer, detectors = interpreter.stages
    assert isinstance(enricher, Enricher) and isinstance(scorer, Scorer) and isinstance(detectors, Detectors)
    assert enricher.slots is scorer.tracker.slots is detectors.slots
