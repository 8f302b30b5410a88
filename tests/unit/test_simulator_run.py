"""What a simulation publishes, and where: pure bookkeeping, checked with a recording stand-in for the publisher
(the real Kafka path is tests/integration/test_simulator.py)."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from pipeline.codec import decode_record, decode_samples
from pipeline.events import FaultRecord, GpuContext, NodeTopology
from producers.simulator import FaultPlan, Fleet, Injection
from producers.simulator.run import Destinations, fast_forward, publish_round

DEST = Destinations("raw", "ctx", "topo", "truth")
NOW_NS = 1_790_000_000_000_000_000


class Recorder:
    """Keeps what would have been published."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes]] = []

    def publish(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> None:
        self.sent.append((topic, key, value))

    def poll(self, timeout_s: float = 0.0) -> None:
        pass

    def on(self, topic: str) -> list[tuple[bytes | None, bytes]]:
        return [(k, v) for t, k, v in self.sent if t == topic]


class Clock:
    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns


def test_fast_forward_publishes_history_ending_now() -> None:
    plan = FaultPlan(rate_scale=0, injections=(Injection("xid-storm", 30, 60), Injection("fallen-off-bus", 40, 30)))
    fleet = Fleet(4, 8, cluster="c", seed=3, faults=plan, extras=True)
    rec = Recorder()
    clock = Clock(NOW_NS)
    report = fast_forward(fleet, rec, DEST, 120, 1.0, threading.Event(), progress=False, clock=clock)
    assert report.fast_forward_rounds == report.rounds == 121
    raw = rec.on("raw")
    assert len(raw) == report.messages == 121 * 4
    stamps = sorted({decode_samples(v)[0].samples[0].ts_ns for _, v in raw})
    assert stamps[0] == NOW_NS - 120 * 10**9 and stamps[-1] == NOW_NS
    assert all(b - a == 10**9 for a, b in itertools.pairwise(stamps))
    assert report.samples == sum(len(decode_samples(v)[0].samples) for _, v in raw) == 121 * 32 - 30
    topologies = [decode_record(NodeTopology, v) for _, v in rec.on("topo")]
    assert [t.node for t in topologies] == fleet.nodes and report.topologies == 4
    contexts = [decode_record(GpuContext, v) for _, v in rec.on("ctx")]
    assert len(contexts) == report.contexts >= 32  # the first round covers every GPU
    assert {c.gpu_uuid for c in contexts[:32]} == set(fleet.uuids)
    truth = [decode_record(FaultRecord, v) for _, v in rec.on("truth")]
    assert sorted(t.fault for t in truth) == ["fallen-off-bus", "xid-storm"] and report.ground_truth == 2
    assert all(k == t.kafka_key for (k, _), t in zip(rec.on("truth"), truth, strict=True))
    assert report.events >= 3


def test_withheld_contexts_are_kept_as_truth_not_published() -> None:
    fleet = Fleet(4, 8, seed=1)
    rec = Recorder()
    hidden = set(fleet.uuids[::2])
    report = fast_forward(
        fleet, rec, DEST, 30, 1.0, threading.Event(), withhold=lambda c: c.gpu_uuid in hidden, progress=False,
        clock=Clock(NOW_NS),
    )  # fmt: skip
    published = {decode_record(GpuContext, v).gpu_uuid for _, v in rec.on("ctx")}
    assert published.isdisjoint(hidden) and published
    assert {c.gpu_uuid for c in report.withheld} == hidden
    assert report.contexts == len(rec.on("ctx"))


def test_stop_ends_a_fast_forward() -> None:
    stop = threading.Event()
    stop.set()
    rec = Recorder()
    report = fast_forward(Fleet(1, 1), rec, DEST, 3600, 1.0, stop, progress=False, clock=Clock(NOW_NS))
    assert report.rounds == 0 and not rec.on("raw") and report.topologies == 1


def test_samples_only_destination_publishes_nothing_else() -> None:
    rec = Recorder()
    assert publish_round(Fleet(2, 2, seed=1), rec, "raw", NOW_NS) == 4
    assert {t for t, _, _ in rec.sent} == {"raw"}


def test_cli_refuses_a_bad_fleet_before_touching_kafka() -> None:
    from click.testing import CliRunner

    from pipeline.face.cli import cli

    result = CliRunner().invoke(cli, ["simulate", "--mix", "moon"])
    assert result.exit_code == 2 and "unknown fleet mix 'moon'" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
