"""Hypothesis profiles for the property tests (``@pytest.mark.fuzz``), chosen by ``HYPOTHESIS_PROFILE``:

- ``ci`` (default): a seeded, bounded run in every ``make test``: the same examples every time, a few hundred per
  target, so the suite stays fast and never flaky.
- ``fuzz`` (``make fuzz``): 100,000 inputs per target (``FUZZ_INPUTS`` to change it) from a fixed seed
  (``--hypothesis-seed``), no deadline; the summary at the end lists inputs, exceptions and seconds per target (the
  table in docs/results.md comes from it).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: inputs per target in ``make fuzz``: hypothesis' examples times the mutations each is tried as (tests.fuzzing)
FUZZ_INPUTS = int(os.environ.get("FUZZ_INPUTS", "100000"))
settings.register_profile(
    "fuzz",
    max_examples=-(-FUZZ_INPUTS // int(os.environ.get("FUZZ_FANOUT", "3"))),
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: inputs each property test ran (counted by tests.fuzzing.count, by test name), and each one's outcome and time
INPUTS: Counter[str] = Counter()
_OUTCOMES: dict[str, tuple[str, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "fuzz" in report.keywords:
        _OUTCOMES[report.nodeid] = (report.outcome, report.duration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if os.environ.get("HYPOTHESIS_PROFILE") != "fuzz" or not _OUTCOMES:
        return
    write = terminalreporter.write_line
    write("")
    write("| fuzz target | inputs | exceptions | seconds |")
    write("|---|---:|---:|---:|")
    for nodeid, (outcome, seconds) in sorted(_OUTCOMES.items()):
        name = nodeid.rsplit("::", 1)[-1]
        failed = "0" if outcome == "passed" else f"1 ({outcome}: see above)"
        write(f"| {name} | {INPUTS[name]:,} | {failed} | {seconds:.0f} |")
