"""GPU references (index, uuid, MIG uuid, shared-GPU ids) resolved to uuids from nvidia-smi output and topology."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.topology import NodeTopology, TopologyGpu
from producers.context.inventory import GpuInventory, InventoryGpu
from tests import TESTDATA

DATA = TESTDATA


def test_nvidia_smi_list() -> None:
    inv = GpuInventory.parse((DATA / "context" / "nvidia-smi-L-8xH100.txt").read_text())
    assert len(inv) == 8
    assert inv.resolve("0") == "GPU-1d5e2f80-7c3a-4b8e-9f21-6a0b3c4d5e01"
    assert inv.resolve("7") == "GPU-1d5e2f80-7c3a-4b8e-9f21-6a0b3c4d5e08"
    assert inv.resolve("8") is None
    assert inv.resolve("GPU-1D5E2F80-7C3A-4B8E-9F21-6A0B3C4D5E03") == "GPU-1d5e2f80-7c3a-4b8e-9f21-6a0b3c4d5e03"
    # the NVIDIA device plugin's time-sliced replica of a GPU
    assert inv.resolve("GPU-1d5e2f80-7c3a-4b8e-9f21-6a0b3c4d5e03::2") == "GPU-1d5e2f80-7c3a-4b8e-9f21-6a0b3c4d5e03"
    assert inv.resolve("GPU-00000000-0000-0000-0000-000000000000") is None


def test_nvidia_smi_list_with_mig() -> None:
    inv = GpuInventory.parse((DATA / "context" / "nvidia-smi-L-a100-mig.txt").read_text())
    assert len(inv) == 5
    mig = inv.resolve("MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb")
    assert mig == "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb"
    assert [g.parent_uuid for g in inv.gpus if g.uuid == mig] == ["GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77"]
    # an index names the whole GPU, never one of its MIG instances
    assert inv.resolve("0") == "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77"
    assert inv.resolve("1") == "GPU-72e0c9a1-4fb2-8d63-a1d4-1f4e62b1a0c2"


def test_real_nvidia_smi_xml() -> None:
    inv = GpuInventory.parse((DATA / "nvidia-smi-xml" / "dual_2070-v13.xml").read_text())
    assert inv.uuids == ("GPU-12345678-aaaa-bbbb-cccc-0123456789ab", "GPU-12345678-aaaa-bbbb-cccc-0123456789cd")
    assert inv.resolve("1") == "GPU-12345678-aaaa-bbbb-cccc-0123456789cd"


def test_real_capture_with_a_duplicated_uuid_is_rejected() -> None:
    """dual_2080-v13.xml was anonymized with the same uuid on both GPUs: no inventory can be built from it."""
    with pytest.raises(ConfigError, match="appears twice"):
        GpuInventory.parse((DATA / "nvidia-smi-xml" / "dual_2080-v13.xml").read_text())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("GPU 0: NVIDIA H100 (UUID: GPU-a)\nsomething else\n", "line 2"),
        ("<nvidia_smi_log><gpu", "not nvidia-smi XML"),
        ("<nvidia_smi_log><gpu><uuid>N/A</uuid></gpu></nvidia_smi_log>", "no uuid"),
    ],
)
def test_malformed_inventory(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GpuInventory.parse(text)


def test_from_topology() -> None:
    topology = NodeTopology(
        "c",
        "n1",
        1,
        (
            TopologyGpu("GPU-a", 0, "A100", "0000:07:00.0"),
            TopologyGpu("MIG-x", 0, "A100 3g.20gb", "0000:07:00.0", parent_uuid="GPU-a"),
            TopologyGpu("GPU-b", 1, "A100", "0000:0f:00.0"),
        ),
    )
    inv = GpuInventory.from_topology(topology)
    assert inv.resolve("0") == "GPU-a" and inv.resolve("MIG-x") == "MIG-x" and inv.resolve("1") == "GPU-b"
    with pytest.raises(ConfigError, match="index 0 appears twice"):
        GpuInventory([InventoryGpu(0, "GPU-a"), InventoryGpu(0, "GPU-b")])
