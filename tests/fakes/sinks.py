"""A sink whose flushes are scripted by the test, for the generic runner (the InfluxDB plugin against a real
influxd is in tests/integration/test_sink_resilience.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.errors import DecodeError, PermanentWriteError
from sinks.base import Position, Prepared, Refusal


class ScriptedSink:
    """Prepares each message as its bytes (``b"bad"`` does not decode); each flush takes the next outcome of
    ``outcomes`` (an exception instance to raise, or None: written), then succeeds once they run out; a batch
    holding a value of ``reject`` is refused as data; a value of ``refuse`` is refused alone by the destination
    (the rest of its batch written), and one of ``refuse_prepared`` when prepared. Written batches go to
    ``written``, and every flush to ``events`` (shared with a fake consumer). With ``hold`` set, its marks hold every
    partition's commit at that offset (as an open rollup minute does) with the metadata ``"held"``; the metadata
    each partition resumed with goes to ``resumed``."""

    name = "fake"
    topics = ("in",)

    def __init__(
        self,
        outcomes: Sequence[Exception | None] = (),
        events: list[str] | None = None,
        reject: frozenset[bytes] = frozenset(),
        refuse: frozenset[bytes] = frozenset(),
        refuse_prepared: frozenset[bytes] = frozenset(),
        hold: int | None = None,
    ) -> None:
        self.outcomes = list(outcomes)
        self.reject, self.refuse, self.refuse_prepared = reject, refuse, refuse_prepared
        self.events = events if events is not None else []
        self.pending: list[bytes] = []
        self.written: list[list[bytes]] = []
        self.flushes = 0
        self.closed = False
        self.hold = hold
        self.seen: set[tuple[str, int]] = set()
        self.resumed: list[str | None] = []

    def prepare(self, topic: str, value: bytes, at: Position) -> Prepared[bytes]:
        self.seen.add((at.topic, at.partition))
        if value == b"bad":
            raise DecodeError("malformed", "not what this sink stores")
        if value in self.refuse_prepared:
            return Prepared(b"", refused=(Refusal("bad_identity", "refused when prepared", gpu="g", position=3),))
        return Prepared(value, size=1, ts_ns=np.array([1_000_000_000]))

    def add(self, batch: Sequence[Prepared[bytes]]) -> None:
        self.pending.extend(p.payload for p in batch)

    def flush(self) -> list[Refusal]:
        self.flushes += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if self.reject.intersection(self.pending):
            outcome = PermanentWriteError("HTTP 400: refused")
        if outcome is not None:
            self.events.append(f"flush failed {type(outcome).__name__}")
            if isinstance(outcome, PermanentWriteError):
                self.pending = []  # refused as data: dropped (the runner dead-letters the batch)
            raise outcome
        refused = [Refusal("fake_rejected", "refused alone", i) for i, v in enumerate(self.pending) if v in self.refuse]
        self.written.append([v for v in self.pending if v not in self.refuse and v])
        self.events.append(f"flush ok {[v.decode() for v in self.pending]}")
        self.pending = []
        return refused

    def marks(self) -> dict[tuple[str, int], tuple[int, str]]:
        return {} if self.hold is None else dict.fromkeys(self.seen, (self.hold, "held"))

    def resume(self, topic: str, partition: int, metadata: str | None) -> None:
        self.resumed.append(metadata)

    def forget(self, topic: str, partition: int) -> None:
        """Holds nothing across batches."""

    def close(self) -> None:
        self.closed = True

    def stats(self) -> dict[str, int]:
        return {"written": sum(len(w) for w in self.written)}
