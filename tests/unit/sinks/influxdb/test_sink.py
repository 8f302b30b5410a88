"""The InfluxDB sink's requests: capped at the batch size, retried from the request that failed (never grown),
each with a timeout proportional to its size (the real influxd stopped and restarted under the sink is
tests/integration/test_sink_resilience.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.codec import encode_interpreted, encode_samples
from pipeline.config import ValidationSettings
from pipeline.errors import PermanentWriteError, TransientWriteError
from pipeline.events import METRIC_INDEX, InterpretedBatch, NicSample, Workload
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet
from sinks.base import Position, Prepared
from sinks.influxdb.rollup import MINUTE_NS
from sinks.influxdb.sink import InfluxDBConfig, InfluxDBSink, Lines
from sinks.influxdb.write import MAX_STRETCH, MIN_TIMEOUT_S, InfluxWriter, TimeoutStretch


class RecordingWriter:
    """Records every request; raises the scripted errors on the given calls (0-based)."""

    def __init__(self, fail: dict[int, Exception] | None = None) -> None:
        self.requests: list[list[str]] = []
        self.fail = fail or {}

    def write(self, lines: list[str]) -> None:
        call = len(self.requests)
        self.requests.append(list(lines))
        if call in self.fail:
            raise self.fail[call]

    def ensure_bucket(self, retention_s: int) -> None:
        pass

    def close(self) -> None:
        pass


def _sink(writer: RecordingWriter, batch_size: int) -> InfluxDBSink:
    config = InfluxDBConfig("http://127.0.0.1:1", "t", batch_size=batch_size)
    return InfluxDBSink(config, writer, RecordingWriter())  # type: ignore[arg-type]


def _prepared(first: int, n: int) -> Prepared[Lines]:
    return Prepared(Lines([f"gpu v={i}" for i in range(first, first + n)], points=n), size=n)


def test_requests_are_capped_at_the_batch_size_and_a_retry_resends_only_what_failed() -> None:
    writer = RecordingWriter({1: TransientWriteError("timed out")})
    sink = _sink(writer, batch_size=4)
    sink.add([_prepared(0, 3), _prepared(3, 7)])  # 10 lines: requests of 4, 4 and 2
    with pytest.raises(TransientWriteError):
        sink.flush()
    sink.add([_prepared(10, 5)])  # what the runner adds later belongs to the next flush's batch ...
    sink.flush()
    sizes = [len(r) for r in writer.requests]
    assert sizes == [4, 4, 4, 2, 4, 1]  # ... not to the retried one: the failed request is sent again as it was
    assert writer.requests[1] == writer.requests[2]
    assert [line for r in writer.requests[2:] for line in r] == [f"gpu v={i}" for i in range(4, 15)]
    assert sink.points_written == 15


class RefusingWriter(RecordingWriter):
    """InfluxDB as it answers a request holding lines it cannot take: 400 for the whole request (nothing of it is
    stored), naming the first; ``stored`` holds what requests without one carried."""

    def __init__(self, bad: str = "bad", fail: dict[int, Exception] | None = None) -> None:
        super().__init__(fail)
        self.bad, self.stored = bad, set[str]()

    def write(self, lines: list[str]) -> None:
        super().write(lines)
        refused = [line for line in lines if self.bad in line]
        if refused:
            raise PermanentWriteError(f"HTTP 400: unable to parse '{refused[0]}': invalid")
        self.stored.update(lines)


def test_a_refused_request_is_split_until_only_the_refused_lines_are_left_and_the_rest_is_stored() -> None:
    writer = RefusingWriter()
    sink = _sink(writer, batch_size=8)
    # three messages, 20 lines; two bad ones, in different messages and requests
    batch = [_prepared(0, 5), _prepared(5, 10), _prepared(15, 5)]
    batch[1] = Prepared(replace(batch[1].payload, lines=[*batch[1].payload.lines[:3], "gpu bad=1",
                                                          *batch[1].payload.lines[4:]]), size=10)  # fmt: skip
    batch[2] = Prepared(replace(batch[2].payload, lines=["gpu bad=2", *batch[2].payload.lines[1:]]), size=5)
    sink.add(batch)
    refused = sink.flush()
    assert [(r.item, r.position, r.reason, r.part) for r in refused] == [
        (1, 3, "influxdb_rejected", "sample"),
        (2, 0, "influxdb_rejected", "sample"),
    ]
    assert refused[0].detail == "HTTP 400: unable to parse 'gpu bad=1': invalid"  # InfluxDB's own words
    good = {line for p in batch for line in p.payload.lines} - {"gpu bad=1", "gpu bad=2"}
    assert writer.stored == good and len(good) == 18
    assert sink.points_written == 18 and sink.lines_refused == 2
    # requests [0:8], [8:16], [16:20]; lines 8 and 15 are both in the second: split once, then each half of 4
    # twice down to its refused line
    assert sink.requests_split == 5 and max(map(len, writer.requests)) == 8
    sink.add([_prepared(100, 2)])
    assert sink.flush() == [] and writer.requests[-1] == ["gpu v=100", "gpu v=101"]


def test_a_transient_error_in_the_middle_of_a_split_goes_on_where_it_stopped() -> None:
    writer = RefusingWriter(fail={2: TransientWriteError("timed out")})
    sink = _sink(writer, batch_size=4)
    lines = [f"gpu v={i}" for i in range(8)]
    lines[5] = "gpu bad=5"
    sink.add([Prepared(Lines(lines, points=8), size=8)])
    with pytest.raises(TransientWriteError):
        sink.flush()  # [0:4] stored, [4:8] refused and split, [4:6] timed out
    (refused,) = sink.flush()
    assert refused.position == 5
    assert writer.stored == set(lines) - {"gpu bad=5"} and sink.points_written == 7
    assert writer.requests[2] == writer.requests[3] == lines[4:6]  # the same request sent again


def test_a_refused_rollup_or_other_line_is_dead_lettered_as_what_it_is() -> None:
    writer, rollups = RefusingWriter(), RefusingWriter()
    config = InfluxDBConfig("http://127.0.0.1:1", "t", batch_size=10)
    sink = InfluxDBSink(config, writer, rollups)  # type: ignore[arg-type]
    held = Lines(["gpu v=1", "gpu_info bad=1"], points=1, rollups=["gpu v_mean=1", "gpu bad_mean=1"])
    sink.add([Prepared(held, size=1)])
    refused = sink.flush()
    assert [(r.part, r.position) for r in refused] == [("line", 1), ("rollup", 1)]
    assert sink.points_written == 1  # the sample's own point was stored


def test_timeouts_are_proportional_to_the_request() -> None:
    writer = InfluxWriter("http://127.0.0.1:1", "t", "o", "b", timeout_s=10.0, request_lines=5000)
    assert writer.timeout_for(5000) == 10.0
    assert writer.timeout_for(2500) == 5.0
    assert writer.timeout_for(10) == MIN_TIMEOUT_S
    writer.close()


def test_after_a_timeout_requests_get_more_time_until_answers_come_back_fast() -> None:
    writer = InfluxWriter("http://127.0.0.1:1", "t", "o", "b", timeout_s=10.0, request_lines=5000)
    writer.stretch.timed_out()
    assert writer.timeout_for(250) == 2 * MIN_TIMEOUT_S and writer.timeout_for(1000) == 4.0
    for _ in range(10):
        writer.stretch.timed_out()
    assert writer.stretch.factor == MAX_STRETCH
    # never more than a full request's timeout: a hung server holds a stopping sink no longer than before
    assert writer.timeout_for(250) == 10.0 and writer.timeout_for(5000) == 10.0
    writer.close()


def test_the_stretch_halves_only_after_an_answer_well_within_its_time() -> None:
    stretch = TimeoutStretch()
    stretch.timed_out()
    stretch.timed_out()
    stretch.answered(took_s=3.0, timeout_s=8.0)  # a slow answer: the server is still slow
    assert stretch.factor == 4.0
    stretch.answered(took_s=1.0, timeout_s=8.0)
    assert stretch.factor == 2.0
    stretch.answered(took_s=0.1, timeout_s=4.0)
    stretch.answered(took_s=0.1, timeout_s=2.0)
    assert stretch.factor == 1.0


def _interpreted(now_ns: int) -> InterpretedBatch:
    """Four GPUs' rows as the processor forwards them, with an application known."""
    fleet = Fleet(2, 2, seed=3)
    messages = [RawMessage(b.kafka_key, encode_samples(b), "raw/0/0") for b in fleet.tick(now_ns)]
    ((_, batch),) = process_raw(messages, now_ns, ValidationSettings()).forward
    return replace(batch, workload=(Workload("training", job_id="j1"),) * len(batch))


