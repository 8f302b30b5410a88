"""Interpreted batches too big for one Kafka message are split into parts that keep every row, in order."""

from __future__ import annotations

import numpy as np

from pipeline.codec import decode_interpreted
from pipeline.events import EventKind, GpuEvent, GpuSample, InterpretedBatch, InterpretedEvent
from processors.app import MAX_MESSAGE_BYTES, encoded_parts


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
