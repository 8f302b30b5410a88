"""The shared vocabulary: one duration grammar for every flag and field, one table of NVML clock-event reasons."""

from __future__ import annotations

import pynvml
import pytest

from pipeline.errors import InvalidInput
from pipeline.vocab import (
    BENIGN_REASONS,
    CLOCK_REASONS,
    MAX_DURATION_NS,
    clock_reason_words,
    decode_clock_reasons,
    format_duration,
    parse_duration,
    parse_seconds,
)

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("90s", 90 * S),
        ("15m", 900 * S),
        ("1h30m", 5400 * S),
        ("1.5h", 5400 * S),
        ("7d", 7 * 86400 * S),
        ("2w", 14 * 86400 * S),
        ("500ms", S // 2),
        (" 1h30m ", 5400 * S),
        ("250us", 250_000),
        ("10ns", 10),
    ],
)
def test_durations_parse(text: str, ns: int) -> None:
    assert parse_duration(text) == ns


@pytest.mark.parametrize(
    "text", ["", "0s", "10", "h", "-5m", "5 minutes", "1e3s", "99999999999h", "1h-30m", "5M", "1h 30m"]
)
def test_bad_durations_are_one_line_errors(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_duration(text, "--range")
    assert "\n" not in str(info.value)
    assert "--range" in str(info.value)


def test_durations_have_a_ceiling() -> None:
    assert parse_duration("520w") <= MAX_DURATION_NS
    with pytest.raises(InvalidInput, match="longer than"):
        parse_duration("2h", max_ns=3600 * S)
    assert parse_seconds("1h30m") == 5400.0
    assert parse_duration("0s", zero=True) == 0
    with pytest.raises(InvalidInput, match="longer than zero"):
        parse_duration("0s")


@pytest.mark.parametrize("ns", [1, 1_000, 1_000_000, S, 90 * S, 5400 * S, 7 * 86400 * S + 3 * S, 123_456 * S])
def test_format_parses_back(ns: int) -> None:
    assert parse_duration(format_duration(ns)) == ns


def test_clock_reason_bits_are_nvmls_own() -> None:
    for reason in CLOCK_REASONS:
        assert getattr(pynvml, f"nvmlClocksThrottleReason{reason.name}") == reason.bit
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(0x24) == ["SwPowerCap", "SwThermalSlowdown"]
    assert decode_clock_reasons(0x1 | 0x40 | 0x1000) == ["GpuIdle", "HwThermalSlowdown", "Unknown(0x1000)"]
    with pytest.raises(ValueError):
        decode_clock_reasons(-1)


def test_benign_reasons_do_not_throttle() -> None:
    assert BENIGN_REASONS == 0x1 | 0x2 | 0x10 | 0x100
    assert clock_reason_words(BENIGN_REASONS) == []
    assert clock_reason_words(0x24) == ["SW power cap", "SW thermal slowdown"]
    assert clock_reason_words(0x4000) == ["unknown reason 0x4000"]
