"""Kubernetes: the pod-resources wire format checked byte by byte against the protobuf encoding rules, a real
gRPC server on a unix socket standing in for the kubelet, and a real local HTTP server for the API server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc
import pytest

from pipeline.errors import ConfigError, DecodeError
from pipeline.events import Workload
from producers.context.base import Backoff, SourceUnavailable
from producers.context.inventory import GpuInventory
from producers.context.kubernetes import ApiServer, KubernetesSource, parse_pod
from producers.context.podresources import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    PodResourcesClient,
    decode_list_response,
)

DATA = Path(__file__).parents[1] / "testdata" / "context"
INVENTORY = GpuInventory.parse(
    (DATA / "nvidia-smi-L-8xH100.txt").read_text()
    + (DATA / "nvidia-smi-L-a100-mig.txt").read_text().replace("GPU 0", "GPU 8").replace("GPU 1:", "GPU 9:")
)
TOKEN = "test-token-7f3a"


def uuid(index: int) -> str:
    found = INVENTORY.resolve(str(index))
    assert found is not None
    return found


MIG = "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb"

# --- protobuf encoding, written from the wire-format rules (varint keys: field << 3 | wire type) ------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_pods(pods: list[PodResources]) -> bytes:
    out = b""
    for pod in pods:
        containers = b""
        for c in pod.containers:
            devices = b"".join(
                _field(2, _field(1, d.resource_name) + b"".join(_field(2, i) for i in d.device_ids)) for d in c.devices
            )
            containers += _field(3, _field(1, c.name) + devices)
        out += _field(1, _field(1, pod.name) + _field(2, pod.namespace) + containers)
    return out


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


class Kubelet:
    def __init__(self, socket: Path, pods: list[PodResources]) -> None:
        self.socket, self.pods = socket, pods
        self.server: Any = None

    def start(self) -> Kubelet:
        handler = grpc.unary_unary_rpc_method_handler(
            lambda _request, _context: encode_pods(self.pods),
            request_deserializer=lambda b: b,
            response_serializer=lambda b: b,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),)
        )
        self.server.add_insecure_port(f"unix://{self.socket}")
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(0).wait()


POD_RESOURCES = [
    PodResources(
        "vllm-qwen-6b7c9d-x2x9k",
        "assistant",
        (ContainerResources("vllm", (ContainerDevices("nvidia.com/gpu", (uuid(0), uuid(1))),)),),
    ),
    PodResources(
        "llama-ft-worker-1",
        "ml",
        (
            ContainerResources("istio-proxy", ()),
            ContainerResources(
                "pytorch",
                (
                    ContainerDevices("nvidia.com/gpu", (uuid(2), uuid(3), "GPU-ffffffff-0000-0000-0000-000000000000")),
                    ContainerDevices("rdma/ib", ("mlx5_0",)),
                ),
            ),
        ),
    ),
    PodResources(
        "notebook-ana", "ana", (ContainerResources("jupyter", (ContainerDevices("nvidia.com/mig-2g.10gb", (MIG,)),)),)
    ),
    PodResources(
        "shared-a", "dev", (ContainerResources("app", (ContainerDevices("nvidia.com/gpu", (f"{uuid(5)}::3",)),)),)
    ),
    PodResources("cpu-only", "dev", (ContainerResources("app", ()),)),
]


def _pod(namespace: str, name: str, node: str, container: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, **meta},
        "spec": {"nodeName": node, "containers": [container]},
        "status": {"phase": "Running"},
    }


def _gpus(n: int) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": str(n), "memory": "64Gi"}}


PODS = {
    "items": [
        _pod(
            "assistant",
            "vllm-qwen-6b7c9d-x2x9k",
            "gpu01",
            {
                "name": "vllm",
                "image": "vllm/vllm-openai:v0.6.3",
                "args": ["--model", "Qwen/Qwen2.5-72B-Instruct", "--tensor-parallel-size", "2"],
                "env": [{"name": "HF_TOKEN", "value": "hf_secret"}, {"name": "VLLM_PORT", "value": "8000"}],
                "resources": _gpus(2),
            },
            labels={"app": "vllm-qwen", "pod-template-hash": "6b7c9d"},
            ownerReferences=[{"kind": "ReplicaSet", "name": "vllm-qwen-6b7c9d"}],
        ),
        _pod(
            "ml",
            "llama-ft-worker-1",
            "gpu01",
            {
                "name": "pytorch",
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "command": ["torchrun", "--nproc_per_node=2", "train.py"],
                "resources": _gpus(2),
            },
            labels={"training.kubeflow.org/job-name": "llama-ft", "training.kubeflow.org/replica-type": "worker"},
            annotations={
                "hermeneut.dev/application": "llm-finetuning",
                "hermeneut.dev/model": "meta-llama/Llama-3.1-70B",
                "hermeneut.dev/user": "ana",
            },
        ),
        _pod(
            "ana",
            "notebook-ana",
            "gpu01",
            {
                "name": "jupyter",
                "image": "jupyter/pytorch-notebook:latest",
                "resources": {"limits": {"nvidia.com/mig-2g.10gb": 1}},
            },
            annotations={"hermeneut.dev/application": "notebook"},
        ),
        {"metadata": {}, "spec": {}},  # a broken item: skipped
    ]
}
JOB_PODS = {
    "items": [
        _pod("ml", f"llama-ft-worker-{i}", f"gpu0{i}", {"name": "pytorch", "resources": _gpus(2)}, labels={})
        for i in range(4)
    ]
    + [
        {
            **_pod("ml", "llama-ft-worker-old", "gpu09", {"name": "pytorch", "resources": _gpus(2)}),
            "status": {"phase": "Failed"},
        }
    ]
}


class ApiHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
        elif url.path == "/api/v1/pods" and query.get("fieldSelector") == ["spec.nodeName=gpu01"]:
            self._send(200, PODS)
        elif url.path == "/api/v1/namespaces/ml/pods" and query.get("labelSelector") == [
            "training.kubeflow.org/job-name=llama-ft"
        ]:
            self.server.job_queries += 1  # type: ignore[attr-defined]
            self._send(200, JOB_PODS)
        else:
            self._send(404, {"kind": "Status", "code": 404})

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[Kubelet]:
    server = Kubelet(tmp_path / "kubelet.sock", POD_RESOURCES).start()
    yield server
    server.stop()


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[ThreadingHTTPServer, ApiServer]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ApiHandler)
    httpd.job_queries = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
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
    assert len(client.list()) == len(POD_RESOURCES)
    client.close()


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
    assert source.poll() == before  # kubelet still answers; metadata is the last known
    now[0] = 1.0
    assert source.poll() == before  # within the backoff: the API server is not asked
    now[0] = 100.0
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
