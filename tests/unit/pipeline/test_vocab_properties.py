"""The duration grammar is total: any text is a duration in whole nanoseconds within the bounds asked for, or
one InvalidInput line; and what :func:`format_duration` writes parses back to the same value."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.errors import InvalidInput
from pipeline.vocab import MAX_DURATION_NS, format_duration, parse_duration
from tests.fuzzing import FANOUT, SEEDS, count, text_mutations

_PIECES = st.sampled_from(["ns", "us", "ms", "s", "m", "h", "d", "w", ".", "0", "1", "9", "99999999999", " ", "-", "e"])


@pytest.mark.fuzz
@given(st.text(max_size=40) | st.lists(_PIECES, max_size=12).map("".join), st.booleans(), SEEDS)
def test_any_text_is_a_bounded_duration_or_one_readable_error(text: str, zero: bool, seed: int) -> None:
    for variant in text_mutations(text, seed):
        count()
        try:
            ns = parse_duration(variant, zero=zero)
        except InvalidInput as exc:
            assert "\n" not in str(exc) and str(exc)
            continue
        assert type(ns) is int and (0 if zero else 1) <= ns <= MAX_DURATION_NS


@pytest.mark.fuzz
@given(st.integers(min_value=1, max_value=MAX_DURATION_NS), SEEDS)
def test_formatted_durations_parse_back(ns: int, seed: int) -> None:
    rng = random.Random(seed)
    for value in [ns] + [
        rng.randint(1, rng.choice((10**3, 10**9, 10**15, MAX_DURATION_NS))) for _ in range(FANOUT - 1)
    ]:
        count()
        assert parse_duration(format_duration(value)) == value
