"""The size budget: what the broker counts, and the one split that keeps every record under it."""

from __future__ import annotations

import msgpack
from hypothesis import given
from hypothesis import strategies as st

from pipeline.sizing import KAFKA_DEFAULT_LIMIT, Cut, Limits, fit, record_size
from tests.fuzzing import count


def test_record_size_counts_key_value_headers_and_the_batch_header() -> None:
    bare = record_size(None, 0)
    assert bare > 61  # a batch of one record: its header and the record's framing
    assert record_size(b"k" * 10, 100, [("h", b"v" * 5)]) == bare + 10 + 100 + 1 + 5 + 10


def test_budget_leaves_room_for_key_headers_and_compression() -> None:
    limits, headers = Limits(topics={"t": 500_000}), [("hermeneut-reason", b"nan")]
    budget = limits.value_budget("t", b"key", headers)
    assert budget < 500_000 - record_size(b"key", 0, headers)
    assert limits.value_budget("other") == Limits().value_budget("x") < KAFKA_DEFAULT_LIMIT
    assert limits.fits("t", b"key", b"x" * budget, headers) and not limits.fits(
        "t", b"key", b"x" * (budget + 1), headers
    )
    assert limits.producer_max() > KAFKA_DEFAULT_LIMIT and limits.batch_max() < 500_000


def _encode(items: list[list[bytes]]) -> object:
    def encode(cut: Cut) -> bytes:
        packed: bytes = msgpack.packb([lst[s] for lst, s in zip(items, cut, strict=True)])
        return packed

    return encode


@given(
    st.lists(st.lists(st.binary(max_size=300), max_size=60), min_size=1, max_size=3),
    st.integers(min_value=40, max_value=4000),
)
def test_split_parts_fit_and_lose_or_duplicate_nothing(items: list[list[bytes]], budget: int) -> None:
    """For any lists of items and any budget: every part is under the budget, and the parts (plus the items
    reported too large) hold every item exactly once, each list in order."""
    count()
    fitted = fit([len(lst) for lst in items], _encode(items), budget)  # type: ignore[arg-type]
    assert all(len(p) <= budget for p in fitted.parts)
    seen: list[list[bytes]] = [[] for _ in items]
    for part in fitted.parts:
        for j, lst in enumerate(msgpack.unpackb(part)):
            seen[j] += lst
    for which, item in fitted.too_large:
        assert len(msgpack.packb([[items[which][item]] if j == which else [] for j in range(len(items))])) > budget
    too_large = set(fitted.too_large)
    for j, lst in enumerate(items):
        assert seen[j] == [x for i, x in enumerate(lst) if (j, i) not in too_large]


def test_split_converges_when_one_list_has_a_single_item() -> None:
    items = [[b"r" * 100], [b"e" * 100], []]
    fitted = fit([1, 1, 0], _encode(items), 150)  # type: ignore[arg-type]
    assert len(fitted.parts) == 2 and not fitted.too_large


def test_an_item_that_cannot_fit_alone_is_reported_not_retried() -> None:
    items = [[b"a" * 10, b"b" * 1000, b"c" * 10]]
    calls = 0
    encode = _encode(items)

    def counted(cut: Cut) -> bytes:
        nonlocal calls
        calls += 1
        return encode(cut)  # type: ignore[operator,no-any-return]

    fitted = fit([3], counted, 200)
    assert fitted.too_large == [(0, 1)] and len(fitted.parts) == 2 and calls < 10
