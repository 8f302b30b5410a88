"""What the processor writes for a take is sized to the cluster's limits: interpreted parts under the topic's
budget with every row and extra in exactly one part, rows that cannot fit dead-lettered with their source, and
bounded dead letters; a take that raises is bisected, never dropped."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import replace

import msgpack
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipeline.codec import decode_interpreted, decode_record, encode_samples, sample_rows
from pipeline.config import TopicSettings, ValidationSettings
from pipeline.deadletter import headers_dict
from pipeline.events import (
    EventKind,
    Finding,
    GpuEvent,
    GpuSample,
    InterpretedBatch,
    NicSample,
    SampleBatch,
    Severity,
)
from pipeline.sizing import Limits, record_size
from processors.interpret import Interpreter
from processors.normalize import Origins, RawMessage
from processors.writes import TakeResult, TakeWriter
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan
from tests.fuzzing import count

TOPICS = TopicSettings()


def _writer(limit: int = 1_048_588, interpreter: Interpreter | None = None) -> TakeWriter:
    limits = Limits(topics={TOPICS.interpreted: limit, TOPICS.dead_letter: limit, TOPICS.alerts: limit})
    return TakeWriter(TOPICS, limits, ValidationSettings(), interpreter or Interpreter(), 6)


def _backlog(rounds: int, seed: int = 31337) -> list[RawMessage]:
    """``rounds`` rounds of one HGX H100 node (8 GPUs, 18 NVLinks each, processes, 8 InfiniBand ports, faults
    that raise events) as the raw topic holds them after an outage."""
    fleet = Fleet(1, 8, seed=seed, extras=True, faults=FaultPlan(rate_scale=200.0), mix="default")
    start = time.time_ns() - rounds * 10**9
    messages = []
    for r in range(rounds):
        for b in fleet.tick(start + r * 10**9):
            messages.append(RawMessage(b.kafka_key, encode_samples(b), f"raw/0/{len(messages)}", 0))
    return messages


def _interpreted(writer: TakeWriter, writes: list) -> list[InterpretedBatch]:  # type: ignore[type-arg]
    return [decode_interpreted(w.value) for w in writes if w.topic == TOPICS.interpreted]


def test_a_catch_up_take_of_one_node_is_cut_into_parts_under_the_budget() -> None:
    """The evaluation run's crash: 500 raw messages of one H100 node, whose extras all went to the first part."""
    messages = _backlog(500)
    writer = _writer()
    result = writer.take(messages, time.time_ns())
    parts = _interpreted(writer, result.writes)
    assert len(parts) > 1
    assert all(len(w.value) <= writer.interpreted_budget for w in result.writes)
    assert result.samples_ok == sum(len(p) for p in parts) == 500 * 8
    assert result.dead_lettered == result.too_large == 0
    sent_nics = sum(len(msgpack.unpackb(m.value).get("nics", [])) for m in messages)
    assert sum(len(p.nics) for p in parts) == sent_nics
    # the extras travel with their rows: no part holds more than its share
    assert max(len(p.nics) for p in parts) < sent_nics / 2
    rows = np.concatenate([p.ts_ns for p in parts])
    assert np.all(np.diff(rows) >= 0)  # in order


def test_a_smaller_cluster_limit_gives_smaller_parts() -> None:
    messages = _backlog(50)
    small = _writer(limit=100_000)
    result = small.take(messages, time.time_ns())
    assert all(len(w.value) <= small.interpreted_budget < 100_000 for w in result.writes)
    assert sum(len(p) for p in _interpreted(small, result.writes)) == 50 * 8


def test_a_row_that_cannot_fit_alone_is_dead_lettered_with_its_source() -> None:
    procs = [[i, "p" * 2000, 1, "compute"] for i in range(40)]  # one GPU with 80 kB of process names
    good = GpuSample("c", "n", "GPU-ok", 0, "H100", time.time_ns(), {"power_watts": 100.0})
    body = sample_rows(SampleBatch("c", "n", (good, good)))
    body["samples"][1]["uuid"], body["samples"][1]["procs"] = "GPU-big", procs
    msg = RawMessage(b"c/n", msgpack.packb(body), "raw/2/77", 2)
    writer = _writer(limit=40_000)
    result = writer.take([msg], time.time_ns())
    (part,) = _interpreted(writer, result.writes)
    assert part.gpu_uuid == ("GPU-ok",)
    (letter,) = [w for w in result.writes if w.topic == TOPICS.dead_letter]
    headers = headers_dict(letter.headers)
    assert headers["hermeneut-reason"] == "too_large" and headers["hermeneut-source"] == "raw/2/77"
    assert headers["hermeneut-gpu"] == "GPU-big" and headers["hermeneut-position"] == "1"
    assert result.samples_ok == 1 and result.dead_lettered == result.too_large == 1
    # bounded: the original (larger than the topic allows) is cut, with its size and hash to find it by
    assert headers["hermeneut-payload"] == "truncated" and int(headers["hermeneut-size"]) == len(msg.value) > 40_000
    assert headers["hermeneut-sha256"] == hashlib.sha256(msg.value).hexdigest()
    assert record_size(letter.key, len(letter.value), letter.headers) < 40_000


