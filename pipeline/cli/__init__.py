"""The ``hermeneut`` command: the face that wires the stages together.

Commands live in one module per area (``core``: services, topics, stages, run; ``queries``: trend, top,
compare, anomalies, storage; ``web``: the HTTP API); each registers itself
on the group in :mod:`pipeline.cli.base` when imported here.
"""

from __future__ import annotations

from pipeline.cli import core, queries, web
from pipeline.cli.base import cli

__all__ = ["cli", "core", "main", "queries", "web"]


def main() -> None:
    cli(prog_name="hermeneut")
