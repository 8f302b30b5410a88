"""A topic just created is readable at once: ``ensure_topics`` returns only when the broker's metadata shows every
topic it created with a leader per partition, and a mirror started in the moment after a bare CreateTopics (a stage
right after ``hermeneut topics`` run elsewhere) waits for the metadata instead of failing (issue 37: the chaos
suite's alert admin failed with "topic ... alert_config does not exist: run hermeneut topics first")."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.config import KafkaSettings, Settings, TopicSettings
from pipeline.errors import ServiceError
from pipeline.mirror import TopicMirror
from pipeline.topics import ensure_topics, settled, topic_specs

from .conftest import KafkaServer

pytestmark = pytest.mark.integration

ROUNDS = 8


def _conf(kafka_server: KafkaServer) -> dict[str, Any]:
    return KafkaSettings(bootstrap_servers=kafka_server.bootstrap_servers).client_config()


def test_ensure_topics_returns_when_every_created_topic_is_led(kafka_server: KafkaServer) -> None:
    conf = _conf(kafka_server)
    for _ in range(ROUNDS):
        specs = topic_specs(Settings(topics=TopicSettings.with_prefix(f"m{uuid.uuid4().hex[:8]}", partitions=3)))
        created = ensure_topics(conf, specs)
        assert sorted(created) == sorted(s.name for s in specs)
        # a fresh client, as a stage started next would have: one metadata request, no retry
        consumer = Consumer(conf | {"group.id": "metadata-probe"})
        try:
            meta = consumer.list_topics(timeout=10).topics
        finally:
            consumer.close()
        assert [s.name for s in specs if not settled(meta.get(s.name))] == []


def test_a_mirror_started_right_after_create_topics_waits_for_the_metadata(kafka_server: KafkaServer) -> None:
    """A bare CreateTopics of a deployment's topics (what ``ensure_topics`` did before), then at once a mirror of
    the first topic and of alert_config: here a single metadata request found the first topics unknown in 24 of 25
    rounds."""
    conf = _conf(kafka_server)
    admin = AdminClient(conf)
    for _ in range(ROUNDS):
        specs = topic_specs(Settings(topics=TopicSettings.with_prefix(f"m{uuid.uuid4().hex[:8]}", partitions=3)))
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in specs]
        )
        for future in futures.values():
            future.result(30)
        for name in (specs[0].name, next(s.name for s in specs if s.name.endswith(".alert_config"))):
            mirror = TopicMirror(conf, name, bytes).start()
            try:
                assert mirror.wait_ready(30)
                assert len(mirror) == 0
            finally:
                mirror.stop()


def test_the_dashboards_live_view_and_an_imports_offsets_right_after_create_topics(kafka_server: KafkaServer) -> None:
    """The same race for the dashboard's live fleet (interpreted and alerts topics) and an import's high
    watermarks: each read the metadata once (``list_topics(...).topics[topic]``: a KeyError, or no partitions)."""
    from hermeneut.jobs.importjob import _high_watermarks
    from hermeneut.web.live import LiveFleet

    conf = _conf(kafka_server)
    admin = AdminClient(conf)
    for round_ in range(ROUNDS):
        settings = Settings(
            kafka=KafkaSettings(bootstrap_servers=kafka_server.bootstrap_servers),
            topics=TopicSettings.with_prefix(f"m{uuid.uuid4().hex[:8]}", partitions=3),
        )
        specs = topic_specs(settings)
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in specs]
        )
        for future in futures.values():
            future.result(30)
        if round_ % 2:  # each first in half the rounds: the one asked second finds the topics settled
            assert _high_watermarks(settings, settings.topics.raw) == {0: 0, 1: 0, 2: 0}
        fleet = LiveFleet(settings).start()
        try:
            assert fleet.ready.wait(30)
        finally:
            fleet.stop()
        assert _high_watermarks(settings, settings.topics.raw) == {0: 0, 1: 0, 2: 0}


def test_a_topic_that_does_not_exist_is_still_refused_with_the_fix(kafka_server: KafkaServer) -> None:
    started = time.monotonic()
    with pytest.raises(ServiceError, match=r"does not exist \(waited 2s\): run `hermeneut topics` first"):
        TopicMirror(_conf(kafka_server), f"m{uuid.uuid4().hex[:8]}.missing", bytes, metadata_wait_s=2.0).start()
    assert 2.0 <= time.monotonic() - started < 15
