"""dcgm-exporter scrapes of each generation (4.8.x, 4.9.0, 4.10.0, and a scrape of both), built from real captures
for the unit and integration tests of the name mapping; ``tests/testdata/dcgm-exporter/README.md`` says what is
real (the counters files, the captures' values) and what is built (the renamed text of 4.9.0 and 4.10.0).

Independent of :mod:`producers.dcgm_names` on purpose: the units come from the real counters file's help text and
this module's own table, the renames from ``renames.csv``, so a wrong row of the mapping shows as a wrong value.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from producers.dcgm_exporter import PromSample, parse_exposition
from tests import TESTDATA

DATA: Final = TESTDATA / "dcgm-exporter"
COUNTERS: Final = DATA / "4.5.3-4.8.2"
CONFORMANCE: Final = TESTDATA / "dcgm-exporter-cncf-ai-conformance"
#: real scrapes of exporter 4.x (legacy names): a Tesla T4 under load and an idle L40S
T4: Final = CONFORMANCE / "ericsson_t4_under_load.prom"
L40S: Final = CONFORMANCE / "upcloud_l40s.prom"
TAGS: Final = ("4.8.2", "4.9.0", "4.10.0")

#: a unit's 1 in SI (this module's own, not the mapping's)
SI: Final = {"MHz": 1e6, "Hz": 1.0, "mJ": 1e-3, "J": 1.0, "%": 0.01, "ratio": 1.0, "MiB": 2.0**20, "B": 1.0,
             "MB/s": 1e6, "B/s": 1.0, "W": 1.0, "C": 1.0, "1": 1.0}  # fmt: skip
#: the schema's unit by the suffix of a field's name (pipeline/events.py)
_SUFFIX: Final = (("_bytes_per_second", "B/s"), ("_bytes", "B"), ("_mhz", "MHz"), ("_joules", "J"),
                  ("_percent", "%"), ("_watts", "W"), ("_celsius", "C"))  # fmt: skip
#: the help text's unit of 4.8.2's counters files
_HELP_UNITS: Final = {"MHz": "MHz", "C": "C", "W": "W", "mJ": "mJ", "%": "%", "MiB": "MiB"}

#: what each legacy metric of the default counters means in the schema (written from dcgm-exporter's help texts)
LEGACY_FIELDS: Final = {
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz", "DCGM_FI_DEV_MEM_CLOCK": "memory_clock_mhz",
    "DCGM_FI_DEV_MEMORY_TEMP": "temperature_memory_celsius", "DCGM_FI_DEV_GPU_TEMP": "temperature_gpu_celsius",
    "DCGM_FI_DEV_POWER_USAGE": "power_watts", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_joules",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_total", "DCGM_FI_DEV_GPU_UTIL": "utilization_gpu_percent",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "utilization_memory_percent", "DCGM_FI_DEV_FB_USED": "memory_used_bytes",
    "DCGM_FI_DEV_FB_RESERVED": "memory_reserved_bytes",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "row_remap_uncorrectable_total",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "row_remap_correctable_total",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active_percent",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active_percent", "DCGM_FI_PROF_PCIE_TX_BYTES": "pcie_tx_bytes_per_second",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "pcie_rx_bytes_per_second",
}  # fmt: skip
#: default counters with no place in the schema (the mapping counts them as ignored)
LEGACY_IGNORED: Final = frozenset({"DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
                                   "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Rename:
    release: str
    old: str
    old_unit: str
    new: str
    new_unit: str
    source: str


def renames() -> list[Rename]:
    with (DATA / "renames.csv").open(newline="") as f:
        return [
            Rename(r["release"], r["old_name"], r["old_unit"], r["new_name"], r["new_unit"], r["source"])
            for r in csv.DictReader(f)
        ]


def aliases() -> set[tuple[str, str]]:
    """DCGM v4.6.0's (deprecated name, new name) pairs."""
    with (DATA / "dcgm-4.6.0" / "deprecated-field-aliases.csv").open(newline="") as f:
        return {(r["old_name"], r["new_name"]) for r in csv.DictReader(f)}


