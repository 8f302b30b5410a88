"""The processor's /metrics: its registry as the app builds it, a take's size, time and dead letters by reason, the
lag of its faust consumer's partitions, and faust's "stream took nothing" line kept at DEBUG while every other line
of faust keeps its level."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pipeline.config import KafkaSettings, ServiceSettings, Settings
from pipeline.deadletter import dead_letter
from processors.app import create_app
from processors.metrics import FAUST_CONSUMER_LOGGER, ProcessorMetrics, QuietStreams, faust_lag


def test_the_app_registers_the_processor_metrics(tmp_path: Path) -> None:
    settings = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),
                        services=ServiceSettings(state_dir=tmp_path, cache_dir=tmp_path))  # fmt: skip
    registry = CollectorRegistry(auto_describe=True)
    create_app(settings, registry=registry)
    text = generate_latest(registry).decode()
    for name in ("hermeneut_processor_messages_total 0.0", "hermeneut_processor_assigned 0.0",
                 "hermeneut_processor_take_seconds_bucket", 'hermeneut_processor_verdicts_total{verdict="normal"} 0.0',
                 "# TYPE hermeneut_consumer_lag_messages gauge", "# TYPE hermeneut_gpu_verdict gauge"):  # fmt: skip
        assert name in text, name


def test_a_take_counts_its_size_time_and_dead_letters_by_reason() -> None:
    registry = CollectorRegistry()
    metrics = ProcessorMetrics(registry, dict)
    letters = [dead_letter(None, b"x", reason, "d", "processor", "raw/0/1") for reason in ("nan", "nan", "malformed")]
    metrics.took(40, letters, 0.02)
    metrics.took(2, [], 0.5)
    assert registry.get_sample_value("hermeneut_dead_letters_total", {"reason": "nan"}) == 2.0
    assert registry.get_sample_value("hermeneut_dead_letters_total", {"reason": "malformed"}) == 1.0
    assert registry.get_sample_value("hermeneut_processor_take_messages_sum") == 42.0
    assert registry.get_sample_value("hermeneut_processor_take_seconds_count") == 2.0
    assert registry.get_sample_value("hermeneut_processor_take_seconds_bucket", {"le": "0.025"}) == 1.0


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


class FaustConsumer:
    def __init__(self, highwaters: dict[TP, int | None]) -> None:
        self.highwaters = highwaters

    def assignment(self) -> set[TP]:
        return set(self.highwaters) | {TP("raw", 9)}

    def highwater(self, tp: TP) -> int | None:
        if tp not in self.highwaters:
            raise RuntimeError("no longer assigned")  # what aiokafka does after a rebalance took it
        return self.highwaters[tp]


@dataclass
class Monitor:
    tp_read_offsets: dict[Any, int]
    tp_committed_offsets: dict[Any, int]


def test_faust_lag_counts_from_the_last_message_read_else_the_last_commit() -> None:
    consumer = FaustConsumer({TP("raw", 0): 100, TP("raw", 1): 50, TP("raw", 2): 7, TP("raw", 3): None})
    monitor = Monitor({TP("raw", 0): 99, TP("raw", 1): 20}, {TP("raw", 1): 10, TP("raw", 2): 7})
    assert faust_lag(consumer, monitor) == {("raw", 0): (0, 100), ("raw", 1): (29, 21), ("raw", 2): (0, 7)}


def faust_line(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(FAUST_CONSUMER_LOGGER, level, __file__, 1, message, ("TP(raw, 3)", "6 minutes ago"), None)


@pytest.mark.parametrize(
    ("message", "kept", "level"),
    [
        ("[^---AIOKafkaConsumerThread]: Stream stopped processing, or is slow for %r (last inbound %s).", False, 10),
        ("[^---AIOKafkaConsumerThread]: Stream has not started processing %r (started %s).", False, 10),
        ("[^---AIOKafkaConsumerThread]: Has not committed %r (last commit %s).", True, logging.ERROR),
        ("[^---AIOKafkaConsumerThread]: Aiokafka stopped fetching from %r (last done %s)", True, logging.ERROR),
    ],
)
def test_only_the_idle_stream_line_is_kept_at_debug(message: str, kept: bool, level: int) -> None:
    logging.getLogger(FAUST_CONSUMER_LOGGER).setLevel(logging.INFO)
    record = faust_line(message)
    assert QuietStreams().filter(record) is kept
    assert record.levelno == level
    logging.getLogger(FAUST_CONSUMER_LOGGER).setLevel(logging.DEBUG)
    assert QuietStreams().filter(faust_line(message)) is True  # asked for DEBUG: shown, at DEBUG
    logging.getLogger(FAUST_CONSUMER_LOGGER).setLevel(logging.NOTSET)
