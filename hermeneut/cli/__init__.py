"""The ``hermeneut`` command: the face that wires the stages together.

Commands live in one module per area, each registering itself on the group in :mod:`hermeneut.cli.base` when
imported here: ``core`` (services, topics, the stages, run), ``collect`` (the node agent), ``context`` (workload
context per GPU), ``importing`` (history from Prometheus, dcgm-exporter, nvidia-smi and traces), ``baselines``
(train, list, feedback), ``queries`` (trend, top, compare, anomalies, jobs, storage), ``alerts``, ``rightsize``,
``evaluate``, ``health`` (GPUs and nodes by state, with remedies), ``probe`` (links between a node's GPUs),
``kubernetes`` (health as node conditions and device taints) and ``web`` (the HTTP API and dashboard).
"""

from __future__ import annotations

from hermeneut.cli import (
    alerts,
    baselines,
    collect,
    context,
    core,
    evaluate,
    health,
    importing,
    kubernetes,
    probe,
    queries,
    rightsize,
    web,
)
from hermeneut.cli.base import cli

__all__ = [
    "alerts",
    "baselines",
    "cli",
    "collect",
    "context",
    "core",
    "evaluate",
    "health",
    "importing",
    "kubernetes",
    "main",
    "probe",
    "queries",
    "rightsize",
    "web",
]


def main() -> None:
    cli(prog_name="hermeneut")
