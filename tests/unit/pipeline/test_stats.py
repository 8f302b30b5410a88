"""The stall watch every writing stage keeps: stalled after a few failures of the same write (or a long wait for
an acknowledgement), one log line each way, counted, and cleared by a success."""

from __future__ import annotations

import logging

import pytest

from pipeline.stats import Stall


def test_a_write_that_keeps_failing_stalls_the_stage_once_and_a_success_clears_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stall = Stall("processor", after=3)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            stall.failed("hermeneut.deadletter", 1_040_000, "raw/0/42", "MessageSizeTooLargeError")
        assert not stall.stalled and stall.values()["write_failures"] == 2
        for _ in range(5):
            stall.failed("hermeneut.deadletter", 1_040_000, "raw/0/42", "MessageSizeTooLargeError")
        values = stall.values()
        assert values["stalled"] and values["stalls"] == 1 and values["write_failures"] == 7
        assert "1040000 bytes from raw/0/42" in values["stalled_on"]
        stall.ok()
    assert stall.values() == {"stalled": False, "stalls": 1, "write_failures": 7, "stalled_on": ""}
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "processor stalled" in errors[0].getMessage()  # one line, not one per attempt
    assert any("no longer stalled" in r.getMessage() for r in caplog.records)


def test_a_write_unacknowledged_for_long_stalls_without_failing() -> None:
    stall = Stall("processor", after_s=0.0)
    stall.waiting("hermeneut.events.interpreted", 900_000, "raw/1")
    stall.waiting("hermeneut.events.interpreted", 900_000, "raw/1")
    assert stall.stalled and stall.write_failures == 0 and "unacknowledged" in stall.stalled_on
