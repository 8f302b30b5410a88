"""What a simulation publishes, and where, when the node agent drives the simulator source: pure bookkeeping,
checked with a recording stand-in for the publisher (the real Kafka path is tests/integration/test_simulator.py)."""

from __future__ import annotations

import itertools
import threading

import pytest

from pipeline.codec import decode_record, decode_samples
from pipeline.config import TopicSettings
from pipeline.events import FaultRecord, GpuContext
from pipeline.topology import NodeTopology
from producers.agent import AgentReport, NodeAgent
from producers.simulator import FaultPlan, Fleet, Injection
from producers.simulator.source import SimulatorSource, Withhold
from tests.fakes.clock import NsClock
from tests.fakes.kafka import RecordingPublisher

TOPICS = TopicSettings(raw="raw", context="ctx", topology="topo", ground_truth="truth")
NOW_NS = 1_790_000_000_000_000_000


def fast_forward(
    fleet: Fleet, history_s: float, stop: threading.Event | None = None, withhold: Withhold | None = None
) -> tuple[AgentReport, RecordingPublisher, SimulatorSource]:
    """``history_s`` of the fleet fast-forwarded up to NOW_NS, nothing live after it."""
    rec = RecordingPublisher()
    source = SimulatorSource.of(fleet, withhold=withhold)
    agent = NodeAgent(source, rec, TOPICS, 1.0, clock=NsClock(NOW_NS))  # type: ignore[arg-type]
    report = agent.run(stop or threading.Event(), 0.0, fast_forward_s=history_s)
    return report, rec, source


def values(rec: RecordingPublisher, topic: str) -> list[bytes]:
    return [m[2] for m in rec.on(topic)]


def test_fast_forward_publishes_history_ending_now() -> None:
    plan = FaultPlan(rate_scale=0, injections=(Injection("xid-storm", 30, 60), Injection("fallen-off-bus", 40, 30)))
    fleet = Fleet(4, 8, cluster="c", seed=3, faults=plan, extras=True)
    report, rec, _ = fast_forward(fleet, 120)
    assert report.fast_forward_rounds == report.rounds == 121
    raw = values(rec, "raw")
    assert len(raw) == report.messages == 121 * 4
    stamps = sorted({decode_samples(v)[0].samples[0].ts_ns for v in raw})
    assert stamps[0] == NOW_NS - 120 * 10**9 and stamps[-1] == NOW_NS
    assert all(b - a == 10**9 for a, b in itertools.pairwise(stamps))
    assert report.samples == sum(len(decode_samples(v)[0].samples) for v in raw) == 121 * 32 - 30
    topologies = [decode_record(NodeTopology, v) for v in values(rec, "topo")]
    assert [t.node for t in topologies] == fleet.nodes and report.topologies == 4
    contexts = [decode_record(GpuContext, v) for v in values(rec, "ctx")]
    assert len(contexts) == report.contexts >= 32  # the first round covers every GPU
    assert {c.gpu_uuid for c in contexts[:32]} == set(fleet.uuids)
    truth = [decode_record(FaultRecord, v) for v in values(rec, "truth")]
    assert sorted(t.fault for t in truth) == ["fallen-off-bus", "xid-storm"] and report.ground_truth == 2
    assert all(m[1] == t.kafka_key for m, t in zip(rec.on("truth"), truth, strict=True))
    assert report.events >= 3


def test_withheld_contexts_are_kept_as_truth_not_published() -> None:
    fleet = Fleet(4, 8, seed=1)
    hidden = set(fleet.uuids[::2])
    report, rec, source = fast_forward(fleet, 30, withhold=lambda c: c.gpu_uuid in hidden)
    published = {decode_record(GpuContext, v).gpu_uuid for v in values(rec, "ctx")}
    assert published.isdisjoint(hidden) and published
    assert {c.gpu_uuid for c in source.withheld} == hidden
    assert report.contexts == len(rec.on("ctx"))


def test_stop_ends_a_fast_forward() -> None:
    stop = threading.Event()
    stop.set()
    report, rec, _ = fast_forward(Fleet(1, 1), 3600, stop)
    assert report.rounds == 0 and not rec.on("raw") and report.topologies == 1


def test_samples_only_destination_publishes_nothing_else() -> None:
    rec = RecordingPublisher()
    agent = NodeAgent(SimulatorSource.of(Fleet(2, 2, seed=1), samples_only=True), rec, TOPICS, 1.0)  # type: ignore[arg-type]
    agent.round(threading.Event(), NOW_NS)
    assert agent.report.samples == 4
    assert {t for t, _, _, _ in rec.sent} == {"raw"}


@pytest.mark.parametrize("command", ["simulate", "run"])
def test_cli_refuses_a_bad_fleet_before_touching_kafka(command: str) -> None:
    from click.testing import CliRunner

    from hermeneut.cli import cli

    result = CliRunner().invoke(cli, [command, "--mix", "moon"])
    assert result.exit_code == 2 and "unknown fleet mix 'moon'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
