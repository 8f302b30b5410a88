"""Stand-ins for a Kubernetes node, for the context tests: a kubelet pod-resources gRPC server on a unix socket
(responses encoded by hand from the protobuf wire-format rules) and an API server (a real local HTTP server)."""

from __future__ import annotations

import json
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import grpc

from producers.context.inventory import GpuInventory
from producers.context.podresources import ContainerDevices, ContainerResources, PodResources
from tests import TESTDATA

DATA = TESTDATA / "context"
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


#: node gpu01 as ``kubectl cordon gpu01`` leaves it (``spec.unschedulable`` and the taint the node controller adds)
NODE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu01", "labels": {"kubernetes.io/hostname": "gpu01"}},
    "spec": {"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
}


class ApiHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
        elif url.path == "/api/v1/pods" and query.get("fieldSelector") == ["spec.nodeName=gpu01"]:
            self.server.node_queries += 1  # type: ignore[attr-defined]
            self._send(200, PODS)
        elif url.path == "/api/v1/namespaces/ml/pods" and query.get("labelSelector") == [
            "training.kubeflow.org/job-name=llama-ft"
        ]:
            self.server.job_queries += 1  # type: ignore[attr-defined]
            self._send(200, JOB_PODS)
        elif url.path == "/api/v1/nodes/gpu01":
            self._send(200, NODE)
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


def serve_api() -> ThreadingHTTPServer:
    """The API server on a free loopback port, serving from a thread until ``shutdown()``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ApiHandler)
    httpd.job_queries = httpd.node_queries = 0  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd
