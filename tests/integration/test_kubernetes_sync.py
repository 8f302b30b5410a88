"""The Kubernetes hand-off against a real kube-apiserver on etcd (tests/kubeapi.py: both built from the Go module
proxy, as envtest runs them) and real Kafka: health records published on the health topic become node conditions
and DRA DeviceTaintRules (resource.k8s.io/v1) that the API server validated and stored, written by the controller
as the shipped service account (deploy/kubernetes/kubernetes-sync.yaml's ClusterRole, under RBAC), and they
follow the health as it changes. Not here: a kubelet, a scheduler or the DRA driver (the ResourceSlices are
written by the test as NVIDIA's driver publishes them), so what a taint does to pods is Kubernetes' part, untested."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from confluent_kafka import Producer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hermeneut.cli import cli
from pipeline.config import Settings
from sinks.kubernetes.api import NODES, RULES, SLICES, ApiError, Client, credentials
from sinks.kubernetes.plan import NO_SCHEDULE, NONE
from sinks.kubernetes.sync import Controller, run
from tests import kubeapi

pytestmark = pytest.mark.integration

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "kubernetes-sync.yaml"
DRIVER = "gpu.nvidia.com"
NODES_N, GPUS_N = 2, 8


def uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{gpu:012x}"


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory: pytest.TempPathFactory, defaults: Settings) -> Iterator[kubeapi.ApiServer]:
    server = kubeapi.start(defaults.services.cache_dir, tmp_path_factory.mktemp("kube"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def admin(apiserver: kubeapi.ApiServer) -> Client:
    return Client(credentials(apiserver.kubeconfig))


@pytest.fixture(scope="module")
def controller_kubeconfig(
    apiserver: kubeapi.ApiServer, admin: Client, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The shipped service account, role and binding applied; a kubeconfig with that account's token (TokenRequest)."""
    admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hermeneut"}})
    paths = {
        "ServiceAccount": "/api/v1/namespaces/hermeneut/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    }
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if doc["kind"] in paths:
            admin.create(paths[doc["kind"]], doc)
    answer = admin.create(
        "/api/v1/namespaces/hermeneut/serviceaccounts/hermeneut-kubernetes-sync/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    return apiserver.kubeconfig_for(answer["status"]["token"], tmp_path_factory.mktemp("sa") / "kubeconfig")


def cluster_of(admin: Client, prefix: str) -> None:
    """Nodes and the DRA driver's ResourceSlices, one pool per node, as NVIDIA's driver publishes them (a device
    per GPU, named gpu-<index>, with its uuid attribute)."""
    for n in range(NODES_N):
        node = f"{prefix}-n{n}"
        admin.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
        devices = [
            {"name": f"gpu-{g}", "attributes": {"uuid": {"string": uuid(n, g)}, "index": {"int": g}}}
            for g in range(GPUS_N)
        ]
        admin.create(
            SLICES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{DRIVER}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": node,
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                    "devices": devices,
                },
            },
        )


def publish(settings: Settings, prefix: str, states: dict[tuple[int, int], tuple[str, str]]) -> None:
    """One health record per GPU of the test's nodes: healthy unless ``states`` says (state, remedy)."""
    p = Producer(settings.kafka.client_config())
    for n in range(NODES_N):
        for g in range(GPUS_N):
            state, remedy = states.get((n, g), ("healthy", "none"))
            reasons = (
                []
                if state == "healthy"
                else [{"detector": "xid", "severity": "critical", "state": state, "remedy": remedy,
                       "since_ns": 10**18 + n * 100 + g, "summary": f"XID 79 on GPU {g}"}]
            )  # fmt: skip
            node, gpu = f"{prefix}-n{n}", uuid(n, g)
            record = {"cluster": settings.cluster, "node": node, "gpu": gpu, "state": state, "remedy": remedy,
                      "last_seen_ns": None, "reasons": reasons, "ts_ns": time.time_ns()}  # fmt: skip
            p.produce(settings.topics.health, key=f"{settings.cluster}/{node}/{gpu}", value=json.dumps(record))
    assert p.flush(10) == 0


def conditions(admin: Client, prefix: str, kind: str) -> dict[str, dict[str, Any]]:
    return {
        n["metadata"]["name"]: c
        for n in admin.list(NODES)
        if n["metadata"]["name"].startswith(prefix)
        for c in n.get("status", {}).get("conditions", [])
        if c["type"] == kind
    }


def rules(admin: Client, prefix: str) -> dict[str, dict[str, Any]]:
    return {
        r["metadata"]["labels"]["hermeneut.io/gpu"]: r
        for r in admin.list(RULES, "app.kubernetes.io/managed-by=hermeneut")
        if r["metadata"]["labels"]["hermeneut.io/node"].startswith(prefix)
    }


def sync_once(settings: Settings, kubeconfig: Path, dry_run: bool = False) -> Controller:
    c = Controller(settings, Client(credentials(kubeconfig)), dry_run=dry_run)
    run(settings, c, threading.Event(), once=True)
    return c


