"""A short simulation with faults, fast-forwarded by the node agent into the real Kafka, read back from every topic
it writes."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from pipeline.codec import decode_record, decode_samples
from pipeline.config import Settings
from pipeline.events import FaultRecord, GpuContext, node_key
from pipeline.kinds import FAULTS
from pipeline.publisher import Publisher
from pipeline.topology import NodeTopology
from processors.normalize import RawMessage, process_raw
from producers.agent import NodeAgent
from producers.simulator import FaultPlan, Fleet, Injection
from producers.simulator.source import SimulatorSource

from .harness import consume_all

pytestmark = pytest.mark.integration


def test_fast_forward_with_faults_reaches_every_topic(settings: Settings) -> None:
    plan = FaultPlan(rate_scale=0, injections=tuple(Injection(f, 20, 60) for f in FAULTS))
    fleet = Fleet(12, 8, cluster=settings.cluster, seed=5, faults=plan, extras=True)  # a seed where all 9 fit
    hidden = set(fleet.uuids[:8])  # node-0000's contexts are withheld: the report keeps them
    publisher = Publisher(settings.kafka.client_config())
    source = SimulatorSource.of(fleet, withhold=lambda c: c.gpu_uuid in hidden)
    report = NodeAgent(source, publisher, settings.topics, 1.0).run(threading.Event(), 0.0, fast_forward_s=120)
    assert publisher.stats.failed == 0 and publisher.stats.in_flight == 0
    assert publisher.stats.delivered == report.messages + report.contexts + report.topologies + report.ground_truth
    assert report.rounds >= 121 and report.ground_truth == len(FAULTS)

    raw = consume_all(settings, settings.topics.raw, report.messages)
    assert len(raw) == report.messages
    decoded = [decode_samples(m.value() or b"")[0] for m in raw]
    assert sum(len(b.samples) for b in decoded) == report.samples
    assert all(m.key() == node_key(b.cluster, b.node) for m, b in zip(raw, decoded, strict=True))
    # everything the simulator sent passes the processor's validation, faults and extras included
    now = time.time_ns()
    out = process_raw([RawMessage(m.key(), m.value() or b"", f"raw/{m.partition()}/{m.offset()}", m.partition())
                       for m in raw], now, settings.validation)  # fmt: skip
    assert out.dead == [] and out.samples_ok == report.samples
    xids = Counter(e.code for b in decoded for e in b.events if e.kind.value == "xid")
    # a storm repeats its XIDs (every 3 to 15 s, drawn): how many fit in its minute moved between runs of this same
    # seed at different times of day (5 or more earlier, 2 at 02:45 UTC), so the test asks only that it repeats
    assert xids[79] == 1 and xids[48] == 1 and sum(xids[c] for c in (13, 31, 43, 45)) >= 2

    topologies = [
        decode_record(NodeTopology, m.value() or b"") for m in consume_all(settings, settings.topics.topology, 12)
    ]
    assert sorted(t.node for t in topologies) == fleet.nodes
    assert all(t.cluster == settings.cluster and len(t.gpus) == 8 for t in topologies)

    contexts = [
        decode_record(GpuContext, m.value() or b"")
        for m in consume_all(settings, settings.topics.context, report.contexts)
    ]
    assert len(contexts) == report.contexts
    assert {c.gpu_uuid for c in contexts} == set(fleet.uuids) - hidden
    assert {c.gpu_uuid for c in source.withheld} == hidden
    assert any(c.workload is None for c in contexts)  # idle GPUs, and the jobs the ECC / lost GPU killed

    truth = [
        decode_record(FaultRecord, m.value() or b"")
        for m in consume_all(settings, settings.topics.ground_truth, len(FAULTS))
    ]
    assert sorted(t.fault for t in truth) == sorted(FAULTS)
    first_ts = min(s.ts_ns for b in decoded for s in b.samples)
    for t in truth:
        assert t.cluster == settings.cluster
        assert t.start_ns == first_ts + 20 * 10**9 and t.end_ns == t.start_ns + 60 * 10**9
    lost = next(t for t in truth if t.fault == "fallen-off-bus")
    stamps = {s.ts_ns for b in decoded for s in b.samples if s.gpu_uuid == lost.gpu_uuid}
    assert not any(lost.start_ns <= ts < lost.end_ns for ts in stamps) and lost.end_ns in stamps
