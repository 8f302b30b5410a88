"""The /metrics building blocks: a stats mapping exposed as it is counted, a histogram fed whole arrays (bucketed as
prometheus_client's own Histogram does), per-partition lag that calls a partition stalled only when messages wait
and none is read, and a served registry (a port in use is one line)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.registry import DuplicateTimeseries

from pipeline.errors import ConfigError
from pipeline.metrics import (
    BulkHistogram,
    ConsumerLag,
    StatsView,
    counter,
    dead_letters,
    gauge,
    librdkafka_lag,
    serve,
    stage_registry,
)
from tests.fakes.clock import Clock
from tests.fakes.kafka import FakeConsumer, FakeMessage


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_stats_view_reads_the_counters_when_scraped() -> None:
    stats = {"messages": 3, "assigned": True, "by_source": {"slurm": 2, "static": 0}, "pair": {("a", "b"): 1}}
    registry = CollectorRegistry()
    registry.register(
        StatsView(
            lambda: stats,
            [
                counter("messages", "x_messages_total", "Messages."),
                gauge("assigned", "x_assigned", "Joined."),
                counter("by_source", "x_failures_total", "Failures.", "source"),
                gauge("pair", "x_pairs", "Pairs.", "left", "right"),
                counter("absent", "x_absent_total", "Never counted."),
            ],
        )
    )
    assert value(registry, "x_messages_total") == 3.0 and value(registry, "x_assigned") == 1.0
    assert value(registry, "x_failures_total", source="slurm") == 2.0
    assert value(registry, "x_failures_total", source="static") == 0.0
    assert value(registry, "x_pairs", left="a", right="b") == 1.0
    assert b"x_absent" not in generate_latest(registry)  # not counted is not shown as 0
    stats["messages"] = 7
    assert value(registry, "x_messages_total") == 7.0  # the same counter, read again


@pytest.mark.parametrize(
    "values",
    [
        [0.0, 0.001, 0.0015, 0.01, 0.0101, 5.0, 5.0001, 1e9],  # on and around the bounds, and beyond the last
        list(np.random.default_rng(3).exponential(0.5, 1000)),
    ],
)
def test_a_bulk_histogram_buckets_like_prometheus_client(values: list[float]) -> None:
    buckets = (0.001, 0.01, 0.1, 1.0, 5.0)
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("h_seconds", "H.", buckets, ours)
    bulk.observe(np.array([*values[: len(values) // 2], np.nan]))  # NaN (no value) is not observed
    bulk.observe(np.array(values[len(values) // 2 :]))
    reference = Histogram("h_seconds", "H.", buckets=buckets, registry=theirs)
    for v in values:
        reference.observe(v)
    for le in ("0.001", "0.01", "0.1", "1.0", "5.0", "+Inf"):
        assert value(ours, "h_seconds_bucket", le=le) == value(theirs, "h_seconds_bucket", le=le), le
    assert value(ours, "h_seconds_count") == len(values)
    assert value(ours, "h_seconds_sum") == pytest.approx(value(theirs, "h_seconds_sum"))


def test_an_idle_partition_is_never_stalled_and_a_stuck_one_is() -> None:
    clock = Clock()
    lag = ConsumerLag("test", stall_after_s=60.0, clock=clock)
    lag.update({("raw", 0): (0, 100), ("raw", 1): (50, 10)})
    clock.now += 3600
    lag.update({("raw", 0): (0, 100), ("raw", 1): (80, 10)})  # p0: quiet for an hour; p1: waiting, not moving
    assert lag.stalled() == [("raw", 1)]
    registry = CollectorRegistry()
    registry.register(lag)
    assert value(registry, "hermeneut_consumer_lag_messages", topic="raw", partition="1") == 80.0
    assert value(registry, "hermeneut_consumer_stalled", topic="raw", partition="1") == 1.0
    assert value(registry, "hermeneut_consumer_stalled", topic="raw", partition="0") == 0.0
    clock.now += 1
    lag.update({("raw", 1): (75, 15)})  # moves again; partition 0 was taken away by a rebalance
    assert lag.stalled() == []
    assert value(registry, "hermeneut_consumer_lag_messages", topic="raw", partition="0") is None


def test_a_busy_partition_that_keeps_moving_is_not_stalled() -> None:
    clock = Clock()
    lag = ConsumerLag("test", stall_after_s=60.0, clock=clock)
    for position in range(0, 1000, 10):
        lag.update({("raw", 0): (5000, position)})
        clock.now += 30
    assert lag.stalled() == []


def test_librdkafka_lag_uses_what_the_consumer_knows() -> None:
    consumer = FakeConsumer([FakeMessage("in", p, o, b"x") for p in (0, 1) for o in range(5)], per_consume=3)
    assert librdkafka_lag(consumer) == {}  # nothing read yet: no position
    consumer.consume(3)
    assert librdkafka_lag(consumer) == {("in", 0): (2, 3)}


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    yield stage_registry("sink")


def test_a_stage_registry_says_what_runs_and_refuses_a_name_twice(registry: CollectorRegistry) -> None:
    text = generate_latest(registry).decode()
    assert 'hermeneut_build_info{stage="sink",version=' in text
    assert "process_cpu_seconds_total" in text and "python_info" in text
    dead_letters(registry).labels("nan").inc(2)
    assert value(registry, "hermeneut_dead_letters_total", reason="nan") == 2.0
    with pytest.raises(DuplicateTimeseries):
        dead_letters(registry)


def test_serve_answers_on_the_port_and_a_port_in_use_is_one_line(registry: CollectorRegistry) -> None:
    server = serve(registry, "127.0.0.1", 0, "sink")
    try:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            assert resp.status == 200 and b"hermeneut_build_info" in resp.read()
        with pytest.raises(ConfigError) as caught:
            serve(stage_registry("sink"), "127.0.0.1", server.port, "sink")
        message = str(caught.value)
        assert "\n" not in message and f"127.0.0.1:{server.port}" in message and "metrics.sink_port" in message
    finally:
        server.close()


def _healthz(server_url: str) -> tuple[int, dict[str, object]]:
    url = server_url.replace("/metrics", "/healthz")
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_healthz_tells_idle_from_busy_from_stuck() -> None:
    """Idle: nothing waits. Busy: messages wait and move. Stuck (503): they wait and do not move, or the sink's
    writer holds a batch past the stall time while its paused consumer reads nothing (lag 0, which alone reads as
    idle)."""
    clock = Clock()
    registry = stage_registry("sink")
    lag = ConsumerLag("test", stall_after_s=60.0, clock=clock)
    registry.register(lag)
    writer_stalled = Gauge("hermeneut_sink_write_stalled", "stalled writes", registry=registry)
    server = serve(registry, "127.0.0.1", 0, "sink")
    try:
        assert _healthz(server.url) == (200, {"status": "idle", "lag": 0, "stuck": []})
        lag.update({("raw", 0): (0, 100), ("raw", 1): (50, 10)})
        assert _healthz(server.url) == (200, {"status": "ok", "lag": 50, "stuck": []})
        clock.now += 61
        lag.update({("raw", 0): (0, 100), ("raw", 1): (80, 10)})
        status, body = _healthz(server.url)
        assert status == 503 and body["status"] == "stuck"
        assert body["stuck"] == ["hermeneut_consumer_stalled{partition=1,topic=raw}"]
        lag.update({("raw", 0): (0, 100), ("raw", 1): (0, 90)})
        writer_stalled.set(1)
        assert _healthz(server.url) == (503, {"status": "stuck", "lag": 0, "stuck": ["hermeneut_sink_write_stalled"]})
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            assert b"hermeneut_sink_write_stalled 1.0" in resp.read()
    finally:
        server.close()
