"""The alert manager's inputs are total: matchers (as the CLI and the HTTP API take them) parse into matchers or
one AlertConfigError line, and a parsed matcher answers any labels with a bool; alert-state and alert-config
records decode into their types or DecodeError, whatever bytes arrive. (Whether a regular expression can be made to
backtrack catastrophically is issue 14's item 4: the labels here are short, so every match here ends.)"""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from alerting.model import LABELS, decode_config, decode_state, parse_matchers
from pipeline.errors import AlertConfigError, DecodeError
from tests.fuzzing import SEEDS, VALUES, count, mutations, text_mutations

_TEXT = st.text(max_size=30) | st.sampled_from(['"', "\\", "{", "}", ",", "=~", "!~", "!=", "=", ".*", "(", "["])
_MATCHER = st.builds(
    lambda name, op, value, quoted: name + op + (f'"{value}"' if quoted else value),
    st.sampled_from([*LABELS, "nope", ""]),
    st.sampled_from(["=", "!=", "=~", "!~", "==", ""]),
    st.lists(_TEXT, max_size=4).map("".join),
    st.booleans(),
)


@pytest.mark.fuzz
@given(
    st.lists(_MATCHER | st.text(max_size=40), max_size=4),
    st.dictionaries(st.sampled_from(LABELS), st.text(max_size=12), max_size=6),
    SEEDS,
)
def test_matchers_parse_or_refuse_with_one_line_and_answer_any_labels(
    texts: list[str], labels: dict[str, str], seed: int
) -> None:
    joined = "{" + ",".join(texts) + "}"
    for variant in text_mutations(joined, seed):
        count()
        _check([variant] if variant != joined else texts, labels)


def _check(group: list[str], labels: dict[str, str]) -> None:
    try:
        matchers = parse_matchers(group)
    except AlertConfigError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert all(type(m.matches(labels)) is bool for m in matchers)


@pytest.mark.fuzz
@given(st.binary(max_size=200) | VALUES.map(msgpack.packb), SEEDS)
def test_alert_records_decode_into_their_types_or_decode_error(payload: bytes, seed: int) -> None:
    for variant in mutations(payload, seed):
        count()
        for decode in (decode_state, decode_config):
            with contextlib.suppress(DecodeError):
                assert decode(variant) is not None