def test_what_cannot_become_a_line_is_refused_when_prepared_and_never_reaches_lines_or_rollups() -> None:
    now = 1_800_000_000_000_000_000
    config = InfluxDBConfig("http://127.0.0.1:1", "t", max_future_s=600.0)
    sink = InfluxDBSink(config, RecordingWriter(), RecordingWriter(), clock=lambda: now)  # type: ignore[arg-type]
    b = _interpreted(now)
    metrics, ts = b.metrics.copy(), b.ts_ns.copy()
    metrics[2, METRIC_INDEX["power_watts"]] = np.inf  # decodes on the interpreted topic; InfluxDB refuses it
    ts[3] = 2**63 - 1  # the rollup would open a minute in 2262
    nics = (NicSample(b.cluster[0], b.node[0], "mlx5_0", 1, now, {"rx_bytes_per_second": float("inf")}),)
    hostile = replace(b, gpu_uuid=(b.gpu_uuid[0], "GPU-x\\", *b.gpu_uuid[2:]), metrics=metrics, ts_ns=ts, nics=nics)
    prepared = sink.prepare("hermeneut.events.interpreted", encode_interpreted(hostile), Position("i", 0, 7))
    assert [(r.reason, r.position, r.part) for r in prepared.refused] == [
        ("bad_identity", 1, "sample"),
        ("not_finite", 2, "sample"),
        ("future_timestamp", 3, "sample"),
        ("not_finite", 0, "nic"),
    ]
    assert prepared.refused[1].detail == "power_watts=inf is not finite" and prepared.refused[1].gpu == b.gpu_uuid[2]
    held = prepared.payload
    assert held.points == prepared.size == 1 and held.positions == (0,) and held.gpus == (b.gpu_uuid[0],)
    assert not any("GPU-x" in line or "=inf" in line or "mlx5" in line for line in held.lines)
    assert sink.rollups.live == 1  # only the good row's series holds rollup state
    assert sink.rollups.newest() == now // MINUTE_NS


def test_an_application_or_model_the_line_protocol_cannot_carry_refuses_the_row_not_the_message() -> None:
    now = 1_800_000_000_000_000_000
    sink = InfluxDBSink(InfluxDBConfig("http://127.0.0.1:1", "t"), RecordingWriter(), RecordingWriter(),  # type: ignore[arg-type]
                        clock=lambda: now)  # fmt: skip
    b = _interpreted(now)
    workload = (b.workload[0], Workload("x" * 300), b.workload[2], b.workload[3])
    hostile = replace(b, workload=workload, gpu_model=(*b.gpu_model[:2], "\r\n", b.gpu_model[3]))
    prepared = sink.prepare("hermeneut.events.interpreted", encode_interpreted(hostile), Position("i", 0, 0))
    assert [(r.reason, r.position) for r in prepared.refused] == [("bad_identity", 1), ("bad_identity", 2)]
    assert "application is 300 bytes long" in prepared.refused[0].detail
    assert prepared.payload.positions == (0, 3)
