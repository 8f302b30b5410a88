"""The GPUs of one node: how a source's GPU reference (an index, a ``GPU-`` or ``MIG-`` uuid) becomes a uuid.

Schedulers name GPUs differently: Slurm by index (``SLURM_JOB_GPUS=0,1``, ``GRES=gpu:4(IDX:0-3)``), the NVIDIA
device plugin by uuid (or ``GPU-...::2`` for a time-sliced replica), CUDA by either. The context topic is keyed
by uuid, so every source resolves through one :class:`GpuInventory` of the node. It is built from what the
node agent already knows (a :class:`~pipeline.topology.NodeTopology` from the collector) or from ``nvidia-smi``
output (``-L`` text or ``-q -x`` XML).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from pipeline.errors import ConfigError
from pipeline.topology import NodeTopology

_GPU_LINE: Final = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)\s]+)\)\s*$")
_MIG_LINE: Final = re.compile(r"^\s+MIG .*\(UUID: (MIG-[^)\s]+)\)\s*$")


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    """A GPU (``parent_uuid`` None) or a MIG instance of one."""

    index: int
    uuid: str
    parent_uuid: str | None = None


class GpuInventory:
    """Index and uuid lookup for one node's GPUs; immutable once built."""

    def __init__(self, gpus: Iterable[InventoryGpu]) -> None:
        self.gpus = tuple(gpus)
        self._by_uuid: dict[str, str] = {}
        self._by_index: dict[int, str] = {}
        for gpu in self.gpus:
            if gpu.uuid.lower() in self._by_uuid:
                raise ConfigError(f"invalid GPU inventory: uuid {gpu.uuid} appears twice")
            self._by_uuid[gpu.uuid.lower()] = gpu.uuid
            if gpu.parent_uuid is None:
                if gpu.index in self._by_index:
                    raise ConfigError(f"invalid GPU inventory: index {gpu.index} appears twice")
                self._by_index[gpu.index] = gpu.uuid

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(g.uuid for g in self.gpus)

    def __len__(self) -> int:
        return len(self.gpus)

    def resolve(self, ref: str) -> str | None:
        """The uuid a reference names on this node, or None when it names nothing here.

        Accepts an index (``"3"``), a uuid in any case, and the device plugin's shared-GPU form ``uuid::n``.
        """
        ref = ref.strip().split("::", 1)[0]
        if ref.isdigit():
            return self._by_index.get(int(ref))
        return self._by_uuid.get(ref.lower())

    @classmethod
    def from_topology(cls, topology: NodeTopology) -> GpuInventory:
        return cls(InventoryGpu(g.index, g.uuid, g.parent_uuid) for g in topology.gpus)

    @classmethod
    def from_nvidia_smi_list(cls, text: str) -> GpuInventory:
        """From ``nvidia-smi -L``: ``GPU 0: NVIDIA A100 ... (UUID: GPU-...)``, MIG lines indented below it."""
        gpus: list[InventoryGpu] = []
        parent: InventoryGpu | None = None
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if m := _GPU_LINE.match(line):
                parent = InventoryGpu(int(m[1]), m[2])
                gpus.append(parent)
            elif (m := _MIG_LINE.match(line)) and parent is not None:
                gpus.append(InventoryGpu(parent.index, m[1], parent.uuid))
            else:
                raise ConfigError(f"invalid GPU inventory: line {number} is not `nvidia-smi -L` output: {line!r}")
        return cls(gpus)

    @classmethod
    def from_nvidia_smi_xml(cls, text: str) -> GpuInventory:
        """From ``nvidia-smi -q -x``: one ``<gpu>`` per device in NVML (PCI bus) order, which is the index."""
        try:
            root = ET.fromstring(text)
        except ET.ParseError as exc:
            raise ConfigError(f"invalid GPU inventory: not nvidia-smi XML ({exc})") from exc
        gpus = []
        for index, gpu in enumerate(root.iter("gpu")):
            uuid = (gpu.findtext("uuid") or "").strip()
            if not uuid.startswith("GPU-"):
                raise ConfigError(f"invalid GPU inventory: GPU {index} has no uuid")
            gpus.append(InventoryGpu(index, uuid))
        return cls(gpus)

    @classmethod
    def parse(cls, text: str) -> GpuInventory:
        """Either nvidia-smi format, told apart by the first character."""
        if text.lstrip().startswith("<"):
            return cls.from_nvidia_smi_xml(text)
        return cls.from_nvidia_smi_list(text)
