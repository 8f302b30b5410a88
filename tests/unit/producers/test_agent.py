"""The node agent's loop: what it publishes where, and what it does with failing sources and a full buffer.

The publisher here is a recording stand-in (the real one, against a real broker that is stopped and restarted,
is in tests/integration/test_producer_reliability.py); the simulator through this loop is in
tests/unit/producers/simulator/test_source.py."""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

from pipeline.codec import CONTENT_TYPE, decode_record, decode_samples
from pipeline.config import TopicSettings
from pipeline.deadletter import headers_dict
from pipeline.errors import BadSourceData, SourceUnavailable
from pipeline.events import EventKind, GpuEvent, GpuProcess, GpuSample, SampleBatch
from pipeline.sizing import Limits
from pipeline.topology import NodeTopology, TopologyGpu
from producers.agent import NodeAgent
from tests.fakes.kafka import RecordingPublisher
from tests.fakes.sources import ScriptedSource

TOPICS = TopicSettings.with_prefix("t")


def batch(gpus: int = 2, events: tuple[GpuEvent, ...] = ()) -> SampleBatch:
    samples = tuple(GpuSample("dc1", "n1", f"GPU-{i}", i, "m", 0, {"power_watts": 100.0 + i}) for i in range(gpus))
    return SampleBatch("dc1", "n1", samples, events)


def topo(gpus: int) -> NodeTopology:
    return NodeTopology(
        "dc1", "n1", 0, tuple(TopologyGpu(f"GPU-{i}", i, "m", f"0000:{i:02x}:00.0") for i in range(gpus))
    )


def run(source: ScriptedSource, publisher: RecordingPublisher, rounds: int, **kwargs: Any) -> NodeAgent:
    clock = itertools.count(10**18, 10**8)
    agent = NodeAgent(source, publisher, TOPICS, 0.001, clock=lambda: next(clock), **kwargs)  # type: ignore[arg-type]
    stop = threading.Event()
    original = agent.round

    def counted(stop_event: threading.Event) -> bool:
        changed = original(stop_event)
        if agent.report.rounds >= rounds:
            stop.set()
        return changed

    agent.round = counted  # type: ignore[method-assign]
    agent.run(stop)
    return agent


def test_one_message_per_round_keyed_by_node_and_topology_only_when_it_changes() -> None:
    source = ScriptedSource([[batch()]], [topo(2), topo(2), topo(2), topo(3)])
    publisher = RecordingPublisher()
    agent = run(source, publisher, 5, topology_interval_s=0)  # checked after each round but the last (stop)
    raw = publisher.on(TOPICS.raw)
    assert len(raw) == 5 and {m[1] for m in raw} == {b"dc1/n1"}
    decoded = [decode_samples(m[2])[0] for m in raw]
    assert [len(b.samples) for b in decoded] == [2] * 5
    assert len({b.samples[0].ts_ns for b in decoded}) == 5
    topologies = [decode_record(NodeTopology, m[2]) for m in publisher.on(TOPICS.topology)]
    assert [len(t.gpus) for t in topologies] == [2, 3]
    assert agent.report.topologies == 2 and agent.report.samples == 10 and publisher.closed


def test_a_failing_source_skips_the_round_and_bad_data_is_dead_lettered() -> None:
    bad = BadSourceData("malformed", "line 3: not a sample", b"garbage\n", "http://x:9400/metrics")
    source = ScriptedSource([SourceUnavailable("connection refused"), bad, [batch()]])
    publisher = RecordingPublisher()
    agent = run(source, publisher, 3)
    assert agent.report.source_errors == 1 and agent.report.dead_lettered == 1
    (letter,) = publisher.on(TOPICS.dead_letter)
    assert letter[2] == b"garbage\n"
    headers = headers_dict(letter[3])
    assert headers["hermeneut-reason"] == "malformed" and headers["hermeneut-stage"] == "collector"
    assert headers["hermeneut-source"] == "http://x:9400/metrics"
    assert len(publisher.on(TOPICS.raw)) == 1


def test_a_full_buffer_blocks_the_round_and_is_counted_as_skipped_rounds() -> None:
    publisher = RecordingPublisher(full_for=3)  # 3 x 50 ms waiting for room
    agent = run(ScriptedSource([[batch()]]), publisher, 2)
    assert len(publisher.on(TOPICS.raw)) == 2  # nothing dropped: the round waited
    assert agent.report.late_rounds >= 1 and agent.report.skipped_rounds >= 100  # 150 ms at 1 ms per round


def test_a_stop_while_the_buffer_is_full_counts_what_was_never_queued() -> None:
    publisher = RecordingPublisher(full_for=10**9)
    source = ScriptedSource([[batch(3)]])
    agent = NodeAgent(source, publisher, TOPICS, 0.01)  # type: ignore[arg-type]
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    report = agent.run(stop)
    assert report.unqueued_samples == 3 and report.messages == 0 and publisher.closed


