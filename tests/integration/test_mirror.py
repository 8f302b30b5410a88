"""The topic mirror on a real broker: it rebuilds the latest value per key from every partition, follows
updates and tombstones, and skips (and counts) records that do not decode."""

from __future__ import annotations

import pytest

from pipeline.codec import decode_record, encode_record
from pipeline.config import Settings
from pipeline.events import GpuContext, Workload
from pipeline.mirror import TopicMirror
from pipeline.publisher import Publisher
from pipeline.services.stages import wait_for

pytestmark = pytest.mark.integration


def _publish(settings: Settings, records: list[tuple[bytes, bytes | None]]) -> None:
    pub = Publisher(settings.kafka.client_config())
    for key, value in records:
        pub.publish(settings.topics.context, key, value)  # type: ignore[arg-type]
    assert pub.close(30) == 0


def test_mirror_rebuilds_and_follows_a_compacted_topic(settings: Settings) -> None:
    def ctx(gpu: str, app: str | None) -> GpuContext:
        return GpuContext(settings.cluster, "n1", gpu, 1, Workload(app) if app else None)

    history = [ctx(f"GPU-{i}", "llm-pretraining") for i in range(20)] + [ctx("GPU-3", "llm-serving")]
    _publish(settings, [(c.kafka_key, encode_record(c)) for c in history] + [(b"junk", b"\x00not a record")])
    changes: list[bytes] = []
    mirror = TopicMirror(
        settings.kafka.client_config(),
        settings.topics.context,
        lambda v: decode_record(GpuContext, v),
        on_change=lambda key, _value: changes.append(key),
    ).start()
    try:
        assert mirror.wait_ready(30)
        state = mirror.snapshot()
        assert len(state) == 20 and mirror.invalid == 1
        assert state[ctx("GPU-3", None).kafka_key].workload == Workload("llm-serving")
        _publish(
            settings,
            [
                (ctx("GPU-4", None).kafka_key, None),
                (ctx("GPU-99", "idle").kafka_key, encode_record(ctx("GPU-99", "idle"))),
            ],
        )
        assert wait_for(lambda: ctx("GPU-99", None).kafka_key in mirror.snapshot(), 30)
        assert ctx("GPU-4", None).kafka_key not in mirror.snapshot()
        assert len(changes) == 21 + 2
    finally:
        mirror.stop()
