"""Every decoder is total: whatever bytes arrive, the answer is what the schema holds plus DecodeError / Rejected
entries that account for the rest, never another exception (issue 14). Inputs: random bytes, random MessagePack
values, and real simulator messages broken at a random place."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.baselines import BaselineManifest, BaselineRecord, ClassifierRecord, Feedback
from pipeline.codec import (
    decode_interpreted,
    decode_record,
    decode_samples,
    encode_interpreted,
    encode_record,
    sample_columns,
    sample_rows,
)
from pipeline.errors import DecodeError
from pipeline.events import Driver, FaultRecord, Finding, GpuContext, InterpretedBatch, Severity, Verdict, Workload
from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink, TopologyNic
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan
from sinks.base import Position
from sinks.influxdb.lines import InfoTracker, batch_lines
from sinks.influxdb.sink import InfluxDBConfig, InfluxDBSink
from tests.fuzzing import SEEDS, VALUES, count, mutations


def _node_messages() -> list[Any]:
    fleet = Fleet(3, 2, seed=5, extras=True, faults=FaultPlan(rate_scale=300.0))
    now = time.time_ns()
    batches = [b for r in range(3) for b in fleet.tick(now + r * 10**9)]
    # both forms of the raw schema: column-wise (hermeneut's producers) and row-wise (anyone else's)
    return [form(b) for b in batches for form in (sample_columns, sample_rows)]


def sent(body: dict[Any, Any], part: str) -> int:
    """How many items of ``part`` a decodable node message holds: samples in either form, events, NIC readings."""
    if part == "sample":
        return len(body.get("uuid") or []) if "uuid" in body else len(body.get("samples") or [])
    return len(body.get({"event": "events", "nic": "nics"}[part]) or [])


NODES = _node_messages()


@st.composite
def broken(draw: st.DrawFn, values: list[Any]) -> bytes:
    """One of ``values`` with one place (a map entry, a list item, or the whole) replaced by any value."""
    obj = draw(st.sampled_from(values))
    obj = msgpack.unpackb(msgpack.packb(obj))  # a copy
    for _ in range(draw(st.integers(1, 3))):
        obj = _replace(draw, obj)
    return msgpack.packb(obj)


def _replace(draw: st.DrawFn, obj: Any) -> Any:
    if draw(st.integers(0, 3)) == 0 or not isinstance(obj, dict | list) or not obj:
        return draw(VALUES)
    if isinstance(obj, dict):
        key = draw(st.sampled_from(sorted(obj, key=repr)))
        if draw(st.integers(0, 9)) == 0:
            obj[draw(st.text(max_size=8))] = obj.pop(key)  # a renamed key
        else:
            obj[key] = _replace(draw, obj[key])
    else:
        i = draw(st.integers(0, len(obj) - 1))
        obj[i] = _replace(draw, obj[i])
    return obj


def _inputs(values: list[Any]) -> Any:
    return st.binary(max_size=200) | VALUES.map(msgpack.packb) | broken(values)


@pytest.mark.fuzz
@given(_inputs(NODES), SEEDS)
def test_decode_samples_is_total_and_accounts_for_every_item(payload: bytes, seed: int) -> None:
    for variant in mutations(payload, seed):
        count()
        _check_samples(variant)


def _check_samples(payload: bytes) -> None:
    try:
        batch, rejected = decode_samples(payload)
    except DecodeError as exc:
        assert exc.reason and isinstance(exc.detail, str)
        return
    body = msgpack.unpackb(payload, strict_map_key=False)
    for part, decoded in (("sample", batch.samples), ("event", batch.events), ("nic", batch.nics)):
        bad = [r.position for r in rejected if r.part == part]
        assert len(bad) == len(set(bad)) and len(decoded) + len(bad) == sent(body, part)
    assert all(0 <= s.ts_ns < 2**63 for s in batch.samples)


def _interpreted() -> list[Any]:
    from pipeline.events import GpuSample, InterpretedEvent

    sample = GpuSample("c", "n", "GPU-1", 0, "H100", 10**18, {"power_watts": 1.0}, None, None)
    event = InterpretedEvent(sample, {"power_ratio_of_limit": 0.5}, Workload("llm-serving", "j", source="slurm"),
                             0.4, Verdict.UNUSUAL, "b", "why", "compute", (Driver("power", 1, 2, 0, 3),))  # fmt: skip
    messages = []
    for b in NODES[:4]:
        decoded, _ = decode_samples(msgpack.packb(b))
        batch = InterpretedBatch.from_events([event] * 2, decoded.events, decoded.nics)
        messages.append(msgpack.unpackb(encode_interpreted(batch)))
    return messages


INTERPRETED = _interpreted()


@pytest.mark.fuzz
@given(_inputs(INTERPRETED), SEEDS)
def test_decode_interpreted_is_total(payload: bytes, seed: int) -> None:
    for variant in mutations(payload, seed):
        count()
        _check_interpreted(variant)


def _check_interpreted(payload: bytes) -> None:
    try:
        batch = decode_interpreted(payload)
    except DecodeError:
        return
    assert len({len(batch.cluster), len(batch.ts_ns), len(batch.metrics), len(batch.links)} - {len(batch)}) == 0
    decode_interpreted(encode_interpreted(batch))  # what decoded is a batch the pipeline can write again
    batch_lines((batch,), InfoTracker())  # and the sink can turn into points
    # what the sink writes of it carries no value InfluxDB refuses (NaN, inf): those rows are refused, alone
    sink = InfluxDBSink(InfluxDBConfig(), None, None, clock=lambda: _NOW)  # type: ignore[arg-type]
    prepared = sink.prepare(sink.config.interpreted_topic, payload, Position("i", 0, 0))
    for line in prepared.payload.lines + prepared.payload.rollups:
        unquoted = " ".join(line.split('"')[::2])  # string fields may say anything
        assert not re.search(r"=-?(inf|nan)\b", unquoted), line
    assert prepared.size + sum(r.part == "sample" for r in prepared.refused) == len(batch)


_NOW = 1_800_000_000_000_000_000
RECORDS: list[Any] = [
    GpuContext("c", "n", "GPU-1", _NOW, Workload("llm-serving", "j-1", "ana", "slurm", 0.9, "t", "m", "pt", 8)),
    NodeTopology(
        "c",
        "n",
        _NOW,
        (TopologyGpu("GPU-1", 0, "H100", "0000:1B:00.0", 0, "0-31", 18),),
        (TopologyLink("GPU-1", "GPU-2", "NV18", 18),),
        (TopologyNic("mlx5_0", 1, None, 0, "InfiniBand", 400.0),),
        4,
    ),
    FaultRecord("c", "n", "GPU-1", "nvlink-down", _NOW, _NOW + 1, "d"),
    Finding(
        "nvlink-down",
        Severity.CRITICAL,
        True,
        "c",
        "n",
        "GPU-1",
        "H100",
        _NOW,
        _NOW,
        "s",
        "a",
        {"x": 1.0},
        Workload("idle"),
        0,
    ),
    BaselineRecord("b", 1, "llm-serving", None, "compute", ("f",), (1.0,), (1.0,), (0.0,) * 5, 1.0, 2.0, 10, _NOW),
    ClassifierRecord(1, ("a",), ("x",), (0.0,), (1.0,), (0.5,), (0.1,), 30, 0.6, 0.9, 100),
    BaselineManifest(1, _NOW, 0, _NOW, ("b",), {"b": 3}),
    Feedback("GPU-1@1", "c", "n", "GPU-1", 1, "not-anomalous", _NOW, "llm-serving", "H100", "ok", "ana"),
]


@pytest.mark.fuzz
@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_decode_record_is_total_for_each_record_type(record: Any) -> None:
    wire = msgpack.unpackb(encode_record(record))
    assert decode_record(type(record), encode_record(record)) == record

    name = f"test_decode_record_is_total_for_each_record_type[{type(record).__name__}]"

    @given(_inputs([wire]), SEEDS)
    def check(payload: bytes, seed: int) -> None:
        for variant in mutations(payload, seed):
            count(name=name)
            try:
                decoded = decode_record(type(record), variant)
            except DecodeError:
                continue
            assert type(decoded) is type(record)
            for f in dataclasses.fields(decoded):
                assert getattr(decoded, f.name) is not dataclasses.MISSING

    check()
