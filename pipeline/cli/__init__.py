"""The ``hermeneut`` command: the face that wires the stages together.

Commands live in one module per area (``core``: services, topics, stages, trend, run; ``collect``: the node
agent; ``context``: workload context per GPU; ``alerts``: alerting; ...); each registers itself on the group in
:mod:`pipeline.cli.base` when imported here.
"""

from __future__ import annotations

from pipeline.cli import alerts, baselines, collect, context, core, evaluate, rightsize
from pipeline.cli.base import cli

__all__ = ["alerts", "baselines", "cli", "collect", "context", "core", "evaluate", "main", "rightsize"]


def main() -> None:
    cli(prog_name="hermeneut")
