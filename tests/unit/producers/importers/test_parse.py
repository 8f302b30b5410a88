"""Reading cells: numbers with units, nvidia-smi's no-value markers, flags, and times as traces write them."""

from __future__ import annotations

import math

import pytest

from pipeline.errors import ConfigError
from producers.importers.parse import BadValue, flag, number, timestamp_ns, unit_factor, zone


@pytest.mark.parametrize(
    ("cell", "factor", "value"),
    [
        ("81559 MiB", 1.0, 81559 * 2.0**20), ("631.95 W", 1.0, 631.95), (" 38", 1.0, 38.0), ("100 %", 1.0, 100.0),
        ("0x0000000000000001", 1.0, 1.0), ("P8", 1.0, 8.0), ("1980 MHz", 1.0, 1980.0),
        ("19818", 2.0**20, 19818 * 2.0**20),
        ("0.25 ratio", 1.0, 25.0), ("1.5e3", 1.0, 1500.0),
    ],
)  # fmt: skip
def test_numbers_in_the_canonical_unit(cell: str, factor: float, value: float) -> None:
    assert number(cell, factor) == value


@pytest.mark.parametrize(
    "cell", ["[N/A]", "N/A", "", "[Requested functionality has been deprecated]", "[Not Supported]"]
)
def test_no_value_is_absent_never_zero(cell: str) -> None:
    assert math.isnan(number(cell))
    assert math.isnan(flag(cell))


@pytest.mark.parametrize(
    ("cell", "message"),
    [("abc", "'abc' is not a number"), ("12 furlongs", r"unit this importer does not know \(furlongs\)"),
     ("0xZZ", "not a hex number"), ("inf", "'inf' is not a number"), ("1e999", "not a finite number")],
)  # fmt: skip
def test_unreadable_cells_say_why(cell: str, message: str) -> None:
    with pytest.raises(BadValue, match=message):
        number(cell)


def test_flags() -> None:
    assert [flag(c) for c in ("Yes", "No", "Active", "Not Active", "Enabled")] == [1.0, 0.0, 1.0, 0.0, 1.0]
    with pytest.raises(BadValue):
        flag("maybe")


def test_times_as_traces_write_them() -> None:
    utc = 1_784_016_758_696_000_000  # 2026-07-14T08:12:38.696Z
    assert timestamp_ns("2026/07/14 08:12:38.696") == utc  # nvidia-smi, in UTC unless told
    assert timestamp_ns("2026-07-14T08:12:38.696Z") == utc
    assert timestamp_ns("2026/07/14 10:12:38.696", tz=zone("Europe/Paris")) == utc
    assert timestamp_ns("1784016758.696", "unix_s") == utc
    assert timestamp_ns("1784016758696", "unix_ms") == utc
    assert timestamp_ns("14.07.2026 08:12:38", "%d.%m.%Y %H:%M:%S") == utc - 696_000_000
    with pytest.raises(BadValue, match="is not a time"):
        timestamp_ns("yesterday")


def test_unknown_units_and_zones_are_configuration_errors() -> None:
    with pytest.raises(ConfigError, match="unknown unit 'stone'"):
        unit_factor("stone", "mapping")
    with pytest.raises(ConfigError, match="unknown time zone 'Mars/Olympus'"):
        zone("Mars/Olympus")
