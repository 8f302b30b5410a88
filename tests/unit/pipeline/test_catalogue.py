"""The catalogue against the real nvidia-smi captures it was seeded from, and name lookup."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from pipeline.catalogue import SPECS, GpuSpec, lookup, mig_profile
from pipeline.events import METRIC_FIELDS
from producers.nvml.capture import parse_mig_text
from tests import TESTDATA

CAPTURES = TESTDATA / "nvidia-smi-xml"
_FROM_XML = [s for s in SPECS if s.source.startswith("nvidia-smi-xml/")]


def _number(gpu: ET.Element, *paths: str) -> float | None:
    for path in paths:
        el = gpu.find(path)
        if el is not None and el.text and (m := re.match(r"\s*([\d.]+)", el.text)):
            return float(m.group(1))
    return None


@pytest.mark.parametrize("spec", _FROM_XML, ids=lambda s: s.name)
def test_entry_matches_its_capture(spec: GpuSpec) -> None:
    gpu = ET.parse(CAPTURES / spec.source.split("/", 1)[1]).getroot().findall("gpu")[0]
    readings = "power_readings" if gpu.find("power_readings") is not None else "gpu_power_readings"
    assert spec.memory_bytes == _number(gpu, "fb_memory_usage/total") * 2**20  # type: ignore[operator]
    assert spec.power_default_watts == _number(gpu, f"{readings}/default_power_limit")
    assert spec.power_min_watts == _number(gpu, f"{readings}/min_power_limit")
    assert spec.power_max_watts == _number(gpu, f"{readings}/max_power_limit")
    assert spec.sm_clock_max_mhz == _number(gpu, "max_clocks/sm_clock")
    assert spec.memory_clock_max_mhz == _number(gpu, "max_clocks/mem_clock")
    assert spec.slowdown_celsius == _number(gpu, "temperature/gpu_temp_slow_threshold")
    assert spec.shutdown_celsius == _number(gpu, "temperature/gpu_temp_max_threshold")
    assert spec.pcie_gen_max == _number(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen")
    assert spec.pcie_width_max == _number(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width")
    name = gpu.findtext("product_name", "").strip()
    assert lookup(name) is spec, name


def test_every_capture_with_limits_is_in_the_catalogue() -> None:
    for path in CAPTURES.glob("*.xml"):
        gpu = ET.parse(path).getroot().findall("gpu")[0]
        name = gpu.findtext("product_name", "").strip()
        if _number(gpu, "max_clocks/sm_clock"):  # the trimmed and the vGPU captures report no limits
            assert lookup(name) is not None, (path.name, name)


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        ("nvidia  h100 80gb hbm3 ", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA A100-SXM4-40GB"),
        ("Graphics Device", "NVIDIA GeForce GTX 1660 Ti"),
        ("GeForce GTX 1080 Ti", "NVIDIA GeForce GTX 1080 Ti"),
        ("Tesla V100-SXM2-32GB", "Tesla V100-SXM2-32GB"),
    ],
)
def test_lookup_tolerates_naming_variants(reported: str, expected: str) -> None:
    spec = lookup(reported)
    assert spec is not None and spec.name == expected


def test_unknown_model_is_none_not_a_guess() -> None:
    assert lookup("NVIDIA B300 Unreleased") is None


def test_limit_metrics_are_schema_limit_fields_within_range() -> None:
    specs = {f.name: f for f in METRIC_FIELDS}
    for spec in SPECS:
        for name, value in spec.limit_metrics().items():
            assert specs[name].limit, name
            assert specs[name].low <= value <= specs[name].high, (spec.name, name, value)


def test_mig_profiles_fit_their_board() -> None:
    for spec in SPECS:
        for profile in spec.mig_profiles:
            assert 1 <= profile.slices <= profile.of and profile.memory_bytes <= spec.memory_bytes, (spec.name, profile)


def test_every_mig_profile_nvidia_documents_is_there() -> None:
    """NVIDIA's MIG user guide, "Supported MIG Profiles": each board's GPU-instance profiles, by name; the memory in
    a name is the board's fraction of it (A100 40 GB 3g.20gb holds half the board: 20 GiB), rounded; where a real
    board was seen (H100, H200) the catalogue holds what it reported, up to 11 % less (H200 1g.18gb: 16 GiB)."""
    documented = {
        "NVIDIA A100-SXM4-40GB": "1g.5gb 1g.5gb+me 1g.10gb 2g.10gb 3g.20gb 4g.20gb 7g.40gb",
        "NVIDIA A100-SXM4-80GB": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
        "NVIDIA A30": "1g.6gb 1g.6gb+me 2g.12gb 2g.12gb+me 4g.24gb",
        "NVIDIA H100 80GB HBM3": "1g.10gb 1g.10gb+me 1g.20gb 2g.20gb 3g.40gb 4g.40gb 7g.80gb",
        "NVIDIA H200": "1g.18gb 1g.18gb+me 1g.35gb 2g.35gb 3g.71gb 4g.71gb 7g.141gb",
        "NVIDIA B200": "1g.23gb 1g.23gb+me 1g.45gb 2g.45gb 3g.90gb 4g.90gb 7g.180gb",
    }
    for model, names in documented.items():
        spec = lookup(model)
        assert spec is not None and [p.name for p in spec.mig_profiles] == names.split(), model
        for p in spec.mig_profiles:
            gb = float(p.name.split(".")[1].split("gb")[0])
            assert -0.12 * gb <= p.memory_bytes / 2**30 - gb <= 0.06 * gb, (model, p)
            assert p.compute_share == p.slices / (4 if model == "NVIDIA A30" else 7)


def test_a_real_h100_lists_the_mig_profiles_of_the_catalogue() -> None:
    """``nvidia-smi mig -lgip`` on the lent H100 (tests/testdata/nvml-h100-lent): the same profiles in the same order,
    each with the memory the catalogue holds, and as many instances of each as its compute slices and memory
    eighths allow (1g.10gb+me: one, it holds the one media-engine set)."""
    text = (TESTDATA / "nvml-h100-lent" / "nvidia-smi.txt").read_text()
    rows = re.findall(r"^\|\s+0\s+MIG (\S+)\s+\d+\s+(\d+)/(\d+)\s+([\d.]+)\s", text, re.MULTILINE)
    spec = lookup("NVIDIA H100 80GB HBM3")
    assert spec is not None and [name for name, *_ in rows] == [p.name for p in spec.mig_profiles]
    for (name, _free, total, gib), profile in zip(rows, spec.mig_profiles, strict=True):
        assert abs(profile.memory_bytes / 2**30 - float(gib)) <= 0.01, (name, gib)  # printed to 0.01 GiB
        fit = min(profile.of // profile.slices, round(spec.memory_bytes / profile.memory_bytes))
        assert int(total) == (1 if name.endswith("+me") else fit), name


def test_the_h100_entry_holds_the_limits_a_real_h100_reported() -> None:
    """The first reading of the lent H100 through the real NVML (tests/testdata/nvml-h100-lent)."""
    line = (TESTDATA / "nvml-h100-lent" / "readings.jsonl").read_text().splitlines()[0]
    real = json.loads(line)["samples"][0]["metrics"]
    spec = lookup("NVIDIA H100 80GB HBM3")
    assert spec is not None
    mine = spec.limit_metrics()
    for name in ("sm_clock_max_mhz", "memory_clock_max_mhz", "power_default_limit_watts",
                 "temperature_slowdown_celsius", "temperature_shutdown_celsius", "pcie_link_gen_max",
                 "pcie_link_width_max"):  # fmt: skip
        assert mine[name] == real[name], name


@pytest.mark.parametrize(
    ("model", "profile", "slices"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb", None),
        ("NVIDIA H200 MIG 1c.3g.71gb", "3g.71gb", 1),  # a compute instance of a 3g instance, as a real H200 lists it
        ("NVIDIA H200 MIG 2c.3g.71gb", "3g.71gb", 2),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me", "1g.5gb+me", None),
    ],
)
def test_a_mig_devices_model_names_its_profile(model: str, profile: str, slices: int | None) -> None:
    found = mig_profile(model)
    assert found is not None and (found[0].name, found[1]) == (profile, slices)


def test_unknown_mig_profiles_are_none() -> None:
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 5g.50gb") is None and mig_profile("NVIDIA H100 80GB HBM3") is None


def test_real_mig_instances_hold_the_catalogues_memory() -> None:
    """The MIG instances of a real H100 and H200 (tests/testdata/nvidia-smi-q-mig): each one's memory, as
    ``nvidia-smi -q`` reports it, is its profile's in the catalogue (a compute instance's: its GPU instance's)."""
    folder = TESTDATA / "nvidia-smi-q-mig"
    for board in ("nvidia-h100-mig", "nvidia-h200-mig"):
        listing = (folder / f"{board}-list.txt").read_text()
        migs = [m for ms in parse_mig_text(listing, (folder / f"{board}-idle-q.txt").read_text()).values() for m in ms]
        assert len(migs) >= 4
        for mig in migs:
            found = mig_profile(mig.name)
            assert found is not None and found[0].memory_bytes == mig.memory_total, mig.name
