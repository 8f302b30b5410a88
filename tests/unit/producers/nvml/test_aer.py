"""PCIe AER counters from sysfs: the parser on the kernel's own sample output (long and short error names), the
reader on a sysfs tree with a GPU and the switch port above it, and the collector's samples with and without them."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import pytest

from producers.nvml.aer import AerReader, aer_total
from producers.nvml.collector import NvmlCollector
from producers.nvml.replay import ReplayNvml
from tests.fakes.nvml import load_capture
from tests.fakes.sysfs import pci_device
from tests.unit.producers.nvml.test_collector import T0, _a100_with_mig

AER = Path(__file__).resolve().parents[3] / "testdata" / "linux-pci-aer-stats"
FILES = ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")
#: drivers/pci/pcie/aer.c (02a06f5f): the names newer kernels print, by the bit the ABI sample's long names stand for
SHORT = {
    "Receiver Error": "RxErr", "Bad TLP": "BadTLP", "Bad DLLP": "BadDLLP", "RELAY_NUM Rollover": "Rollover",
    "Replay Timer Timeout": "Timeout", "Advisory Non-Fatal": "NonFatalErr", "Corrected Internal Error": "CorrIntErr",
    "Header Log Overflow": "HeaderOF",
}  # fmt: skip
#: a GPU behind a PCIe switch: host bridge, root port, switch upstream and downstream ports, the GPU
SWITCH = ["pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0"]
GPU_BUS = "0000:1a:00.0"


def _short_names(text: str) -> str:
    out = []
    for line in text.splitlines():
        name, _, count = line.rpartition(" ")
        out.append(f"{SHORT.get(name, name)} {count}")
    return "\n".join(out) + "\n"


def test_the_total_line_of_the_kernels_sample_output() -> None:
    assert aer_total((AER / "aer_dev_correctable").read_bytes(), b"TOTAL_ERR_COR") == 2
    assert aer_total((AER / "aer_dev_nonfatal").read_bytes(), b"TOTAL_ERR_NONFATAL") == 0
    assert aer_total((AER / "aer_dev_fatal").read_bytes(), b"TOTAL_ERR_FATAL") == 0
    # the per-error lines are not totals, whatever their names hold ("Advisory Non-Fatal 0")
    assert aer_total((AER / "aer_dev_correctable").read_bytes(), b"TOTAL_ERR_FATAL") is None


def test_newer_kernels_short_names_and_unnamed_bits_parse_the_same() -> None:
    short = _short_names((AER / "aer_dev_correctable").read_text())
    assert short.startswith("RxErr 2\nBadTLP 0\n") and "HeaderOF 0" in short
    assert aer_total(short.encode(), b"TOTAL_ERR_COR") == 2
    # aer.c prints a set bit without a name as "<array>_bit[<n>] <count>" before the total
    unnamed = short.replace("TOTAL_ERR_COR", "dev_cor_errs_bit[16] 1\nTOTAL_ERR_COR")
    assert aer_total(unnamed.encode(), b"TOTAL_ERR_COR") == 2


@pytest.mark.parametrize("text", [b"", b"TOTAL_ERR_COR", b"TOTAL_ERR_COR -1", b"TOTAL_ERR_COR x"])
def test_a_file_without_a_readable_total_has_none(text: bytes) -> None:
    assert aer_total(text, b"TOTAL_ERR_COR") is None


def _tree(root: Path, *, gpu_files: bool = True, port_files: bool = True) -> Path:
    """The GPU and its switch downstream port, each with the kernel's sample files where asked."""
    gpu = pci_device(root, [*SWITCH, GPU_BUS], 0, "0-31")
    for folder, wanted in ((gpu, gpu_files), (gpu.parent, port_files)):
        if wanted:
            for name in FILES:
                shutil.copy(AER / name, folder / name)
    return gpu


def _set_total(folder: Path, name: str, total: int) -> None:
    path = folder / name
    head, _, _ = path.read_text().rstrip("\n").rpartition("\n")
    path.write_text(
        f"{head}\nTOTAL_ERR_{name.removeprefix('aer_dev_').upper().replace('CORRECTABLE', 'COR')} {total}\n"
    )


