"""The kubelet's PodResources API (``v1.PodResourcesLister/List``): which pod's container holds which device.

This is how dcgm-exporter maps GPUs to pods: a gRPC call on the kubelet's unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``) returns every pod with, per container, the devices each
device plugin allocated (``resource_name`` ``nvidia.com/gpu`` or ``nvidia.com/mig-1g.10gb``, ``device_ids`` the
GPU or MIG uuids the NVIDIA device plugin hands out).

The three messages read here are decoded by hand from the protobuf wire format (field numbers from
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``); every other field (cpu ids, memory, topology, dynamic
resources) is skipped, so newer kubelets that add fields still decode. That keeps protobuf and generated code
out of the project; grpcio carries the bytes.

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; ... }
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc

from pipeline.errors import DecodeError, SourceUnavailable

LIST_METHOD: Final = "/v1.PodResourcesLister/List"

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise DecodeError("malformed", "truncated or overlong varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of one message; groups (wire types 3/4) are not protobuf 3."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise DecodeError("malformed", f"field {number} runs past the end of the message")
            value, pos = buf[pos : pos + size], pos + size
        elif wire in (_I64, _I32):
            width = 8 if wire == _I64 else 4
            if pos + width > len(buf):
                raise DecodeError("malformed", f"field {number} runs past the end of the message")
            value, pos = int.from_bytes(buf[pos : pos + width], "little"), pos + width
        else:
            raise DecodeError("malformed", f"unsupported wire type {wire} for field {number}")
        yield number, wire, value


def _text(value: int | bytes, what: str) -> str:
    if not isinstance(value, bytes):
        raise DecodeError("wrong_type", f"{what} must be a string")
    try:
        return value.decode()
    except UnicodeDecodeError as exc:
        raise DecodeError("wrong_type", f"{what} is not UTF-8") from exc


def _message(value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise DecodeError("wrong_type", f"{what} must be a message")
    return value


def _devices(buf: bytes) -> ContainerDevices:
    resource, ids = "", []
    for number, _, value in _fields(buf):
        if number == 1:
            resource = _text(value, "resource_name")
        elif number == 2:
            ids.append(_text(value, "device_ids"))
    return ContainerDevices(resource, tuple(ids))


def _container(buf: bytes) -> ContainerResources:
    name, devices = "", []
    for number, _, value in _fields(buf):
        if number == 1:
            name = _text(value, "container name")
        elif number == 2:
            devices.append(_devices(_message(value, "devices")))
    return ContainerResources(name, tuple(devices))


def _pod(buf: bytes) -> PodResources:
    name, namespace, containers = "", "", []
    for number, _, value in _fields(buf):
        if number == 1:
            name = _text(value, "pod name")
        elif number == 2:
            namespace = _text(value, "pod namespace")
        elif number == 3:
            containers.append(_container(_message(value, "containers")))
    return PodResources(name, namespace, tuple(containers))


def decode_list_response(data: bytes) -> tuple[PodResources, ...]:
    """Decode a ``ListPodResourcesResponse``; raises DecodeError when the bytes are not one."""
    return tuple(_pod(_message(value, "pod_resources")) for number, _, value in _fields(data) if number == 1)


class PodResourcesClient:
    """A gRPC client of the kubelet's socket; every failure (socket missing, kubelet restarting) is transient."""

    def __init__(self, socket_path: Path, timeout_s: float = 10.0) -> None:
        self.socket_path, self.timeout_s = socket_path, timeout_s
        self._channel: grpc.Channel | None = None
        self._call: Any = None

    def list(self) -> tuple[PodResources, ...]:
        if self._channel is None:
            # 16 MiB: a node with hundreds of pods stays well below, the default 4 MiB could not be reached either
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket_path}", options=[("grpc.max_receive_message_length", 16 * 2**20)]
            )
            self._call = self._channel.unary_unary(
                LIST_METHOD, request_serializer=lambda _: b"", response_deserializer=None
            )
        try:
            raw: bytes = self._call(None, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            self.close()
            raise SourceUnavailable(f"kubelet pod-resources at {self.socket_path}: {exc.code().name}") from exc
        try:
            return decode_list_response(raw)
        except DecodeError as exc:
            raise SourceUnavailable(f"kubelet pod-resources answer does not decode: {exc.detail}") from exc

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._call = None
