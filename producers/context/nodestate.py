"""Is this node out of service on purpose? What its scheduler says, read by the node agent for its topology.

A maintenance window is not a fault: a node being drained, rebooted for a firmware update or cordoned while its
GPUs are swapped goes silent, retrains its links and shows odd readings, and none of that should page anyone or
count towards a lemon node. NVSentinel drains before it remediates; Slurm sites drain a node (``scontrol update
state=drain reason=...``) before working on it; Kubernetes operators cordon it (``kubectl cordon`` sets
``spec.unschedulable``). hermeneut reads that state instead of guessing it from telemetry:

- **Slurm** (``scontrol show node <node>``, at most once a topology check, 60 s by default): the node's
  ``State=BASE+FLAG+...`` carries a flag of :data:`SLURM_OUT_OF_SERVICE` (slurm.h's node state flags as scontrol
  prints them: an operator's ``DRAIN``, a maintenance reservation's ``MAINT``/``MAINTENANCE``, a reboot asked for
  or under way); the ``Reason=`` line (free text, with who and when) is the why. ``DOWN`` or ``FAIL`` alone are not
  maintenance: slurmctld sets ``DOWN`` itself when a node stops responding, which is exactly what must stay visible.
- **Kubernetes** (``GET /api/v1/nodes/<node>``; the agent's service account needs ``get`` on ``nodes``): the node
  is cordoned (``spec.unschedulable``); its other taints (a remediation system's quarantine taint, say) are named.

Each reader's :meth:`maintenance` returns the why, ``""`` when the node is in service, and raises
:class:`~pipeline.errors.SourceUnavailable` when it cannot tell now (the agent then keeps the last answer).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Final, Protocol

from pipeline.errors import SourceUnavailable
from producers.context.kubernetes import ApiServer
from producers.source import Runner, run_command

#: scontrol's node state flags that say the node is held out of service on purpose
SLURM_OUT_OF_SERVICE: Final = (
    "DRAIN", "DRAINING", "DRAINED", "MAINT", "MAINTENANCE", "REBOOT_REQUESTED", "REBOOT_ISSUED"
)  # fmt: skip
#: the taint ``kubectl cordon`` goes with (named by Kubernetes' well-known labels, annotations and taints)
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"


class NodeState(Protocol):
    """Whether the node is out of service on purpose, and why."""

    name: str

    def maintenance(self) -> str: ...


def slurm_maintenance(text: str) -> str:
    """Why ``scontrol show node <node>`` output says the node is out of service (``""``: in service).

    Raises ValueError when the output holds no ``State=`` (not a node record)."""
    state, reason = None, ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Reason="):
            reason = stripped[len("Reason=") :].strip()
            continue
        for token in stripped.split():
            if token.startswith("State="):
                state = token[len("State=") :]
    if state is None:
        raise ValueError("no State= in scontrol show node output")
    # a trailing "*" marks a node that does not respond (DOWN*, IDLE*+DRAIN): not a flag of its own
    if not any(f.rstrip("*") in SLURM_OUT_OF_SERVICE for f in state.split("+")):
        return ""
    return f"slurm {state}" + (f": {reason}" if reason else "")


def kubernetes_maintenance(node: Mapping[str, Any]) -> str:
    """Why a Kubernetes Node object says the node is out of service (``""``: in service)."""
    spec = node.get("spec") or {}
    if not spec.get("unschedulable"):
        return ""
    others = sorted(
        {str(t.get("key")) for t in spec.get("taints") or () if t.get("key") and t.get("key") != UNSCHEDULABLE_TAINT}
    )
    return "kubernetes cordoned" + (f" (taints: {', '.join(others)})" if others else "")


class SlurmNodeState:
    """The node's state from ``scontrol show node <node>``."""

    name = "slurm"

    def __init__(self, node: str, timeout_s: float = 10.0, runner: Runner = run_command) -> None:
        self.node, self.timeout_s, self._run = node, timeout_s, runner

    def maintenance(self) -> str:
        text = self._run(["scontrol", "show", "node", self.node], self.timeout_s)
        try:
            return slurm_maintenance(text)
        except ValueError as exc:
            raise SourceUnavailable(f"scontrol show node {self.node}: {exc}") from exc


class KubernetesNodeState:
    """The node's state from the API server's Node object."""

    name = "kubernetes"

    def __init__(self, node: str, api: ApiServer) -> None:
        self.node, self.api = node, api

    def maintenance(self) -> str:
        found = self.api.get(f"/api/v1/nodes/{urllib.parse.quote(self.node)}")
        if not isinstance(found, dict):
            raise SourceUnavailable(f"API server /api/v1/nodes/{self.node}: not a Node object")
        return kubernetes_maintenance(found)
