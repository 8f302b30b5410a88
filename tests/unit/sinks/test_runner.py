"""The generic sink runner with a scripted sink and a fake consumer: offsets are committed only after a good
flush, backpressure pauses consumption and retries the same batch, a failed flush never commits, and what cannot
be stored is dead-lettered before its offset is committed (the InfluxDB plugin against a real influxd, stopped
and restarted mid-stream, is tests/integration/test_sink_resilience.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from confluent_kafka import TopicPartition

from pipeline.deadletter import headers_dict
from pipeline.errors import SinkBackpressure, TransientWriteError
from sinks.runner import RunnerConfig, SinkRunner, SinkStats, commit_metadata, parse_metadata
from tests.fakes.kafka import FakeConsumer, FakeMessage, RecordingPublisher
from tests.fakes.sinks import ScriptedSink


def messages(*values: bytes, partition: int = 0) -> list[FakeMessage]:
    return [FakeMessage("in", partition, offset, value) for offset, value in enumerate(values)]


def run_until(
    sink: ScriptedSink,
    consumer: FakeConsumer,
    done: Callable[[], bool],
    batch_size: int = 2,
    grace_s: float = 5.0,
    dlq: RecordingPublisher | None = None,
) -> tuple[SinkRunner[bytes], RecordingPublisher]:
    """Run the runner in a thread until ``done()`` (or 10 s), then stop it and wait for it to drain."""
    dlq = dlq or RecordingPublisher()
    config = RunnerConfig(batch_size, flush_interval_s=0.05, shutdown_grace_s=grace_s, dead_letter_topic="dlq")
    runner = SinkRunner(sink, consumer, dlq, config)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    deadline = time.monotonic() + 10
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    return runner, dlq


def flushed_before_commit(events: list[str]) -> bool:
    """Every commit follows a good flush, and no failed flush comes between that flush and the commit."""
    last_flush = None
    for event in events:
        if event.startswith("flush"):
            last_flush = event
        elif event.startswith("commit") and (last_flush is None or not last_flush.startswith("flush ok")):
            return False
    return True


def test_offsets_are_committed_only_after_a_good_flush() -> None:
    events: list[str] = []
    sink = ScriptedSink([TransientWriteError("down"), TransientWriteError("still down")], events)
    consumer = FakeConsumer(messages(b"a", b"b", b"c", b"d", b"e"), events)
    runner, dlq = run_until(sink, consumer, lambda: consumer.committed().get(("in", 0)) == 5)
    assert consumer.committed() == {("in", 0): 5}
    assert sorted(v for batch in sink.written for v in batch) == [b"a", b"b", b"c", b"d", b"e"]
    assert events.index("flush ok ['a', 'b']") < next(i for i, e in enumerate(events) if e.startswith("commit"))
    assert flushed_before_commit(events)
    assert runner.stats.write_retries == 2 and runner.stats.messages == 5 and runner.stats.dead_lettered == 0
    assert not dlq.sent and consumer.closed


def test_backpressure_pauses_consumption_and_retries_the_same_batch() -> None:
    events: list[str] = []
    sink = ScriptedSink([SinkBackpressure(0.1), SinkBackpressure(0.1), SinkBackpressure(0.1)], events)
    consumer = FakeConsumer(messages(*[str(i).encode() for i in range(6)]), events)
    runner, _ = run_until(sink, consumer, lambda: consumer.committed().get(("in", 0)) == 6, batch_size=1)
    assert consumer.pauses >= 1 and consumer.resumes == consumer.pauses  # paused while the sink asked to wait
    assert events.index("pause") < events.index("flush ok ['0']") < events.index("resume")
    assert sink.written[0] == [b"0"]  # the batch it could not take, retried, nothing dropped or reordered
    assert [v for batch in sink.written for v in batch] == [str(i).encode() for i in range(6)]
    assert flushed_before_commit(events) and runner.stats.write_retries == 3


def test_a_failed_flush_never_commits() -> None:
    events: list[str] = []
    sink = ScriptedSink([TransientWriteError("down")] * 10_000, events)
    consumer = FakeConsumer(messages(b"a", b"b"), events)
    runner, dlq = run_until(sink, consumer, lambda: sink.flushes >= 3, grace_s=0.3)
    assert sink.flushes >= 3 and not sink.written
    assert consumer.commits == [] and not any(e.startswith("commit") for e in events)
    assert not dlq.sent and runner.stats.messages == 0 and consumer.closed


def test_unreadable_and_rejected_messages_are_dead_lettered_before_the_commit() -> None:
    events: list[str] = []
    sink = ScriptedSink(events=events, reject=frozenset({b"d"}))
    consumer = FakeConsumer(messages(b"a", b"bad", b"c", b"d", b"e"), events)
    runner, dlq = run_until(sink, consumer, lambda: consumer.committed().get(("in", 0)) == 5, batch_size=1)
    letters = {m[2]: headers_dict(m[3]) for m in dlq.on("dlq")}
    assert {v: h["hermeneut-reason"] for v, h in letters.items()} == {b"bad": "malformed", b"d": "fake_rejected"}
    assert letters[b"d"]["hermeneut-source"] == "in/0/3" and letters[b"d"]["hermeneut-stage"] == "sink"
    assert [v for batch in sink.written for v in batch] == [b"a", b"c", b"e"]  # the rest stored
    assert consumer.committed() == {("in", 0): 5} and runner.stats.dead_lettered == 2
    assert flushed_before_commit([e for e in events if "Permanent" not in e])


def test_an_item_refused_alone_costs_only_itself_and_its_batch_is_stored_and_committed() -> None:
    """One bad item never costs the others: refused when prepared or by the destination, it is dead-lettered alone
    with its reason, where it was in its message, and its source; every other message of its batch is stored."""
    events: list[str] = []
    sink = ScriptedSink(events=events, refuse=frozenset({b"c"}), refuse_prepared=frozenset({b"e"}))
    consumer = FakeConsumer(messages(b"a", b"b", b"c", b"d", b"e", b"f"), events)
    runner, dlq = run_until(sink, consumer, lambda: consumer.committed().get(("in", 0)) == 6, batch_size=6)
    letters = {m[2]: headers_dict(m[3]) for m in dlq.on("dlq")}
    assert {v: h["hermeneut-reason"] for v, h in letters.items()} == {b"c": "fake_rejected", b"e": "bad_identity"}
    assert letters[b"c"]["hermeneut-source"] == "in/0/2" and letters[b"e"]["hermeneut-source"] == "in/0/4"
    assert letters[b"e"]["hermeneut-gpu"] == "g" and letters[b"e"]["hermeneut-position"] == "3"
    assert sorted(v for batch in sink.written for v in batch) == [b"a", b"b", b"d", b"f"]
    assert consumer.committed() == {("in", 0): 6} and runner.stats.dead_lettered == 2
    assert flushed_before_commit(events)


def test_a_message_read_again_after_a_restart_does_not_send_its_dead_letter_again() -> None:
    """Issue 37: the sink's commit stays at the first message of an open rollup minute, so a restart reads again
    messages whose items were dead-lettered, and refused them a second time. A commit now says how far letters
    were sent: a message read again below it sends none; one past it (never lettered) does."""
    values = (b"a", b"b", b"c", b"d")
    first = FakeConsumer(messages(*values))
    sink = ScriptedSink(refuse_prepared=frozenset({b"b", b"e"}), hold=0)
    runner, dlq = run_until(sink, first, lambda: bool(first.commits) and first.positions.get(("in", 0)) == 4)
    assert [m[2] for m in dlq.on("dlq")] == [b"b"] and runner.stats.dead_lettered == 1  # its letter, once
    assert first.committed() == {("in", 0): 0}  # held: everything is read again
    assert first.metadata[("in", 0)] == "lettered=4;held"

    again = FakeConsumer(messages(*values, b"e"))  # the restart: read from the held commit, one message more
    again.commits, again.metadata = first.commits, first.metadata
    sink = ScriptedSink(refuse_prepared=frozenset({b"b", b"e"}), hold=0)
    runner, dlq = run_until(sink, again, lambda: again.metadata[("in", 0)] == "lettered=5;held")
    assert sink.resumed == ["held"]  # the sink gets its own metadata back
    letters = [headers_dict(m[3]) for m in dlq.on("dlq")]
    assert [h["hermeneut-source"] for h in letters] == ["in/0/4"]  # e's; b's was sent by the first run
    assert runner.stats.dead_lettered == 1 and runner.stats.letters_not_resent == 1
    assert sorted(v for batch in sink.written for v in batch) == [b"a", b"c", b"d"]


def test_a_commit_made_before_letters_were_marked_is_the_sinks_alone() -> None:
    assert parse_metadata(commit_metadata(17, "rollup:3")) == (17, "rollup:3")
    assert parse_metadata(commit_metadata(0, "")) == (0, "")
    for old in ("rollup:3", "", None, "lettered=x;y", "lettered=5"):
        assert parse_metadata(old) == (None, old)


def test_a_batch_is_handed_off_as_soon_as_it_is_full_not_after_the_whole_consume_call() -> None:
    """One consume call may bring far more than a batch; the batch must not grow past its size (it did: requests
    grew to 14x the batch size, outlasted their timeout and were resent whole)."""
    values = [str(i).encode() for i in range(50)]
    consumer = FakeConsumer(messages(*values), per_consume=1000)
    sink = ScriptedSink()
    run_until(sink, consumer, lambda: consumer.committed().get(("in", 0)) == 50, batch_size=5)
    assert [v for batch in sink.written for v in batch] == values
    assert max(len(batch) for batch in sink.written) == 5


def test_a_revocation_drops_what_was_prepared_but_not_handed_over() -> None:
    """Revoked partitions are read again from their last commit: pending messages of them go, the sink forgets
    what it built from them, and nothing of another partition is dropped."""
    forgotten: list[tuple[str, int]] = []
    sink = ScriptedSink()
    sink.forget = lambda topic, partition: forgotten.append((topic, partition))  # type: ignore[method-assign]
    runner = SinkRunner(sink, FakeConsumer([]), RecordingPublisher(), RunnerConfig(100))  # type: ignore[arg-type]
    for m in messages(b"a", b"b", partition=0):
        runner._add(m)  # type: ignore[arg-type]
    runner._on_revoke(None, [TopicPartition("in", 1)])
    assert len(runner._pending) == 2 and forgotten == [("in", 1)]  # another partition's: kept
    runner._on_revoke(None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    assert runner._pending == [] and runner._prepared == [] and ("in", 0) in forgotten


def test_a_dead_letter_kafka_does_not_take_holds_back_the_commit_and_the_runner_says_stalled() -> None:
    """Dead letters not acknowledged: nothing is committed past their batch (later batches wait behind it), the
    stats say stalled with the source offsets; once Kafka takes them, everything commits in order."""
    events: list[str] = []
    sink = ScriptedSink(events=events)
    consumer = FakeConsumer(messages(b"a", b"bad", b"c", b"d"), events)
    dlq = RecordingPublisher(refuse_for=4)
    seen_stalled: list[str] = []
    bad_commits: list[int] = []

    def done() -> bool:
        if runner_ref and runner_ref[0].stats.stall.stalled:
            seen_stalled.append(runner_ref[0].stats.stall.stalled_on)
        committed = consumer.committed().get(("in", 0), 0)
        if committed > 1 and dlq.refuse_for:
            bad_commits.append(committed)  # past "bad" (offset 1) while its dead letter was not taken
        return committed == 4

    runner_ref: list[SinkRunner[bytes]] = []
    original = SinkRunner.__init__

    def remember(self: SinkRunner[bytes], *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        runner_ref.append(self)

    SinkRunner.__init__ = remember  # type: ignore[method-assign]
    try:
        runner, dlq = run_until(sink, consumer, done, batch_size=1, dlq=dlq)
    finally:
        SinkRunner.__init__ = original  # type: ignore[method-assign]
    assert consumer.committed() == {("in", 0): 4} and bad_commits == []
    assert [m[2] for m in dlq.on("dlq")] == [b"bad"]
    assert seen_stalled and "from in/0/1-" in seen_stalled[0] and runner.stats.stall.stalls == 1
    assert not runner.stats.stall.stalled and runner.stats.stall.write_failures == 4


def test_latency_stats_are_exact_to_a_percent_in_constant_memory() -> None:
    """The whole run's p50/p99 from log-spaced bins (within 1% of the exact percentiles), the recent ones from the
    last 30 s of sample time only; what is held does not grow with the run (it kept 2,000,000 latencies and grew
    the soak's sink by 32 MiB)."""
    rng = np.random.default_rng(3)
    stats, every = SinkStats(), []
    t0 = 1_800_000_000 * 10**9
    for second in range(600):  # 10 minutes of 1,000 samples a second, stored 0.2-3 s later
        ts = t0 + second * 10**9 + rng.integers(0, 10**9, 1000)
        ack = int(ts.max()) + int(rng.uniform(0.2, 3.0) * 1e9)
        stats.record_latency(ack, ts)
        every.append((ack - ts) / 1e9)
        held = sum(len(a) for _, a in stats._recent)
        assert held <= 32_000  # 30 s of samples, plus the batch that straddles the edge
    stats.summarize()
    lat = np.concatenate(every)
    for got, q in ((stats.latency_p50_s, 50), (stats.latency_p99_s, 99)):
        assert got == pytest.approx(float(np.percentile(lat, q)), rel=0.01)
    assert stats.latency_max_s == pytest.approx(float(lat.max()))
    recent = np.concatenate(every[-31:])
    assert stats.recent_latency_p99_s is not None and stats.recent_latency_p99_s <= float(recent.max())
