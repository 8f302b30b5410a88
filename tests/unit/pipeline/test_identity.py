"""The identity rule shared by the processor and the sink: what InfluxDB's line protocol cannot carry is named,
what it can is left alone (the real influxd refusing what this refuses is tests/integration/test_bad_input.py)."""

from __future__ import annotations

import pytest

from pipeline.identity import IDENTITY_MAX_BYTES, identity_problem
from sinks.influxdb.lines import tag


@pytest.mark.parametrize(
    "value",
    # a backslash anywhere but at the end is stored as sent (measured on influxd 2.7)
    [
        "GPU-6d4c5e1a-0b7e-4c2f-9f4e-1d2c3b4a5f60",
        "node 7,rack=3",
        "a\\b",
        "a\\,b",
        "a\\ b",
        "a\\=b",
        "a\\\\,b",
        "x\ny",
        " ",
        "\t",
        "é" * 128,
    ],
)
def test_what_line_protocol_carries_is_accepted(value: str) -> None:
    assert identity_problem(value, "node") is None
    assert tag(value)  # never an empty tag value


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("GPU-a\\", "ends in a backslash"),
        ("GPU-a\\\\", "ends in a backslash"),  # however many
        ("a\\\n", "ends in a backslash"),  # the line break is removed first
        ("\n", "is empty once its line breaks are removed"),
        ("\r\n\r\n", "is empty once its line breaks are removed"),
        ("", "is empty once its line breaks are removed"),
        ("x" * (IDENTITY_MAX_BYTES + 1), f"is {IDENTITY_MAX_BYTES + 1} bytes long"),
        ("é" * 129, "is 258 bytes long"),  # bytes, not characters
    ],
)
def test_what_it_cannot_carry_is_named(value: str, why: str) -> None:
    problem = identity_problem(value, "node")
    assert problem is not None and why in problem and problem.startswith("node")
    assert len(problem) < 200  # a 64 KiB value is not echoed into the dead letter


def test_an_optional_identity_may_be_empty_but_not_only_line_breaks() -> None:
    assert identity_problem("", "model", optional=True) is None
    assert identity_problem("\n", "model", optional=True) is not None