def test_the_gpus_counts_and_its_upstream_ports_are_summed(tmp_path: Path) -> None:
    gpu = _tree(tmp_path)
    reader = AerReader(tmp_path)
    assert reader.read(GPU_BUS) == {"pcie_aer_correctable_total": 4.0, "pcie_aer_uncorrectable_total": 0.0}
    # the link partner counts what the GPU never saw (the kernel's ABI document): the sum follows it
    _set_total(gpu.parent, "aer_dev_correctable", 502)
    _set_total(gpu.parent, "aer_dev_nonfatal", 1)
    _set_total(gpu, "aer_dev_fatal", 3)
    assert reader.read(GPU_BUS) == {"pcie_aer_correctable_total": 504.0, "pcie_aer_uncorrectable_total": 4.0}


def test_a_gpu_without_a_port_above_it_counts_its_own(tmp_path: Path) -> None:
    # a VM's passed-through GPU sits right on its host bridge: no PCI device above it
    gpu = pci_device(tmp_path, ["pci0000:00", "0000:00:05.0"], 0, "0-3")
    for name in FILES:
        shutil.copy(AER / name, gpu / name)
    assert AerReader(tmp_path).read("0000:00:05.0") == {
        "pcie_aer_correctable_total": 2.0,
        "pcie_aer_uncorrectable_total": 0.0,
    }


def test_only_the_port_has_counters(tmp_path: Path) -> None:
    _tree(tmp_path, gpu_files=False)
    assert AerReader(tmp_path).read(GPU_BUS)["pcie_aer_correctable_total"] == 2.0


def test_no_aer_files_leave_the_fields_absent_and_say_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _tree(tmp_path, gpu_files=False, port_files=False)
    reader = AerReader(tmp_path)
    with caplog.at_level(logging.INFO, logger="producers.nvml.aer"):
        assert [reader.read(GPU_BUS) for _ in range(3)] == [{}, {}, {}]
        assert reader.read("0000:99:00.0") == {}  # no such device at all (not Linux, no /sys in a container)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "AER fields left out" in said[0], said


def test_a_file_that_cannot_be_read_leaves_the_gpu_out_for_that_round(tmp_path: Path) -> None:
    gpu = _tree(tmp_path)
    reader = AerReader(tmp_path)
    reader.read(GPU_BUS)
    # the port's attribute answers nothing this round (a device being reset): never a partial sum, which the next
    # round would see as a burst of errors; the files are opened anew next round
    saved = (gpu.parent / "aer_dev_correctable").read_text()
    (gpu.parent / "aer_dev_correctable").write_text("")
    assert reader.read(GPU_BUS) == {}
    (gpu.parent / "aer_dev_correctable").write_text(saved)
    assert reader.read(GPU_BUS) == {"pcie_aer_correctable_total": 4.0, "pcie_aer_uncorrectable_total": 0.0}
    reader.close()


def test_the_collector_adds_them_to_each_gpus_sample(tmp_path: Path) -> None:
    captured = dataclasses.replace(load_capture("a10g.xml")[0], pci_bus_id="00000000:1A:00.0")
    _tree(tmp_path)
    collector = NvmlCollector(ReplayNvml([captured]), "dc1", "n1", aer=AerReader(tmp_path))
    collector.open()
    sample = collector.collect(T0)[0][0]
    assert sample.metrics["pcie_aer_correctable_total"] == 4.0
    assert sample.metrics["pcie_aer_uncorrectable_total"] == 0.0
    plain = NvmlCollector(ReplayNvml([captured]), "dc1", "n1")
    plain.open()
    assert "pcie_aer_correctable_total" not in plain.collect(T0)[0][0].metrics


def test_a_mig_instance_shares_its_gpus_link_and_carries_no_counts_of_its_own(tmp_path: Path) -> None:
    pci_device(tmp_path, ["pci0000:00", "0000:00:01.0", "0000:07:00.0"], 0, "0-3")
    for folder in (
        tmp_path / "devices/pci0000:00/0000:00:01.0",
        tmp_path / "devices/pci0000:00/0000:00:01.0/0000:07:00.0",
    ):
        for name in FILES:
            shutil.copy(AER / name, folder / name)
    collector = NvmlCollector(_a100_with_mig(), "dc1", "n1", aer=AerReader(tmp_path))
    collector.open()
    samples = collector.collect(T0)[0]
    assert [s.metrics.get("pcie_aer_correctable_total") for s in samples] == [4.0, None, None]
