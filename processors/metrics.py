"""The processor's ``/metrics``: its counters (the stats file's, read when scraped), per-take histograms, consumer lag
and stalls of its partitions, and what it concluded (processors.conclusions).

Also where faust's "Stream stopped processing, or is slow" goes: faust logs it as an ERROR when a partition's stream
has taken nothing for ``stream_processing_timeout``, which is every quiet partition of a pipeline whose fleet sends
little (or that has stopped). Whether a partition is stalled is decided here instead, from what can be measured: a
partition with messages waiting and none read for ``stall_after_s`` is stalled (an ERROR, and
``hermeneut_consumer_stalled``); one with nothing waiting is idle, however long it has been quiet. faust's own line is
kept at DEBUG.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from prometheus_client import CollectorRegistry, Histogram

from pipeline.deadletter import DeadLetter
from pipeline.metrics import (
    DURATION_BUCKETS,
    SIZE_BUCKETS,
    ConsumerLag,
    Field,
    StatsView,
    TopicPartition,
    counter,
    dead_letters,
    gauge,
)
from processors.conclusions import Conclusions

#: the processor's stats (processors.app.ProcessorStats) as ``/metrics`` shows them
PROCESSOR_FIELDS: tuple[Field, ...] = (
    counter("messages_in", "hermeneut_processor_messages_total", "Raw node messages consumed."),
    counter("samples_ok", "hermeneut_processor_samples_total", "Samples validated, normalized and interpreted."),
    counter("messages_out", "hermeneut_processor_forwarded_batches_total",
            "Interpreted batches forwarded (one per source partition and take)."),
    counter("findings", "hermeneut_processor_findings_total", "Findings sent to the alerts topic."),
    counter("batches", "hermeneut_processor_takes_total", "Takes from the stream (each a vectorized batch)."),
    gauge("baselines_version", "hermeneut_processor_baselines_version", "Learned baselines in use (0: none yet)."),
    gauge("assigned", "hermeneut_processor_assigned", "1 once the consumer has joined its group."),
)  # fmt: skip

#: faust's messages about a stream that took nothing for a while (faust.transport.drivers.aiokafka)
_FAUST_IDLE: Final = ("Stream stopped processing, or is slow", "Stream has not started processing")
FAUST_CONSUMER_LOGGER: Final = "faust.transport.drivers.aiokafka"


class ProcessorMetrics:
    """Everything the processor exposes; built with the app (no registry: counted, not exposed)."""

    def __init__(
        self,
        registry: CollectorRegistry | None,
        stats: Callable[[], Mapping[str, Any]],
        stale_after_s: float = 180.0,
        stall_after_s: float = 60.0,
    ) -> None:
        self.dead_letters = dead_letters(registry)
        self.take_messages = Histogram(
            "hermeneut_processor_take_messages", "Raw messages per take.", buckets=SIZE_BUCKETS, registry=registry
        )
        self.take_seconds = Histogram(
            "hermeneut_processor_take_seconds",
            "Seconds from a take to its last output sent.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.lag = ConsumerLag("processor", stall_after_s)
        self.conclusions = Conclusions(stale_after_s)
        if registry is not None:
            for collector in (StatsView(stats, PROCESSOR_FIELDS), self.lag, self.conclusions):
                registry.register(collector)

    def took(self, messages: int, dead: Sequence[DeadLetter], seconds: float) -> None:
        """One take done: its size, how long it took, and its dead letters by reason."""
        self.take_messages.observe(messages)
        self.take_seconds.observe(seconds)
        for reason, n in Tally(letter.reason for letter in dead).items():
            self.dead_letters.labels(reason).inc(n)


def faust_lag(consumer: Any, monitor: Any) -> dict[TopicPartition, tuple[int, int]]:
    """(lag, position) of each partition assigned to a faust consumer: its high watermark against the next offset
    to read (after the last message the stream took in, else the last commit). Partitions with neither are left
    out; so is one a rebalance took away between the two calls."""
    out: dict[TopicPartition, tuple[int, int]] = {}
    for tp in consumer.assignment():
        try:
            high = consumer.highwater(tp)
        except Exception:  # aiokafka raises IllegalStateError for a partition no longer assigned
            continue
        read = monitor.tp_read_offsets.get(tp)
        position = read + 1 if read is not None else monitor.tp_committed_offsets.get(tp)
        if high is None or position is None:
            continue
        out[(tp.topic, tp.partition)] = (int(high) - int(position), int(position))
    return out


class QuietStreams(logging.Filter):
    """Keeps faust's "stream took nothing for a while" lines at DEBUG (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and any(text in str(record.msg) for text in _FAUST_IDLE):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def quiet_idle_streams() -> None:
    """Install :class:`QuietStreams` on faust's consumer logger (idempotent)."""
    logger = logging.getLogger(FAUST_CONSUMER_LOGGER)
    if not any(isinstance(f, QuietStreams) for f in logger.filters):
        logger.addFilter(QuietStreams())
