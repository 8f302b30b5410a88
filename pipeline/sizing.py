"""Kafka's size limits as one budget per topic, read from the cluster at start-up, and the split that keeps every
record a stage builds under it.

Where the limits are (Kafka's defaults in brackets):

- the topic's ``max.message.bytes`` (the broker's ``message.max.bytes``, 1,048,588, unless the topic overrides it):
  the largest record *batch* the broker appends to the topic. ``describe_configs`` on a topic answers the value in
  force, override or default, so that is the budget of each topic a stage writes (:func:`read_limits`).
- the producer's own limit: librdkafka's ``message.max.bytes`` (1,000,000), aiokafka's ``max_request_size``
  (1,048,576, faust's ``producer_max_request_size`` 1,000,000). hermeneut sizes its producers to the cluster
  (:meth:`Limits.producer_max`), so the topic's limit is the one that binds.

What the broker counts is a record batch: 61 bytes of header and, per record, its varint framing, key, value
and headers (:func:`record_size`). Every record is budgeted as if it travelled alone, with a margin for the
framing lz4 or zstd adds to incompressible bytes, so a record under :meth:`Limits.value_budget` is accepted whatever
the producer batches it with (producers batch below the smallest limit; a record above ``batch.size`` travels
alone).

:func:`fit` is the one split: it cuts lists of items (a node's samples, events and NIC readings; an interpreted
batch's rows and extras) into parts whose encoding fits, always converging: an item that alone does not fit
comes back as too large (the caller dead-letters it), never retried forever.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.errors import ServiceError

log = logging.getLogger(__name__)

#: the broker's default ``message.max.bytes`` (and so every topic's ``max.message.bytes`` unless overridden)
KAFKA_DEFAULT_LIMIT: Final = 1_048_588
#: record batch header (v2): base offset, length, epoch, magic, crc, attributes, deltas, ids, count
BATCH_HEADER: Final = 61
#: a record's framing besides key, value and headers: length, attributes, timestamp and offset deltas, key and
#: value lengths, header count (varints, taken at their largest)
_RECORD_FRAMING: Final = 1 + 5 + 10 + 5 + 5 + 5 + 5
#: lz4 and zstd grow incompressible bytes by at most 1/255 (1/256) plus their frame: keep that, and some, free
_MARGIN_SHARE: Final = 200
_MARGIN_MIN: Final = 1024

Headers = Sequence[tuple[str, bytes]]


def record_size(key: bytes | None, value_size: int, headers: Headers = ()) -> int:
    """Bytes a record takes in a batch of its own, as the broker counts it against ``max.message.bytes``."""
    header_bytes = sum(len(k.encode()) + len(v) + 10 for k, v in headers)
    return BATCH_HEADER + _RECORD_FRAMING + len(key or b"") + value_size + header_bytes


def margin(limit: int) -> int:
    """What a budget keeps free of a limit: compression framing and the producers' own estimates."""
    return max(_MARGIN_MIN, limit // _MARGIN_SHARE)


@dataclass(frozen=True, slots=True)
class Limits:
    """The byte limit of every topic a stage writes (``topics``), and the broker's for any other."""

    broker: int = KAFKA_DEFAULT_LIMIT
    topics: Mapping[str, int] = field(default_factory=dict)

    def limit(self, topic: str) -> int:
        return self.topics.get(topic, self.broker)

    def value_budget(self, topic: str, key: bytes | None = None, headers: Headers = ()) -> int:
        """The largest value a record with this key and these headers may carry to ``topic``."""
        limit = self.limit(topic)
        return limit - margin(limit) - record_size(key, 0, headers)

    def fits(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers = ()) -> bool:
        return len(value or b"") <= self.value_budget(topic, key, headers)

    def producer_max(self) -> int:
        """What a producer writing to these topics must allow (its ``message.max.bytes`` / max request size)."""
        return max([self.broker, *self.topics.values()]) + 64 * 1024

    def batch_max(self) -> int:
        """What a producer may put in one batch of several records: under the smallest limit it writes to."""
        return min([self.broker, *self.topics.values(), 1_000_000]) - margin(self.broker)


def read_limits(kafka_conf: dict[str, Any], topics: Iterable[str], timeout_s: float = 30.0) -> Limits:
    """The limits in force on the cluster: each topic's ``max.message.bytes`` and the broker's
    ``message.max.bytes`` (for a topic that does not exist yet). A cluster that will not say (no DescribeConfigs
    permission) gets Kafka's default, with a warning; an unreachable one is a ServiceError."""
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    admin = AdminClient(kafka_conf)
    try:
        brokers = admin.list_topics(timeout=timeout_s).brokers
    except Exception as exc:
        raise ServiceError(f"cannot reach Kafka at {kafka_conf.get('bootstrap.servers')}: {exc}") from exc
    broker = _described(admin, ConfigResource("broker", str(min(brokers))), "message.max.bytes", timeout_s)
    if broker is None:
        log.warning("Kafka did not tell its message.max.bytes; assuming the default %d", KAFKA_DEFAULT_LIMIT)
        broker = KAFKA_DEFAULT_LIMIT
    per_topic = {}
    for topic in sorted(set(topics)):
        value = _described(admin, ConfigResource("topic", topic), "max.message.bytes", timeout_s)
        per_topic[topic] = broker if value is None else value
    return Limits(broker, per_topic)


def _described(admin: Any, resource: Any, name: str, timeout_s: float) -> int | None:
    try:
        (future,) = admin.describe_configs([resource], request_timeout=timeout_s).values()
        entry = future.result(timeout=timeout_s).get(name)
    except Exception as exc:  # unknown topic, no permission: the caller falls back
        log.debug("describe_configs %s: %s", resource, exc)
        return None
    return int(entry.value) if entry is not None and entry.value is not None else None


# --- the split -----------------------------------------------------------------------------------------------

#: one slice per list of items (e.g. samples, events, NIC readings)
Cut = tuple[slice, ...]


@dataclass
class Fitted:
    """A split's result: the encoded parts in order, and (list, item) of every item that alone does not fit."""

    parts: list[bytes] = field(default_factory=list)
    too_large: list[tuple[int, int]] = field(default_factory=list)


def fit(lengths: Sequence[int], encode: Callable[[Cut], bytes], budget: int) -> Fitted:
    """Encode the items of a few lists (``lengths`` of each) in as few parts as fit ``budget``, each list's items
    kept in order and each item in exactly one part.

    The whole is encoded first; if it does not fit it is cut in ``k`` pieces (from its size), each list cut in
    proportion, so a piece carries its share of every list (a node's events go with its samples), and each piece
    is fitted the same way. Every cut leaves each piece with fewer items than its parent, so the split ends; an
    item that does not fit alone is returned in :attr:`Fitted.too_large`.
    """
    out = Fitted()
    _fit(tuple(slice(0, n) for n in lengths), encode, budget, out)
    return out


def _count(cut: Cut) -> int:
    return sum(s.stop - s.start for s in cut)


def _fit(cut: Cut, encode: Callable[[Cut], bytes], budget: int, out: Fitted) -> None:
    total = _count(cut)
    if total == 0:
        return
    payload = encode(cut)
    if len(payload) <= budget:
        out.parts.append(payload)
        return
    if total == 1:
        which = next(i for i, s in enumerate(cut) if s.stop > s.start)
        out.too_large.append((which, cut[which].start))
        return
    k = min(total, max(2, math.ceil(len(payload) * 1.1 / max(budget, 1))))
    for piece in _pieces(cut, k):
        _fit(piece, encode, budget, out)


def _pieces(cut: Cut, k: int) -> list[Cut]:
    """``cut`` in ``k`` pieces, each list in proportion; if that leaves a piece as large as the whole (one list
    of one item beside others), the items one list after the other instead."""
    total = _count(cut)
    pieces = []
    for i in range(k):
        piece = tuple(
            slice(s.start + (s.stop - s.start) * i // k, s.start + (s.stop - s.start) * (i + 1) // k) for s in cut
        )
        if _count(piece):
            pieces.append(piece)
    if all(_count(p) < total for p in pieces):
        return pieces
    flat = [(j, item) for j, s in enumerate(cut) for item in range(s.start, s.stop)]
    pieces = []
    for i in range(k):
        chunk = flat[len(flat) * i // k : len(flat) * (i + 1) // k]
        if chunk:
            pieces.append(tuple(_span([item for j, item in chunk if j == n], s) for n, s in enumerate(cut)))
    return pieces


def _span(items: list[int], whole: slice) -> slice:
    return slice(items[0], items[-1] + 1) if items else slice(whole.start, whole.start)
