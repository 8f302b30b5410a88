"""Topics are created with explicit partitions and configs, and creating them again changes nothing."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from pipeline.config import Settings
from pipeline.topics import ensure_topics, topic_specs

pytestmark = pytest.mark.integration


def test_topics_exist_with_their_configs(settings: Settings) -> None:
    admin = AdminClient(settings.kafka.client_config())
    topics = admin.list_topics(timeout=10).topics
    t = settings.topics
    for name in (t.raw, t.context, t.interpreted, t.alerts, t.dead_letter):
        assert name in topics
    assert len(topics[t.raw].partitions) == t.partitions
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in (t.context, t.raw)]
    configs = {r.name: f.result(10) for r, f in admin.describe_configs(resources).items()}
    assert configs[t.context]["cleanup.policy"].value == "compact"
    assert configs[t.raw]["cleanup.policy"].value == "delete"
    assert configs[t.raw]["retention.ms"].value == str(int(t.raw_retention_hours * 3600 * 1000))
    assert ensure_topics(settings.kafka.client_config(), topic_specs(settings)) == []
