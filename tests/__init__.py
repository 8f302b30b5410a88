"""hermeneut's tests: ``unit/`` mirrors the packages (``unit/pipeline/`` the core, ``unit/hermeneut/`` the CLI, web and
jobs, ``unit/producers/``, ``unit/processors/``, ``unit/sinks/``), ``integration/`` talks to the real Kafka and
InfluxDB the project starts, ``fakes/`` holds every test double, ``testdata/`` the real captures (:data:`TESTDATA`)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

TESTDATA: Final = Path(__file__).resolve().parent / "testdata"
