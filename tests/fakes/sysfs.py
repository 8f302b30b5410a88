"""Build a sysfs tree in a temporary folder: PCI devices under /sys/devices, their /sys/bus/pci/devices links,
and InfiniBand ports under /sys/class/infiniband, with the files and formats the Linux kernel writes."""

from __future__ import annotations

import os
from pathlib import Path


def pci_device(root: Path, chain: list[str], numa: int, cpus: str) -> Path:
    """A device at the end of ``chain`` (host bridge ``pci0000:17``, then bridges, then the device)."""
    device = root / "devices" / Path(*chain)
    device.mkdir(parents=True)
    (device / "numa_node").write_text(f"{numa}\n")
    (device / "local_cpulist").write_text(f"{cpus}\n")
    link = root / "bus" / "pci" / "devices" / chain[-1]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(device, link.parent))
    return device


def ib_port(
    root: Path,
    device: str,
    pci: Path,
    port: int = 1,
    *,
    state: str = "4: ACTIVE",
    rate: str = "400 Gb/sec (4X NDR)",
    link_layer: str = "InfiniBand",
    counters: dict[str, int] | None = None,
) -> Path:
    """``/sys/class/infiniband/<device>/ports/<port>`` with state, rate, link_layer and counters/."""
    dev = root / "class" / "infiniband" / device
    if not (dev / "device").exists():
        dev.mkdir(parents=True, exist_ok=True)
        (dev / "device").symlink_to(os.path.relpath(pci, dev))
    path = dev / "ports" / str(port)
    (path / "counters").mkdir(parents=True, exist_ok=True)
    (path / "state").write_text(f"{state}\n")
    (path / "rate").write_text(f"{rate}\n")
    (path / "link_layer").write_text(f"{link_layer}\n")
    set_counters(path, counters or {})
    return path


def set_counters(port: Path, counters: dict[str, int]) -> None:
    for name, value in counters.items():
        (port / "counters" / name).write_text(f"{value}\n")
