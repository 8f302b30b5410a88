"""Dead letters are bounded: the original once per source message, truncated with its size and hash where it would
not fit, and still one record per rejected item."""

from __future__ import annotations

import hashlib

from pipeline.deadletter import bounded, dead_letter, headers_dict
from pipeline.sizing import record_size


def test_the_original_is_carried_once_per_source() -> None:
    original = b"x" * 530_000
    letters = [dead_letter(b"k", original, "nan", "bad", "processor", "raw/0/9", f"GPU-{i}", i) for i in range(20)]
    out = bounded(letters, 1_048_588)
    assert len(out) == 20
    assert out[0].value == original and all(letter.value == b"" for letter in out[1:])
    assert sum(len(letter.value) for letter in out) == 530_000  # not 20 x 530 kB
    headers = [headers_dict(letter.headers) for letter in out]
    assert [h["hermeneut-payload"] for h in headers] == ["original"] + ["elsewhere"] * 19
    assert {h["hermeneut-sha256"] for h in headers} == {hashlib.sha256(original).hexdigest()}
    assert [h["hermeneut-gpu"] for h in headers] == [f"GPU-{i}" for i in range(20)]


def test_an_original_just_under_the_limit_is_truncated_to_fit() -> None:
    original = b"y" * (2**20 - 100)
    (letter,) = bounded([dead_letter(b"k", original, "nan", "d" * 900, "processor", "raw/1/3", "G" * 900, 2)], 2**20)
    headers = headers_dict(letter.headers)
    assert headers["hermeneut-payload"] == "truncated" and headers["hermeneut-size"] == str(len(original))
    assert original.startswith(letter.value) and record_size(letter.key, len(letter.value), letter.headers) < 2**20
    assert len(headers["hermeneut-detail"]) == len(headers["hermeneut-gpu"]) == 500


def test_letters_of_different_sources_each_carry_theirs() -> None:
    letters = [dead_letter(None, bytes([i]) * 10, "malformed", "", "sink", f"t/0/{i}") for i in range(3)]
    assert [letter.value for letter in bounded(letters, 10_000)] == [bytes([i]) * 10 for i in range(3)]