def test_events_alone_are_published_and_empty_rounds_are_not() -> None:
    xid = GpuEvent("dc1", "n1", "GPU-0", 0, 5, EventKind.XID, 79)
    source = ScriptedSource([[batch(0, (xid,))], [batch(0)]])
    publisher = RecordingPublisher()
    agent = run(source, publisher, 2)
    assert len(publisher.on(TOPICS.raw)) == 1 and agent.report.events == 1


def test_duration_ends_the_run_and_stats_are_written(tmp_path: Any) -> None:
    stats_file = tmp_path / "agent.json"
    agent = NodeAgent(ScriptedSource([[batch()]]), RecordingPublisher(), TOPICS, 0.05, stats_file=stats_file)  # type: ignore[arg-type]
    report = agent.run(threading.Event(), duration_s=0.3)
    assert 3 <= report.rounds <= 8
    written = json.loads(stats_file.read_text())
    assert written["rounds"] == report.rounds and written["delivered"] == report.messages
    assert written["scripted_rounds"] == report.rounds


def test_a_node_message_over_the_raw_topic_limit_goes_out_in_parts_and_what_cannot_fit_is_dead_lettered() -> None:
    """An XID storm on a node of a cluster with a small limit: the message is cut (samples and events in
    proportion), every part under the budget, nothing lost; one sample with 60 kB of process names cannot fit alone
    and is dead-lettered with its position, bounded to the dead-letter topic."""
    events = tuple(GpuEvent("dc1", "n1", "GPU-0", 0, 10**18 + i, EventKind.XID, 79, "x" * 300) for i in range(200))
    big = GpuSample("dc1", "n1", "GPU-big", 9, "m", 0, {"power_watts": 1.0},
                    processes=tuple(GpuProcess(p, "p" * 2000, None) for p in range(30)))  # fmt: skip
    node = batch(8, events)
    node = SampleBatch(node.cluster, node.node, (*node.samples[:4], big, *node.samples[4:]), node.events)
    limits = Limits(topics={TOPICS.raw: 20_000, TOPICS.dead_letter: 20_000})
    publisher = RecordingPublisher(limits=limits)
    agent = run(ScriptedSource([[node]]), publisher, 1)
    raw = publisher.on(TOPICS.raw)
    budget = limits.value_budget(TOPICS.raw, b"dc1/n1", [("content-type", CONTENT_TYPE)])
    assert len(raw) > 3 and all(len(m[2]) <= budget for m in raw)
    parts = [decode_samples(m[2])[0] for m in raw]
    assert [s.gpu_uuid for p in parts for s in p.samples] == [s.gpu_uuid for s in node.samples if s is not big]
    assert [e for p in parts for e in p.events] == list(events)
    assert max(len(p.events) for p in parts) < len(events) / 2  # the events are spread over the parts
    (letter,) = publisher.on(TOPICS.dead_letter)
    headers = headers_dict(letter[3])
    assert (headers["hermeneut-reason"], headers["hermeneut-gpu"], headers["hermeneut-position"]) == (
        "too_large",
        "GPU-big",
        "4",
    )
    assert headers["hermeneut-payload"] == "truncated" and len(letter[2]) < 20_000
    assert agent.report.too_large == 1 and agent.report.split_messages == 1 and agent.report.messages == len(raw)


def test_every_sample_says_how_long_it_stands_for() -> None:
    # the round's interval, unless the source knows the series' own (an importer detects it per series)
    own = GpuSample("dc1", "n1", "GPU-9", 9, "m", 0, {"power_watts": 50.0, "sample_interval_seconds": 57.0})
    source = ScriptedSource([[SampleBatch("dc1", "n1", (*batch().samples, own))]], [])
    publisher = RecordingPublisher()
    run(source, publisher, 1)
    (message,) = publisher.on(TOPICS.raw)
    samples = decode_samples(message[2])[0].samples
    assert [s.metrics["sample_interval_seconds"] for s in samples] == [0.001, 0.001, 57.0]


class _Scheduler:
    """The node's scheduler state, one answer per topology check (None: it cannot tell now)."""

    name = "slurm"

    def __init__(self, answers: list[str | None]) -> None:
        self.answers = answers

    def maintenance(self) -> str:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is None:
            raise SourceUnavailable("scontrol show node: timed out")
        return answer


def test_the_topology_says_when_the_scheduler_holds_the_node_out_of_service_and_keeps_it_while_unsure() -> None:
    drained = "slurm IDLE+DRAIN: swap PSU 2"
    source = ScriptedSource([[batch()]], [topo(2)])
    publisher = RecordingPublisher()
    scheduler = _Scheduler(["", drained, None, drained, ""])
    run(source, publisher, 6, topology_interval_s=0, node_state=scheduler)
    published = [decode_record(NodeTopology, m[2]).maintenance for m in publisher.on(TOPICS.topology)]
    # a new topology when the node goes out of service and when it comes back; none while the scheduler is unsure
    assert published == ["", drained, ""]
