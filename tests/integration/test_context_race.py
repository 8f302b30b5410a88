"""The context race, live: a workload context published just before a GPU's first sample labels that sample,
through the real processor and sink (the processor catches its context mirror up before labelling a batch)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.codec import encode_record, encode_samples
from pipeline.config import Settings
from pipeline.events import GpuContext, GpuSample, SampleBatch, Workload
from pipeline.publisher import Publisher

from .harness import running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration

GPUS = 20


def test_a_context_published_just_before_the_first_sample_labels_it(settings: Settings, tmp_path: Path) -> None:
    with running_pipeline(settings, tmp_path / "run") as (_processor, sink):
        publisher = Publisher(settings.kafka.client_config(), linger_ms=0)
        for g in range(GPUS):  # each GPU: its job starts, and its first reading follows at once
            uuid, now = f"GPU-race-{g}", time.time_ns()
            workload = Workload("llm-serving", job_id=f"job-{g}", source="manual", confidence=1.0)
            context = GpuContext(settings.cluster, "race", uuid, now, workload)
            publisher.publish(settings.topics.context, context.kafka_key, encode_record(context))
            assert publisher.flush(30) == 0  # acknowledged by the broker before the sample is sent
            sample = GpuSample(settings.cluster, "race", uuid, g, "NVIDIA H100 80GB HBM3", now + 1_000_000,
                               {"utilization_gpu_percent": 90.0, "power_watts": 400.0})  # fmt: skip
            batch = SampleBatch(settings.cluster, "race", (sample,))
            publisher.publish(settings.topics.raw, batch.kafka_key, encode_samples(batch))
            assert publisher.flush(30) == 0
            time.sleep(0.2)  # rounds apart, as a collector's are: each a batch of its own
        assert publisher.close(30) == 0
        wait_stored(sink, GPUS)
    labelled = {p["gpu"]: p.get("job_id") for p in stored_points(settings)}
    assert labelled == {f"GPU-race-{g}": f"job-{g}" for g in range(GPUS)}
