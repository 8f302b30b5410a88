"""InfiniBand / RoCE port counters from sysfs (``/sys/class/infiniband/<dev>/ports/<n>/...``) as :class:`NicSample`.

Emits per port and round: ``port_state_active`` (state ``4: ACTIVE``), ``rate_gbps`` (``400 Gb/sec (4X NDR)``),
byte and packet rates from the deltas of ``counters/port_{xmit,rcv}_{data,packets}`` (``*_data`` counts octets
divided by 4, per the kernel's Documentation/ABI/stable/sysfs-class-infiniband, so bytes = 4 x the counter), and
the error totals ``symbol_error``, ``link_downed``, ``link_error_recovery``, ``port_rcv_errors``,
``port_xmit_discards``. A counter a driver does not provide (or that fails to read) is absent; the first round
has no rates. ``hw_counters/`` (vendor-specific: congestion, out-of-buffer...) has no field in the schema yet
and is not read. The sysfs root is injectable, so tests run on a tree built in a temporary folder.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Final

from pipeline.events import NicSample
from pipeline.topology import TopologyNic
from producers.rates import CounterRates

log = logging.getLogger(__name__)

#: counter file -> (NIC field, bytes per unit); a rate when the field ends in _per_second
COUNTERS: Final[dict[str, tuple[str, float]]] = {
    "port_xmit_data": ("tx_bytes_per_second", 4.0),
    "port_rcv_data": ("rx_bytes_per_second", 4.0),
    "port_xmit_packets": ("tx_packets_per_second", 1.0),
    "port_rcv_packets": ("rx_packets_per_second", 1.0),
    "symbol_error": ("symbol_errors_total", 1.0),
    "link_downed": ("link_downed_total", 1.0),
    "link_error_recovery": ("link_error_recovery_total", 1.0),
    "port_rcv_errors": ("rcv_errors_total", 1.0),
    "port_xmit_discards": ("xmit_discards_total", 1.0),
}
_RATE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # missing file, or a counter the driver refuses to read (EINVAL)
        return None


def parse_rate_gbps(text: str | None) -> float | None:
    """``400 Gb/sec (4X NDR)`` -> 400.0."""
    match = _RATE.match(text or "")
    return float(match.group(1)) if match else None


def parse_state_active(text: str | None) -> float | None:
    """``4: ACTIVE`` -> 1, any other state (``1: DOWN``, ``2: INIT``...) -> 0."""
    if not text:
        return None
    return float(text.split(":", 1)[-1].strip().upper() == "ACTIVE")


def _port_number(path: Path) -> int | None:
    return int(path.name) if path.name.isdigit() else None


class InfinibandReader:
    """Reads every port under ``<sysfs_root>/class/infiniband``; none there means no NICs (not an error)."""

    def __init__(self, sysfs_root: Path = Path("/sys")) -> None:
        self._root = sysfs_root
        self._dir = sysfs_root / "class" / "infiniband"
        self._rates = CounterRates()

    def ports(self) -> list[tuple[str, int, Path]]:
        if not self._dir.is_dir():
            return []
        out = []
        for device in sorted(self._dir.iterdir()):
            ports = device / "ports"
            if not ports.is_dir():
                continue
            for port in sorted(ports.iterdir(), key=lambda p: p.name):
                number = _port_number(port)
                if number is not None:
                    out.append((device.name, number, port))
        return out

    def read(self, cluster: str, node: str, ts_ns: int) -> tuple[NicSample, ...]:
        samples = []
        for device, port, path in self.ports():
            metrics: dict[str, float] = {}
            state = parse_state_active(_read(path / "state"))
            if state is not None:
                metrics["port_state_active"] = state
            rate = parse_rate_gbps(_read(path / "rate"))
            if rate is not None:
                metrics["rate_gbps"] = rate
            for counter, (name, scale) in COUNTERS.items():
                text = _read(path / "counters" / counter)
                if text is None or not text.isdigit():
                    continue
                value = int(text)
                if name.endswith("_per_second"):
                    per_second = self._rates.rate((device, port, counter), value, ts_ns, scale)
                    if per_second is not None:
                        metrics[name] = per_second
                else:
                    metrics[name] = float(value)
            samples.append(NicSample(cluster, node, device, port, ts_ns, metrics))
        return tuple(samples)

    def topology(self) -> tuple[TopologyNic, ...]:
        """Each port with the PCI address and NUMA node of its device (from the ``device`` link)."""
        nics = []
        for device, port, path in self.ports():
            dev_link = self._dir / device / "device"
            bus_id = os.path.basename(os.path.realpath(dev_link)) if dev_link.exists() else None
            numa = _read(dev_link / "numa_node")
            nics.append(
                TopologyNic(
                    device,
                    port,
                    bus_id,
                    int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
                    _read(path / "link_layer") or "InfiniBand",
                    parse_rate_gbps(_read(path / "rate")),
                )
            )
        return tuple(nics)

    def device_path(self, device: str) -> Path | None:
        """The PCI device folder of a NIC under /sys/devices (its realpath), for PCIe path comparisons."""
        link = self._dir / device / "device"
        return Path(os.path.realpath(link)) if link.exists() else None
