"""The labelled fleet history the processor's tests learn from, simulated once for all of them."""

from __future__ import annotations

import pytest

from tests.unit.processors.history import Labelled, labelled_history


@pytest.fixture(scope="package")
def history() -> Labelled:
    return labelled_history(seed=1)