class _Exploding:
    """A stage with a bug that one node's data triggers."""

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list]:  # type: ignore[type-arg]
        if "node-bad" in batch.node:
            raise ZeroDivisionError("a bug")
        return batch, []

    def tick(self, now_ns: int) -> list:  # type: ignore[type-arg]
        return []


def test_a_take_that_raises_is_bisected_and_only_the_culprit_dead_lettered() -> None:
    now = time.time_ns()
    sample = GpuSample("c", "n", "GPU-a", 0, "H100", now, {"power_watts": 1.0})

    def message(node: str, offset: int) -> RawMessage:
        batch = SampleBatch("c", node, (sample,))
        return RawMessage(batch.kafka_key, encode_samples(batch), f"raw/0/{offset}", offset % 2)

    messages = [message("node-bad" if i == 5 else f"node-{i}", i) for i in range(9)]
    result = _writer(interpreter=Interpreter([_Exploding()])).take(messages, now)
    letters = [headers_dict(w.headers) for w in result.writes if w.topic == TOPICS.dead_letter]
    assert [(h["hermeneut-reason"], h["hermeneut-source"]) for h in letters] == [("processing_error", "raw/0/5")]
    assert result.processing_errors == 1
    assert sum(len(b) for b in _interpreted(_writer(), result.writes)) == 8


@st.composite
def _batches(draw: st.DrawFn) -> InterpretedBatch:
    n = draw(st.integers(0, 40))
    rows = [GpuSample("c", f"n{i % 3}", f"GPU-{i}", i % 8, "H100", 10**18 + i, {"power_watts": float(i)})
            for i in range(n)]  # fmt: skip
    events = tuple(
        GpuEvent("c", "n0", f"GPU-e{i}", 0, 10**18 + i, EventKind.XID, i, draw(st.text(max_size=200)))
        for i in range(draw(st.integers(0, 20)))
    )
    nics = tuple(
        NicSample("c", "n0", f"mlx5_{i}", 1, 10**18, {"rate_gbps": 400.0}) for i in range(draw(st.integers(0, 20)))
    )
    batch = InterpretedBatch.from_samples(rows, np.full((n, 6), np.nan), gpu_events=events, nics=nics)
    # explanations of any length make rows of very different sizes, some larger than a whole small budget
    return replace(batch, explanation=tuple(draw(st.lists(st.text(max_size=3000), min_size=n, max_size=n))))


@given(_batches(), st.integers(min_value=3_000, max_value=60_000))
def test_any_interpreted_batch_splits_under_the_budget_losing_and_duplicating_nothing(
    batch: InterpretedBatch, limit: int
) -> None:
    count()
    writer, out = _writer(limit=limit), TakeResult()
    origins = Origins(*([(0, i) for i in range(k)] for k in (len(batch), len(batch.gpu_events), len(batch.nics))))
    letters = writer.parts(batch, 0, origins, [RawMessage(b"k", b"v", "raw/0/0")], out)
    assert all(len(w.value) <= writer.interpreted_budget for w in out.writes)
    parts = [decode_interpreted(w.value) for w in out.writes]
    dead = Counter(
        (h["hermeneut-part"], int(h["hermeneut-position"])) for h in map(headers_dict, (x.headers for x in letters))
    )
    assert all(n == 1 for n in dead.values())
    kept = [u for i, u in enumerate(batch.gpu_uuid) if ("sample", i) not in dead]
    assert [u for p in parts for u in p.gpu_uuid] == kept
    assert [e for p in parts for e in p.gpu_events] == [
        e for i, e in enumerate(batch.gpu_events) if ("event", i) not in dead
    ]
    assert [n for p in parts for n in p.nics] == [n for i, n in enumerate(batch.nics) if ("nic", i) not in dead]
    assert [x for p in parts for x in p.explanation] == [
        x for i, x in enumerate(batch.explanation) if ("sample", i) not in dead
    ]


class _Finder:
    """A stage that concludes something about every batch."""

    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        finding = Finding("xid-storm", Severity.CRITICAL, True, "c", batch.node[0], batch.gpu_uuid[0], "H100", now_ns,
                          now_ns, "s" * 50, evidence={"xids": 9.0})  # fmt: skip
        return batch, [finding]

    def tick(self, now_ns: int) -> list[Finding]:
        return []


def test_findings_go_to_the_alerts_topic_and_one_too_large_is_dead_lettered() -> None:
    now = time.time_ns()
    batch = SampleBatch("c", "n", (GpuSample("c", "n", "GPU-a", 0, "H100", now, {"power_watts": 1.0}),))
    msg = RawMessage(batch.kafka_key, encode_samples(batch), "raw/0/0")
    result = _writer(interpreter=Interpreter([_Finder()])).take([msg], now)
    (alert,) = [w for w in result.writes if w.topic == TOPICS.alerts]
    assert decode_record(Finding, alert.value).detector == "xid-storm" and result.findings == 1
    huge = Finding("x", Severity.INFO, True, "c", "n", None, "m", now, now, "s" * 5000)
    out = TakeResult()
    _writer(limit=4000).findings([huge], out)
    ((letter,),) = [[w for w in out.writes if w.topic == TOPICS.dead_letter]]
    assert headers_dict(letter.headers)["hermeneut-reason"] == "too_large" and out.too_large == 1