def test_conditions_and_taints_follow_health_written_as_the_shipped_service_account(
    settings: Settings, admin: Client, controller_kubeconfig: Path
) -> None:
    prefix = settings.cluster
    cluster_of(admin, prefix)
    kind = settings.kubernetes.condition_type
    publish(settings, prefix, {(0, 3): ("unhealthy", "reset GPU"), (1, 5): ("degraded", "none")})
    c = sync_once(settings, controller_kubeconfig)
    assert c.stats.write_errors == 0, c.stats.errors
    now = conditions(admin, prefix, kind)
    assert {n: (v["status"], v["reason"]) for n, v in now.items()} == {
        f"{prefix}-n0": ("False", "GPUUnhealthy"),
        f"{prefix}-n1": ("False", "GPUDegraded"),
    }
    assert (
        now[f"{prefix}-n0"]["message"]
        == f"1 of 8 GPUs unhealthy; {uuid(0, 3)} unhealthy: XID 79 on GPU 3 (remedy: reset GPU)"
    )
    found = rules(admin, prefix)
    assert set(found) == {uuid(0, 3), uuid(1, 5)}
    sick = found[uuid(0, 3)]["spec"]
    assert sick["deviceSelector"] == {"driver": DRIVER, "pool": f"{prefix}-n0", "device": "gpu-3"}
    assert (sick["taint"]["key"], sick["taint"]["value"], sick["taint"]["effect"]) == (
        "hermeneut.io/gpu-health",
        "unhealthy",
        NO_SCHEDULE,
    )
    assert sick["taint"]["timeAdded"]  # stamped by the API server: a real one stored it
    assert found[uuid(1, 5)]["spec"]["taint"]["effect"] == NONE
    assert found[uuid(0, 3)]["metadata"]["annotations"]["hermeneut.io/remedy"] == "reset GPU"
    first = now[f"{prefix}-n0"]["lastTransitionTime"]

    # in step: a second round writes nothing
    assert sync_once(settings, controller_kubeconfig).stats.conditions_written == 0

    # the GPU recovers, the degraded one turns unhealthy: its rule changes, the other's is deleted
    time.sleep(1.1)  # a second later, so a new transition time can differ
    publish(settings, prefix, {(1, 5): ("unhealthy", "drain")})
    c = sync_once(settings, controller_kubeconfig)
    assert (c.stats.rules_deleted, c.stats.rules_updated, c.stats.write_errors) == (1, 1, 0)
    found = rules(admin, prefix)
    assert set(found) == {uuid(1, 5)} and found[uuid(1, 5)]["spec"]["taint"]["effect"] == NO_SCHEDULE
    now = conditions(admin, prefix, kind)
    assert now[f"{prefix}-n0"]["status"] == "True" and now[f"{prefix}-n0"]["lastTransitionTime"] != first
    assert now[f"{prefix}-n1"]["reason"] == "GPUUnhealthy"


def test_the_breaker_holds_a_mass_failure_and_a_dry_run_writes_nothing(
    settings: Settings, admin: Client, controller_kubeconfig: Path
) -> None:
    prefix = settings.cluster
    cluster_of(admin, prefix)
    # a bad driver roll-out: 5 of the 16 GPUs unhealthy at once; 10 % of 16 is 1
    publish(settings, prefix, dict.fromkeys([(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)], ("unhealthy", "reset GPU")))
    dry = sync_once(settings, controller_kubeconfig, dry_run=True)
    assert dry.stats.held == 4 and rules(admin, prefix) == {}
    assert conditions(admin, prefix, settings.kubernetes.condition_type) == {}
    registry = CollectorRegistry()
    c = Controller(settings, Client(credentials(controller_kubeconfig)), registry=registry)
    run(settings, c, threading.Event(), once=True)
    effects = {gpu: r["spec"]["taint"]["effect"] for gpu, r in rules(admin, prefix).items()}
    assert sorted(effects.values()) == [NO_SCHEDULE, NONE, NONE, NONE, NONE]
    assert effects[uuid(0, 0)] == NO_SCHEDULE  # the longest unhealthy
    assert c.stats.held == 4
    # /metrics says what the round did: the same counters (one counter, two views)
    exposition = text_string_to_metric_families(generate_latest(registry).decode())
    scraped = {s.name: s.value for m in exposition for s in m.samples}
    assert scraped["hermeneut_kubernetes_held_gpus"] == 4
    assert scraped["hermeneut_kubernetes_taint_rules_created_total"] == 5
    assert scraped["hermeneut_kubernetes_rounds_total"] == 1
    assert scraped["hermeneut_kubernetes_write_errors_total"] == 0
    assert abs(scraped["hermeneut_kubernetes_last_round_timestamp_seconds"] - time.time()) < 60


def test_the_command_runs_a_dry_round_and_refuses_what_it_may_not_do(
    settings: Settings, admin: Client, controller_kubeconfig: Path, apiserver: kubeapi.ApiServer, tmp_path: Path
) -> None:
    prefix = settings.cluster
    cluster_of(admin, prefix)
    publish(settings, prefix, {(0, 7): ("unhealthy", "RMA")})
    args = ["kubernetes", "sync", "--once", "--dry-run", "--kubeconfig", str(controller_kubeconfig)]
    result = CliRunner().invoke(cli, [*args, "--metrics-port", "0"], obj={"settings": settings})
    assert result.exit_code == 0, result.output
    assert "kubernetes: metrics on http://127.0.0.1:" in result.output
    assert (
        f"would: taint {uuid(0, 7)} on {prefix}-n0: create hermeneut.io/gpu-health=unhealthy:NoSchedule"
        in result.output
    )
    assert rules(admin, prefix) == {}
    # a token without the role: the API server refuses, the command says so in one line and exits non-zero
    nobody = admin.create(
        "/api/v1/namespaces/hermeneut/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": f"nobody-{prefix}"}},
    )
    token = admin.create(
        f"/api/v1/namespaces/hermeneut/serviceaccounts/{nobody['metadata']['name']}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )["status"]["token"]
    weak = apiserver.kubeconfig_for(token, tmp_path / "weak")
    weak_args = ["kubernetes", "sync", "--once", "--metrics-port", "0", "--kubeconfig", str(weak)]
    result = CliRunner().invoke(cli, weak_args, obj={"settings": settings})
    assert result.exit_code == 1 and "403" in result.output and "forbidden" in result.output.lower()
    with pytest.raises(ApiError):
        Client(credentials(weak)).list(NODES).__next__()
