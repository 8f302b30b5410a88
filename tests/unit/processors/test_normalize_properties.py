"""``process_raw`` is total and its counts add up (issue 14): for any take of messages (real simulator node
messages, some broken at a random place, random MessagePack, random bytes), every sample, event and NIC reading of
every message is either forwarded or dead-lettered, exactly once, and a message whose envelope is unusable is one
dead letter; no exception, whatever the input."""

from __future__ import annotations

import time
from collections import Counter

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import ValidationSettings
from pipeline.deadletter import headers_dict
from processors.normalize import RawMessage, process_raw
from tests.fuzzing import SEEDS, count, mutations
from tests.unit.pipeline.test_codec_properties import NODES, _inputs, sent

NOW = time.time_ns()


@pytest.mark.fuzz
@given(st.lists(_inputs(NODES), min_size=1, max_size=6), st.lists(st.integers(0, 2), min_size=6, max_size=6), SEEDS)
def test_process_raw_is_total_and_every_item_is_forwarded_or_dead_lettered_once(
    payloads: list[bytes], partitions: list[int], seed: int
) -> None:
    which = seed % len(payloads)  # the message the mutations change
    for variant in mutations(payloads[which], seed):
        count()
        _check([*payloads[:which], variant, *payloads[which + 1 :]], partitions)


def _check(payloads: list[bytes], partitions: list[int]) -> None:
    messages = [RawMessage(b"k", p, f"raw/{partitions[i]}/{i}", partitions[i]) for i, p in enumerate(payloads)]
    out = process_raw(messages, NOW, ValidationSettings())
    seen: Counter[tuple[int, str, int | None]] = Counter()
    for letter in out.dead:
        h = headers_dict(letter.headers)
        i = int(h["hermeneut-source"].rsplit("/", 1)[1])
        position = int(h["hermeneut-position"]) if "hermeneut-position" in h else None
        seen[(i, h.get("hermeneut-part", "message"), position)] += 1
    forwarded = 0
    for partition, batch in out.forward:
        origins = out.origins[partition]
        assert len(origins.rows) == len(batch) and len(origins.events) == len(batch.gpu_events)
        assert len(origins.nics) == len(batch.nics)
        forwarded += len(batch)
        for part, where in (("sample", origins.rows), ("event", origins.events), ("nic", origins.nics)):
            seen.update((i, part, position) for i, position in where)
    assert all(n == 1 for n in seen.values()), seen
    assert out.samples_ok == forwarded
    for i, payload in enumerate(payloads):
        whole = seen[(i, "message", None)]
        if whole:
            assert not any(k[0] == i and k[1] != "message" for k in seen)
            continue
        body = msgpack.unpackb(payload, strict_map_key=False)
        for part in ("sample", "event", "nic"):
            items = sent(body, part)
            assert {k[2] for k in seen if k[0] == i and k[1] == part} == set(range(items)), (part, i)
