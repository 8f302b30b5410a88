"""The InfluxDB sink's requests: capped at the batch size, retried from the request that failed (never grown),
each with a timeout proportional to its size (the real influxd stopped and restarted under the sink is
tests/integration/test_sink_resilience.py)."""

from __future__ import annotations

import pytest

from pipeline.errors import PermanentWriteError, TransientWriteError
from sinks.base import Prepared
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


def test_a_refused_request_drops_the_batch_and_the_next_one_starts_clean() -> None:
    writer = RecordingWriter({0: PermanentWriteError("HTTP 400")})
    sink = _sink(writer, batch_size=2)
    sink.add([_prepared(0, 3)])
    with pytest.raises(PermanentWriteError):
        sink.flush()
    sink.add([_prepared(3, 1)])
    sink.flush()
    assert writer.requests[-1] == ["gpu v=3"] and sink.points_written == 1


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
