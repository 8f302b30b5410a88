"""PCIe AER (Advanced Error Reporting) counters of each GPU's link, from Linux sysfs.

Emits, per GPU, ``pcie_aer_correctable_total`` (``TOTAL_ERR_COR``) and ``pcie_aer_uncorrectable_total``
(``TOTAL_ERR_NONFATAL`` + ``TOTAL_ERR_FATAL``). The kernel (>= 4.19, Documentation/ABI/testing/
sysfs-bus-pci-devices-aer_stats) writes, under ``/sys/bus/pci/devices/<domain:bus:dev.fn>/``, the files
``aer_dev_correctable``, ``aer_dev_nonfatal`` and ``aer_dev_fatal``: one ``<name> <count>`` line per error bit (long
names such as "Receiver Error" before Linux 5.x, short ones such as "RxErr" since), then the ``TOTAL_ERR_*`` line,
the number of error messages the device sent, which is what is counted here.

The same document warns that the errors of a misbehaving endpoint may be counted at its *link partner* (the root
or switch port above it), the endpoint's own counters staying 0; so a GPU's counts are its own plus those of the
port above it (the parent directory of its resolved sysfs path, when that is a PCI device). NVML's bus id
(``00000000:3B:00.0``) reaches this module already in sysfs form (``0000:3b:00.0``, collector.sysfs_bus_id).

Absent stays absent: a GPU with no AER files on either side (no AER capability, not Linux, a container without
/sys, no permission) gets no fields, which is logged once per GPU, and its files are not looked for again.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger(__name__)

#: (file, its total line) for each of the two fields
_CORRECTABLE: Final = (("aer_dev_correctable", "TOTAL_ERR_COR"),)
_UNCORRECTABLE: Final = (("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"), ("aer_dev_fatal", "TOTAL_ERR_FATAL"))
#: a PCI device's directory name, ``domain:bus:device.function``
_BDF: Final = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def aer_total(text: bytes, total: bytes) -> int | None:
    """The count on an AER statistics file's ``total`` line (``TOTAL_ERR_COR 2`` -> 2); None when there is none.

    Pure. Every other line is ``<name> <count>``, the name possibly holding spaces, and is skipped. The kernel
    writes the total last, so that line is tried first (a third of the cost of splitting the file).
    """
    name, _, count = text.rstrip().rpartition(b"\n")[2].rpartition(b" ")
    if name == total and count.isdigit():
        return int(count)
    for line in text.splitlines():
        name, _, count = line.rstrip().rpartition(b" ")
        if name == total and count.isdigit():
            return int(count)
    return None


@dataclass(frozen=True, slots=True)
class _Files:
    """A GPU's AER files, open: (descriptor, total line) per field, on the GPU and on the port above it, those that
    exist."""

    correctable: tuple[tuple[int, bytes], ...]
    uncorrectable: tuple[tuple[int, bytes], ...]

    def close(self) -> None:
        for fd, _ in (*self.correctable, *self.uncorrectable):
            os.close(fd)


class AerReader:
    """Reads the AER counters of GPUs by their sysfs bus id under ``sysfs_root`` (``/sys``; a folder in tests).

    Each file is opened once and read again from its start every round (``pread`` at offset 0 makes sysfs write
    the attribute anew): opening six files per GPU every round cost 70 µs of CPU per GPU-sample, three times the
    rest of the collector (``python -m bench.collector``). :meth:`close` closes them.
    """

    def __init__(self, sysfs_root: Path = Path("/sys")) -> None:
        self._devices = sysfs_root / "bus" / "pci" / "devices"
        self._files: dict[str, _Files] = {}
        #: GPUs whose AER files were looked for (what was found is logged once per GPU)
        self._said: set[str] = set()

    def read(self, bus_id: str) -> dict[str, float]:
        """The two AER fields of the GPU at ``bus_id`` (``0000:3b:00.0``); {} where it has no AER files."""
        files = self._files.get(bus_id)
        if files is None:
            files = self._files[bus_id] = self._open(bus_id)
        out: dict[str, float] = {}
        for name, where in (
            ("pcie_aer_correctable_total", files.correctable),
            ("pcie_aer_uncorrectable_total", files.uncorrectable),
        ):
            if not where:
                continue
            total = _sum(where)
            if total is None:
                # gone (the device was reset or removed): left out this round, looked for again next round
                log.warning("GPU %s: its PCIe AER counters could not be read; left out this round", bus_id)
                files.close()
                del self._files[bus_id]
                return {}
            out[name] = float(total)
        return out

    def close(self) -> None:
        for files in self._files.values():
            files.close()
        self._files.clear()

    def _open(self, bus_id: str) -> _Files:
        """The AER files of the GPU and of its upstream port that exist, opened."""
        gpu = self._devices / bus_id
        dirs = [gpu]
        parent = Path(os.path.realpath(gpu)).parent
        if _BDF.match(parent.name):
            dirs.append(parent)
        found = {
            kind: [(d / f, t) for d in dirs for f, t in kinds]
            for kind, kinds in (("correctable", _CORRECTABLE), ("uncorrectable", _UNCORRECTABLE))
        }
        opened: dict[str, list[tuple[int, bytes]]] = {"correctable": [], "uncorrectable": []}
        for kind, paths in found.items():
            for path, total in paths:
                try:
                    opened[kind].append((os.open(path, os.O_RDONLY), total.encode()))
                except OSError:
                    continue  # no such file (no AER capability there), or not ours to read
        files = _Files(tuple(opened["correctable"]), tuple(opened["uncorrectable"]))
        if bus_id not in self._said:
            self._said.add(bus_id)
            if files.correctable or files.uncorrectable:
                log.info("GPU %s: PCIe AER counters from %s", bus_id, " and ".join(str(d) for d in dirs))
            else:
                log.info("GPU %s: no PCIe AER counters in %s or its upstream port: AER fields left out", bus_id, gpu)
        return files


def _sum(files: tuple[tuple[int, bytes], ...]) -> int | None:
    """The sum of the files' totals; None when one could not be read or parsed this time (never a partial sum, which
    the next round would see as a burst of errors)."""
    total = 0
    for fd, line in files:
        try:
            value = aer_total(os.pread(fd, 4096, 0), line)
        except OSError:
            return None
        if value is None:
            return None
        total += value
    return total
