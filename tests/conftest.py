"""Hypothesis profiles for the property tests (``@pytest.mark.fuzz``), chosen by ``HYPOTHESIS_PROFILE``:

- ``ci`` (default): a seeded, bounded run in every ``make test``: the same examples every time, a few hundred per
  target, so the suite stays fast and never flaky.
- ``fuzz`` (``make fuzz``): 100,000 inputs per target from a fixed seed (``--hypothesis-seed``), no deadline; the
  summary at the end lists inputs, failures and seconds per target (the README's table comes from it).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator

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
settings.register_profile(
    "fuzz",
    max_examples=100_000,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: inputs each property test ran (counted by tests.fuzzing.count), and its outcome and time
INPUTS: Counter[str] = Counter()
_RESULTS: dict[str, tuple[str, float]] = {}


@pytest.fixture(autouse=True)
def _time_fuzz_targets(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("fuzz") is None:
        yield
        return
    start = time.perf_counter()
    yield
    _RESULTS[request.node.nodeid] = ("", time.perf_counter() - start)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.nodeid in _RESULTS:
        _RESULTS[report.nodeid] = (report.outcome, _RESULTS[report.nodeid][1])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if settings().max_examples < 100_000 or not _RESULTS:
        return
    write = terminalreporter.write_line
    write("")
    write("| fuzz target | inputs | exceptions | seconds |")
    write("|---|---:|---:|---:|")
    for nodeid, (outcome, seconds) in sorted(_RESULTS.items()):
        name = nodeid.rsplit("::", 1)[-1]
        failed = "0" if outcome == "passed" else f"failed ({outcome})"
        write(f"| {name} | {INPUTS[name]:,} | {failed} | {seconds:.0f} |")
