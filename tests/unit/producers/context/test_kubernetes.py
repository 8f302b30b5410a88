"""Kubernetes: the pod-resources wire format checked byte by byte against the protobuf encoding rules, a real
gRPC server on a unix socket standing in for the kubelet, and a real local HTTP server for the API server."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import ConfigError, DecodeError, SourceUnavailable
from pipeline.events import Workload
from pipeline.services.stages import wait_for
from producers.context.base import Backoff
from producers.context.kubernetes import ApiServer, KubernetesSource, parse_pod
from producers.context.podresources import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesClient,
    decode_list_response,
)
from tests.fakes.kubernetes import INVENTORY, MIG, POD_RESOURCES, PODS, TOKEN, Kubelet, encode_pods, serve_api, uuid


def _response(extra_device: bytes = b"", extra_container: bytes = b"") -> bytes:
    """A ListPodResourcesResponse written byte by byte: (0a=field 1 LEN, 12=field 2 LEN, 1a=field 3 LEN)."""
    devices = b"\x0a\x0envidia.com/gpu" + b"\x12\x05GPU-a" + extra_device
    container = b"\x0a\x01c" + b"\x12" + bytes([len(devices)]) + devices + extra_container
    pod = b"\x0a\x03pod" + b"\x12\x02ns" + b"\x1a" + bytes([len(container)]) + container
    return b"\x0a" + bytes([len(pod)]) + pod


def test_wire_bytes_by_hand() -> None:
    expected = (
        PodResources("pod", "ns", (ContainerResources("c", (ContainerDevices("nvidia.com/gpu", ("GPU-a",)),)),)),
    )
    assert decode_list_response(_response()) == expected
    assert encode_pods(list(expected)) == _response()
    # fields of newer kubelets are skipped: ContainerDevices.topology {nodes {ID: 1}}, packed cpu_ids, memory
    newer = _response(b"\x1a\x04\x0a\x02\x08\x01", b"\x1a\x02\x01\x02" + b"\x22\x03\x08\x80\x01")
    assert decode_list_response(newer) == expected
    assert decode_list_response(b"") == ()


@pytest.mark.parametrize("payload", [b"\x0a\x05ab", b"\x0a", b"\x0b\x00", b"\x0a\x02\x0a\xff", b"\x80" * 11])
def test_malformed_wire_bytes(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_list_response(payload)


# --- a kubelet: a real gRPC server on a unix socket -----------------------------------------------------------


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    server = Kubelet(tmp_path / "kubelet.sock", POD_RESOURCES).start()
    yield server
    server.stop()


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[ThreadingHTTPServer, ApiServer]]:
    httpd = serve_api()
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    yield httpd, ApiServer(f"http://127.0.0.1:{httpd.server_address[1]}", token, None, timeout_s=5)
    httpd.shutdown()
    httpd.server_close()


def test_grpc_client_against_a_real_server(kubelet: Kubelet) -> None:
    client = PodResourcesClient(kubelet.socket, timeout_s=5)
    assert client.list() == tuple(POD_RESOURCES)
    kubelet.stop()
    with pytest.raises(SourceUnavailable, match="UNAVAILABLE"):
        client.list()
    kubelet.start()
    # the client reconnects at a later poll (context watch polls every few seconds): right after the restart gRPC
    # may still answer with the refused connection's error for a moment (a fresh-clone run met 'No such file')
    assert wait_for(lambda: _lists(client), 10), "the client did not reconnect to the restarted kubelet"
    assert len(client.list()) == len(POD_RESOURCES)
    client.close()


def _lists(client: PodResourcesClient) -> bool:
    try:
        client.list()
    except SourceUnavailable:
        return False
    return True


def test_missing_socket_is_transient(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="kubelet pod-resources"):
        PodResourcesClient(tmp_path / "none.sock", timeout_s=2).list()


def test_source_joins_kubelet_and_api_server(
    kubelet: Kubelet, api_server: tuple[Any, ApiServer], caplog: pytest.LogCaptureFixture
) -> None:
    httpd, api = api_server
    source = KubernetesSource("gpu01", INVENTORY, PodResourcesClient(kubelet.socket, 5), api)
    observed = source.poll()
    assert set(observed) == {uuid(0), uuid(1), uuid(2), uuid(3), MIG, uuid(5)}
    assert (
        observed[uuid(0)]
        == observed[uuid(1)]
        == Workload(
            "llm-serving",
            job_id="assistant/vllm-qwen-6b7c9d",
            source="kubernetes",
            confidence=0.6,
            tenant="assistant",
            model="Qwen/Qwen2.5-72B-Instruct",
            framework="vllm",
            job_gpus=2,
        )
    )
    assert observed[uuid(2)] == Workload(
        "llm-finetuning",
        job_id="ml/llama-ft",
        user="ana",
        source="kubernetes",
        confidence=0.95,
        tenant="ml",
        model="meta-llama/Llama-3.1-70B",
        framework="pytorch",
        job_gpus=8,  # four running workers with two GPUs each, the failed one not counted
    )
    notebook = observed[MIG]
    assert (notebook.application, notebook.job_id, notebook.tenant) == ("unknown", "ana/notebook-ana", "ana")
    # a pod the API server did not list (yet): job and tenant from the kubelet alone
    assert observed[uuid(5)] == Workload(
        "unknown", job_id="dev/shared-a", source="kubernetes", tenant="dev", job_gpus=1
    )
    messages = [r.getMessage() for r in caplog.records]
    assert any("'notebook' is not an application" in m for m in messages)
    assert any(
        "GPU-ffffffff-0000-0000-0000-000000000000 of pod ml/llama-ft-worker-1 is not a GPU" in m for m in messages
    )
    source.poll()
    assert httpd.job_queries == 1  # the job's GPU count is cached


def test_api_server_down_keeps_metadata_and_backs_off(
    kubelet: Kubelet, api_server: tuple[Any, ApiServer], caplog: pytest.LogCaptureFixture
) -> None:
    httpd, api = api_server
    now = [0.0]
    source = KubernetesSource(
        "gpu01",
        INVENTORY,
        PodResourcesClient(kubelet.socket, 5),
        api,
        Backoff(5, 60, clock=lambda: now[0]),
        clock=lambda: now[0],
    )
    before = source.poll()
    httpd.shutdown()
    httpd.server_close()
    api.timeout_s = 1
    now[0] = 61.0  # the metadata is due for a refresh: the API server is asked and does not answer
    assert source.poll() == before  # kubelet still answers; metadata is the last known
    assert source.backoff.failures == 1
    now[0] = 62.0
    assert source.poll() == before  # within the backoff: not asked
    assert source.backoff.failures == 1
    now[0] = 200.0
    assert source.poll() == before
    failures = [r for r in caplog.records if "keeping the pods' last known metadata" in r.getMessage()]
    assert len(failures) == 1 and source.backoff.failures == 2


def test_unauthorized_is_a_source_failure(api_server: tuple[Any, ApiServer], tmp_path: Path) -> None:
    _, api = api_server
    assert api.token_file is not None
    api.token_file.write_text("wrong")
    with pytest.raises(SourceUnavailable, match="HTTP 401"):
        api.node_pods("gpu01")


def test_kubelet_down_is_a_source_failure(tmp_path: Path) -> None:
    source = KubernetesSource("gpu01", INVENTORY, PodResourcesClient(tmp_path / "gone.sock", 2), None)
    with pytest.raises(SourceUnavailable):
        source.poll()


def test_in_cluster_needs_a_url_outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="HERMENEUT_CONTEXT__KUBERNETES_API"):
        ApiServer.in_cluster(None, None, None, 5)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    with pytest.raises(ConfigError, match=r"CA file /var/run/secrets/kubernetes\.io/serviceaccount/ca\.crt"):
        ApiServer.in_cluster(None, None, None, 5)


def test_parse_pod_reads_only_whitelisted_environment() -> None:
    pod = parse_pod(PODS["items"][0])
    assert pod.containers[0].env == ()  # HF_TOKEN is never read
    with pytest.raises(ValueError):
        parse_pod({"metadata": {}})


def test_api_server_is_asked_once_a_minute_or_for_a_new_pod(
    kubelet: Kubelet, api_server: tuple[Any, ApiServer]
) -> None:
    httpd, api = api_server
    now = [0.0]
    source = KubernetesSource("gpu01", INVENTORY, PodResourcesClient(kubelet.socket, 5), api, clock=lambda: now[0])
    source.poll()
    now[0] = 30.0
    source.poll()
    assert httpd.node_queries == 1  # shared-a is not listed by the API server: asked once, not on every poll
    kubelet.pods = [
        *POD_RESOURCES,
        PodResources("new", "dev", (ContainerResources("c", (ContainerDevices("nvidia.com/gpu", (uuid(6),)),)),)),
    ]
    source.poll()
    assert httpd.node_queries == 2  # a new GPU pod: described at once
    now[0] = 95.0
    source.poll()
    assert httpd.node_queries == 3  # a minute after the last answer