def counter_rows(name: str = "default-counters.csv") -> dict[str, tuple[str, str, bool]]:
    """4.8.2's counters file: metric -> (type, unit from its help text, enabled); commented rows are the optional
    examples it ships."""
    out: dict[str, tuple[str, str, bool]] = {}
    for line in (COUNTERS / name).read_text().splitlines():
        match = re.match(r"^(#\s*)?(DCGM_FI_[A-Z0-9_]+)\s*,\s*(\w+)\s*,\s*(.*)$", line)
        if match is None:
            continue
        help_text = match.group(4)
        found = re.search(r"\(in (\w+|%)\)", help_text)
        unit = _HELP_UNITS.get(found.group(1), "1") if found else "1"
        if re.match(r"(the )?ratio of", help_text, re.IGNORECASE):
            unit = "ratio"
        elif "bytes per second" in help_text:
            unit = "B/s"
        enabled = match.group(1) is None
        if enabled or match.group(2) not in out:  # an enabled row over a commented example of the same field
            out[match.group(2)] = (match.group(3), unit, enabled)
    return out


def schema_unit(field: str) -> str:
    return next((unit for suffix, unit in _SUFFIX if field.endswith(suffix)), "1")


def in_schema(value: float, unit: str, field: str) -> float:
    """``value`` in ``unit`` expressed in ``field``'s unit."""
    return value * SI[unit] / SI[schema_unit(field)]


def capture(path: Path) -> list[PromSample]:
    """A real scrape's samples that 4.8.2's default counters enable."""
    enabled = {m for m, (_, _, on) in counter_rows().items() if on}
    return [s for s in parse_exposition(path.read_text()) if s.name in enabled]


_LABELS_490: Final = {"DCGM_FI_DRIVER_VERSION": "DCGM_FI_SYSTEM_DRIVER_VERSION", "Hostname": "hostname"}
_LABELS_483: Final = {"Hostname": "hostname"}


def as_generation(samples: list[PromSample], tag: str) -> list[PromSample]:
    """The samples as exporter ``tag`` names them: renamed (4.9.0, then 4.10.0), values converted from the old unit
    to the new, and the labels renamed (``hostname`` from 4.8.3, the driver label from 4.9.0)."""
    steps = {"4.8.2": (), "4.9.0": ("4.9.0",), "4.10.0": ("4.9.0", "4.10.0")}[tag]
    table = {(r.release, r.old): r for r in renames()}
    labels_map = _LABELS_490 if steps else {}
    out = []
    for s in samples:
        name, value = s.name, s.value
        for release in steps:
            rename = table.get((release, name))
            if rename is not None:
                name, value = rename.new, value * SI[rename.old_unit] / SI[rename.new_unit]
        labels = {labels_map.get(k, k): v for k, v in s.labels.items()}
        out.append(PromSample(name, labels, value, s.line, s.ts_ms))
    return out


def exposition(samples: list[PromSample]) -> str:
    """Prometheus text of the samples, one line each."""
    lines = []
    for s in samples:
        labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
        stamp = "" if s.ts_ms is None else f" {s.ts_ms}"
        lines.append(f"{s.name}{{{labels}}} {s.value!r}{stamp}")
    return "\n".join(lines) + "\n"


def expected(samples: list[PromSample]) -> dict[str, dict[str, float]]:
    """Per GPU uuid, each mapped field of the legacy samples in the schema's unit, memory total included."""
    units = counter_rows()
    out: dict[str, dict[str, float]] = {}
    for s in samples:
        if s.name in LEGACY_FIELDS:
            field = LEGACY_FIELDS[s.name]
            out.setdefault(s.labels["UUID"], {})[field] = in_schema(s.value, units[s.name][1], field)
    mib = {(s.labels["UUID"], s.name): s.value for s in samples}
    for uuid, fields in out.items():
        parts = [mib.get((uuid, f"DCGM_FI_DEV_FB_{p}")) for p in ("USED", "FREE", "RESERVED")]
        if None not in parts:
            fields["memory_total_bytes"] = sum(p for p in parts if p is not None) * 2.0**20
    return out


def mid_upgrade() -> tuple[list[PromSample], int]:
    """One scrape of a site mid-upgrade: the T4 in 4.8.2's names, the L40S in 4.10.0's and, still there, in
    4.8.2's; the L40S's legacy series carry the T4's values, so one taken in place of the newer name shows. Returns
    the samples and how many of them are such legacy duplicates."""
    t4, l40s = capture(T4), capture(L40S)
    foreign = {s.name: s.value for s in t4}
    stale = [
        PromSample(s.name, s.labels, foreign.get(s.name, s.value), s.line) for s in l40s if s.name in LEGACY_FIELDS
    ]
    return t4 + as_generation(l40s, "4.10.0") + stale, len(stale)
