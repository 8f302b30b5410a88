"""The Sink contract: what the generic runner (:mod:`sinks.runner`) needs of a destination.

A sink is a plugin registered by name in :mod:`pipeline.registry` (``influxdb`` today). The runner consumes its
``topics``, hands each message to :meth:`Sink.prepare` (decode and turn into what the sink writes, no I/O),
batches the prepared messages, and for each batch calls :meth:`Sink.add` then :meth:`Sink.flush`; it commits the
batch's offsets only after a good flush, and no further than :meth:`Sink.marks` says: a sink that keeps state
built from messages in memory (the InfluxDB sink's open 1-minute rollups) has them read again after a restart.
:meth:`Sink.resume` and :meth:`Sink.forget` follow the partitions assigned to and revoked from the runner.
``prepare`` runs on the runner's consumer thread and ``add`` / ``flush`` on its writer thread, so the next batch
is prepared while the previous one is being written.

One bad item never costs the others. What the sink will not store it says item by item, as a :class:`Refusal`
(reason, detail, and where in its message the item is): ``prepare`` refuses what it can tell by looking (an
identity or a value the destination cannot hold, a time far ahead) in :attr:`Prepared.refused` and leaves it out
of what it writes; ``flush`` returns what the destination itself refused, once it has written everything else of
the batch. The runner dead-letters each refusal alone, with its message, and commits.

What ``flush`` may raise, and what the runner does (the classes live in :mod:`pipeline.errors`):

    SinkBackpressure(retry_after_s)   the destination asks to wait: consumption pauses, the same batch is
                                      flushed again after ``retry_after_s``; nothing is dropped or committed
    TransientWriteError               down, overloaded, timed out: flushed again with exponential backoff and
                                      jitter while consumption pauses; nothing is committed meanwhile
    PermanentWriteError               the whole batch was refused and the sink cannot tell which item: it drops
                                      the batch, the runner dead-letters its messages (reason
                                      ``<sink name>_rejected``) and commits. The InfluxDB sink never raises it:
                                      it splits a refused request until the refused lines stand alone (refusals)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

from pipeline.errors import PermanentWriteError, SinkBackpressure, TransientWriteError

T = TypeVar("T")

__all__ = ["PermanentWriteError", "Prepared", "Refusal", "Sink", "SinkBackpressure", "TransientWriteError"]


@dataclass(frozen=True, slots=True)
class Position:
    """Where a consumed message is: topic, partition, offset."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """One item of a message that is not stored, dead-lettered alone (the rest of the message and of its batch is
    stored): its reason and detail, and where it is, in the dead letter's headers."""

    reason: str
    detail: str
    #: flush's refusals: the place in the batch handed to :meth:`Sink.add` of the message it came from
    item: int = 0
    #: the GPU, and the item's position in its message's list ``part`` (sample, event, nic, ...), when known
    gpu: str | None = None
    position: int | None = None
    part: str = "sample"


@dataclass(frozen=True, slots=True)
class Prepared(Generic[T]):
    """One consumed message, ready for a sink (what :meth:`Sink.prepare` returns)."""

    payload: T
    #: how much it counts toward the runner's batch size (InfluxDB: the samples it holds)
    size: int = 0
    #: the sample times it carries, for the sample -> stored latency figures (None: it carries none)
    ts_ns: np.ndarray | None = None
    #: the message's items left out of ``payload`` (dead-lettered by the runner, each alone)
    refused: tuple[Refusal, ...] = ()


class Sink(Protocol[T]):
    """A destination of the sink runner (see the module docstring for who calls what, and when)."""

    name: str
    #: the Kafka topics it stores
    topics: tuple[str, ...]

    def prepare(self, topic: str, value: bytes, at: Position) -> Prepared[T]:
        """Decode one message of ``topic`` (at ``at``) into what this sink writes; no I/O. Raises
        :class:`~pipeline.errors.DecodeError` for a message that cannot be read (the runner dead-letters it)."""

    def marks(self) -> dict[tuple[str, int], tuple[int, str]]:
        """Per (topic, partition) whose messages' content the sink still holds in memory only: the offset to
        commit at most (a restart reads again from there) and the commit metadata that lets :meth:`resume` pick
        up where this left off. Asked when a batch is handed over (the state as of its last message)."""

    def resume(self, topic: str, partition: int, metadata: str | None) -> None:
        """A partition was assigned; ``metadata`` is its last commit's (None: none)."""

    def forget(self, topic: str, partition: int) -> None:
        """A partition was revoked: drop what is held from it (its next owner reads it again)."""

    def add(self, batch: Sequence[Prepared[T]]) -> None:
        """Take a batch for the next :meth:`flush`; no I/O."""

    def flush(self) -> Sequence[Refusal]:
        """Write everything added since the last good flush; returns what the destination refused, item by item
        (the rest is stored); raises as the module docstring says. After a transient error or backpressure, what
        was added stays for the next flush."""

    def close(self) -> None:
        """Release the connection; safe to call twice. What was never flushed is dropped (it stays uncommitted
        in Kafka, and the next run stores it)."""

    def stats(self) -> dict[str, int]:
        """Counters of what it wrote, for the stats file."""


class Stateless:
    """For a sink that holds nothing across batches (each batch is written whole): no marks, so the runner commits
    every batch it stored, and nothing to resume or forget when partitions move."""

    def marks(self) -> dict[tuple[str, int], tuple[int, str]]:
        return {}

    def resume(self, topic: str, partition: int, metadata: str | None) -> None:
        """Nothing held, nothing to pick up."""

    def forget(self, topic: str, partition: int) -> None:
        """Nothing held, nothing to drop."""
