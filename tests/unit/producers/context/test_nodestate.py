"""Is the node out of service on purpose: ``scontrol show node`` records and Kubernetes Node objects read, the
Slurm reader run against a stand-in runner, the Kubernetes one against a local API server."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import SourceUnavailable
from producers.context.kubernetes import ApiServer
from producers.context.nodestate import (
    UNSCHEDULABLE_TAINT,
    KubernetesNodeState,
    SlurmNodeState,
    kubernetes_maintenance,
    slurm_maintenance,
)
from tests import TESTDATA
from tests.fakes.kubernetes import TOKEN, serve_api

#: scontrol show node of five nodes (tests/testdata/context/README.md)
RECORDS = {
    r.split(maxsplit=1)[0].removeprefix("NodeName="): r
    for r in (TESTDATA / "context" / "scontrol-show-node.txt").read_text().split("\n\n")
}


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("gpu01", ""),
        ("gpu02", "slurm MIXED+DRAIN: firmware update, GPU 3 [root@2024-05-06T14:02:55]"),
        ("gpu03", "slurm IDLE+DRAIN: swap PSU 2 [admin@2024-05-06T09:41:07]"),
        ("gpu04", "slurm IDLE+REBOOT_REQUESTED: reboot ASAP [root@2024-05-06T11:03:00]"),
        # slurmctld's own DOWN (not responding) is what must stay visible: not a maintenance window
        ("gpu05", ""),
    ],
)
def test_slurm_drain_maintenance_and_reboot_are_out_of_service_a_down_node_is_not(node: str, expected: str) -> None:
    assert slurm_maintenance(RECORDS[node]) == expected


def test_a_not_responding_drained_node_and_a_maintenance_reservation_are_out_of_service() -> None:
    drained = RECORDS["gpu03"].replace("State=IDLE+DRAIN ", "State=IDLE*+DRAIN ")
    assert slurm_maintenance(drained).startswith("slurm IDLE*+DRAIN: swap PSU 2")
    reserved = RECORDS["gpu01"].replace("State=MIXED ", "State=MIXED+MAINT+RESERVED ")
    assert slurm_maintenance(reserved) == "slurm MIXED+MAINT+RESERVED"


def test_slurm_reader_runs_scontrol_for_its_node_and_an_unreadable_answer_is_a_source_failure() -> None:
    asked: list[Sequence[str]] = []

    def runner(argv: Sequence[str], timeout_s: float) -> str:
        asked.append(argv)
        return RECORDS.get(argv[-1], "slurm_load_node error: Invalid node name specified")

    assert SlurmNodeState("gpu03", 5, runner).maintenance().startswith("slurm IDLE+DRAIN")
    assert asked == [["scontrol", "show", "node", "gpu03"]]
    with pytest.raises(SourceUnavailable, match="no State="):
        SlurmNodeState("gpu99", 5, runner).maintenance()


def _node(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu01"}, "spec": spec}


def test_a_cordoned_kubernetes_node_is_out_of_service_and_names_its_other_taints() -> None:
    assert kubernetes_maintenance(_node({})) == ""
    tainted = {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    assert kubernetes_maintenance(_node(tainted)) == ""  # a taint alone is scheduling policy, not maintenance
    cordoned = {
        "unschedulable": True,
        "taints": [
            {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"},
            {"key": "nvsentinel.nvidia.com/quarantined", "value": "xid-79", "effect": "NoSchedule"},
        ],
    }
    assert kubernetes_maintenance(_node(cordoned)) == "kubernetes cordoned (taints: nvsentinel.nvidia.com/quarantined)"
    assert kubernetes_maintenance(_node({"unschedulable": True})) == "kubernetes cordoned"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiServer]:
    httpd: ThreadingHTTPServer = serve_api()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    yield ApiServer(f"http://127.0.0.1:{httpd.server_address[1]}", token, None, timeout_s=5)
    httpd.shutdown()
    httpd.server_close()


def test_kubernetes_reader_gets_its_node_from_the_api_server(api: ApiServer) -> None:
    assert KubernetesNodeState("gpu01", api).maintenance() == "kubernetes cordoned"
    with pytest.raises(SourceUnavailable, match="HTTP 404"):
        KubernetesNodeState("gpu77", api).maintenance()
