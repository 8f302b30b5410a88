"""``nvidia-smi --query-gpu=... --format=csv`` logs as an importer (registered as ``nvidia-smi-csv``).

Any column subset and order, with or without units (``csv,nounits``) and with or without the header
(``csv,noheader``: then ``columns`` names the ``--query-gpu`` list). A header repeated inside a file (a log
appended to by several runs) is skipped. Emits one row per GPU and line with the METRIC_FIELDS the columns map
to (:data:`COLUMNS`, nvidia-smi's names as in ``nvidia-smi --help-query-gpu``, long and short forms), converted
to our units: a unit printed in the header or after the value wins (``81559 MiB``), else nvidia-smi's unit for
the field. ``[N/A]``, ``[Not Supported]``, ``[Requested functionality has been deprecated]``: the field is
absent. Identity: ``uuid``, else ``pci.bus_id``, else ``<node>-gpu<index>``; the GPU model from ``name``.
``timestamp`` is required: nvidia-smi prints local time without a zone (``2026/07/14 08:12:38.696``), so
``timezone`` says which (default UTC).

A log of several GPUs without ``index``, ``uuid`` or ``pci.bus_id`` (``--query-gpu=timestamp,power.draw,...``
on an 8-GPU node prints each time 8 times) cannot say which line is which GPU: :meth:`NvsmiCsvImporter.validate`
refuses it with one line naming the missing column and the fix, unless ``gpus_per_timestamp`` declares the
order nvidia-smi prints (each time's N lines are GPUs 0..N-1; a time with another number of lines is dead
letters, since which line is missing cannot be told). A log of one GPU (no time repeats) is ``<node>-gpu0``.

The file is read by :mod:`csv` alone (:func:`~producers.importers.parse.csv_records`: a quoted cell may hold a
line break, a form feed in a cell is part of the cell). A line a mapped column cannot read, a record the CSV
reader refuses (a field over its 131,072-character limit) and a time outside 1970..2262 make a dead letter
(``malformed``, with the line number, the column and the value); the file's other lines are imported. Columns no
field maps to are counted and named in the summary, never guessed at.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.registry import setting, with_options
from producers.importers.parse import (
    UNITS,
    BadValue,
    csv_records,
    csv_refusal,
    flag,
    gpu_index,
    number,
    timestamp_ns,
    zone,
)
from producers.importers.rows import Block, Rejection, Rows
from producers.source import check_names

#: nvidia-smi query field -> (our field, nvidia-smi's unit for it when the log has none, how to read the cell)
Reader = Callable[[str, float], float]


def _number(text: str, factor: float) -> float:
    return number(text, factor)


def _flag(text: str, _factor: float) -> float:
    return flag(text)


_MIB: Final = float(2**20)
COLUMNS: Final[dict[str, tuple[str, float, Reader]]] = {
    "utilization.gpu": ("utilization_gpu_percent", 1.0, _number),
    "utilization.memory": ("utilization_memory_percent", 1.0, _number),
    "memory.total": ("memory_total_bytes", _MIB, _number),
    "memory.used": ("memory_used_bytes", _MIB, _number),
    "memory.reserved": ("memory_reserved_bytes", _MIB, _number),
    "clocks.current.sm": ("sm_clock_mhz", 1.0, _number),
    "clocks.sm": ("sm_clock_mhz", 1.0, _number),
    "clocks.current.memory": ("memory_clock_mhz", 1.0, _number),
    "clocks.mem": ("memory_clock_mhz", 1.0, _number),
    "clocks.current.graphics": ("graphics_clock_mhz", 1.0, _number),
    "clocks.gr": ("graphics_clock_mhz", 1.0, _number),
    "clocks.max.sm": ("sm_clock_max_mhz", 1.0, _number),
    "clocks.max.memory": ("memory_clock_max_mhz", 1.0, _number),
    "clocks.max.mem": ("memory_clock_max_mhz", 1.0, _number),
    "clocks.max.graphics": ("graphics_clock_max_mhz", 1.0, _number),
    "clocks.max.gr": ("graphics_clock_max_mhz", 1.0, _number),
    "temperature.gpu": ("temperature_gpu_celsius", 1.0, _number),
    "temperature.memory": ("temperature_memory_celsius", 1.0, _number),
    # NVML's power usage: a 1 s average on Ampere and later, which newer drivers also print as power.draw.average
    "power.draw": ("power_watts", 1.0, _number),
    "power.draw.average": ("power_watts", 1.0, _number),
    "enforced.power.limit": ("power_limit_watts", 1.0, _number),
    "power.limit": ("power_limit_watts", 1.0, _number),
    "power.default_limit": ("power_default_limit_watts", 1.0, _number),
    "fan.speed": ("fan_speed_percent", 1.0, _number),
    "pstate": ("performance_state", 1.0, _number),
    "clocks_event_reasons.active": ("throttle_reasons_mask", 1.0, _number),
    "clocks_throttle_reasons.active": ("throttle_reasons_mask", 1.0, _number),
    "pcie.link.gen.current": ("pcie_link_gen", 1.0, _number),
    "pcie.link.gen.gpucurrent": ("pcie_link_gen", 1.0, _number),
    "pcie.link.gen.max": ("pcie_link_gen_max", 1.0, _number),
    "pcie.link.gen.gpumax": ("pcie_link_gen_max", 1.0, _number),
    "pcie.link.width.current": ("pcie_link_width", 1.0, _number),
    "pcie.link.width.max": ("pcie_link_width_max", 1.0, _number),
    "ecc.errors.corrected.aggregate.total": ("ecc_corrected_total", 1.0, _number),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_uncorrected_total", 1.0, _number),
    "retired_pages.single_bit_ecc.count": ("retired_pages_sbe_total", 1.0, _number),
    "retired_pages.double_bit.count": ("retired_pages_dbe_total", 1.0, _number),
    "retired_pages.pending": ("retired_pages_pending", 1.0, _flag),
    "remapped_rows.correctable": ("row_remap_correctable_total", 1.0, _number),
    "remapped_rows.uncorrectable": ("row_remap_uncorrectable_total", 1.0, _number),
    "remapped_rows.pending": ("row_remap_pending", 1.0, _flag),
    "remapped_rows.failure": ("row_remap_failure", 1.0, _flag),
}
#: where two columns give one field, the first wins (the enforced limit; a GPU's own link generation)
_PREFERRED: Final = ("enforced.power.limit", "pcie.link.gen.gpucurrent", "pcie.link.gen.gpumax", "power.draw.average")
_IDENTITY: Final = frozenset({"timestamp", "index", "uuid", "name", "pci.bus_id"})
#: the columns that tell the GPUs of one node apart
_GPU_ID: Final = ("index", "uuid", "pci.bus_id")


def _split_header(cell: str) -> tuple[str, str]:
    """``memory.used [MiB]`` -> (``memory.used``, ``MiB``)."""
    name, _, unit = cell.strip().partition(" [")
    return name.strip(), unit.rstrip("]").strip()


@dataclass(frozen=True)
class _Layout:
    """Which column is what, as a file's header (or the configured ``columns``) says."""

    names: tuple[str, ...]
    factors: tuple[float, ...]
    unmapped: tuple[str, ...]

    @classmethod
    def of(cls, header: list[str]) -> _Layout:
        names, factors, unmapped = [], [], []
        for cell in header:
            name, unit = _split_header(cell)
            spec = COLUMNS.get(name)
            # "[MiB]" in the header: the unit of every value below it (nounits logs carry it only there)
            factor = UNITS.get(unit.lower()) if unit else (spec[1] if spec else 1.0)
            if spec is not None and factor is None:
                spec, factor = None, 1.0  # a unit we do not know: not guessed at, named as unmapped
            names.append(name if spec is not None or name in _IDENTITY else f"?{name}")
            factors.append(factor or 1.0)
            if spec is None and name not in _IDENTITY:
                unmapped.append(cell.strip())
        if "timestamp" not in names:
            raise ConfigError("invalid configuration: nvidia-smi CSV: no timestamp column (query it with --query-gpu)")
        return cls(tuple(names), tuple(factors), tuple(unmapped))

    @property
    def identified(self) -> bool:
        """Whether each line names its GPU (an index, uuid or PCI bus id column)."""
        return any(name in self.names for name in _GPU_ID)


def _is_header(cells: list[str]) -> bool:
    return bool(cells) and cells[0].strip() == "timestamp"


def _time_cell(layout: _Layout, cells: list[str]) -> str:
    """The line's timestamp cell as written ('' when the line is short): what groups one round's lines."""
    at = layout.names.index("timestamp")
    return cells[at].strip() if at < len(cells) else ""


def unidentified_repeat(text: str, columns: str = "") -> tuple[int, int] | None:
    """The first (line, earlier line) of a log without a GPU identity column whose times are equal (several GPUs
    per time: which line is which GPU cannot be told); None when every line names its GPU or no time repeats."""
    layout = _Layout.of(columns.split(",")) if columns else None
    last: tuple[int, str] | None = None
    for line, cells, record in csv_records(text):
        if cells is None or not record.strip():
            continue
        if _is_header(cells):
            layout, last = _Layout.of(cells), None
            continue
        if layout is None or layout.identified:
            continue
        at = _time_cell(layout, cells)
        if last is not None and at and at == last[1]:
            return line, last[0]
        last = (line, at)
    return None


@dataclass(frozen=True, slots=True)
class NvsmiCsvConfig:
    """The ``nvidia-smi-csv`` importer's settings."""

    paths: tuple[Path, ...] = setting((), "nvidia-smi CSV logs.", input=True, argument=True)
    cluster: str = "local"
    #: the node the GPUs are on (nvidia-smi does not print it); empty: each file's name without its suffix
    node: str = setting("", "The node the GPUs are on [default: each file's name].")
    #: the --query-gpu list of a log written with ``noheader``, comma-separated
    columns: str = setting("", "The --query-gpu list of a log written with noheader (comma-separated).")
    timezone: str = setting("UTC", "nvidia-smi prints local time: which zone.")
    #: GPUs per time in a log without index/uuid/pci.bus_id: each time's lines are GPUs 0..N-1 in nvidia-smi's
    #: order; 0: such a log is refused when a time repeats
    gpus_per_timestamp: int = setting(
        0, "A log without index/uuid/pci.bus_id: each time's N lines are GPUs 0..N-1 (nvidia-smi's order).", minimum=1
    )


@dataclass
class NvsmiCsvImporter:
    """Reads nvidia-smi CSV logs, one block per file (see module docstring)."""

    config: NvsmiCsvConfig
    unmapped: set[str] = field(default_factory=set)
    name: str = "nvidia-smi-csv"

    Config = NvsmiCsvConfig
    #: what it reads: the help of its ``hermeneut import`` subcommand
    description: ClassVar[str] = (
        "nvidia-smi --query-gpu=... --format=csv logs (any columns, with or without units and header)."
    )

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> NvsmiCsvConfig:
        return with_options(NvsmiCsvConfig(cluster=settings.cluster), options, "the nvidia-smi-csv importer")

    @classmethod
    def validate(cls, config: NvsmiCsvConfig) -> None:
        """Files that exist, a known time zone, a column list with a timestamp (when given), names for Kafka keys."""
        if not config.paths:
            raise ConfigError("invalid configuration: nvidia-smi-csv: give one or more CSV files")
        for path in config.paths:
            if not path.is_file():
                raise ConfigError(f"invalid configuration: nvidia-smi-csv: {path} is not a file")
        zone(config.timezone)
        if config.columns:
            _Layout.of(config.columns.split(","))
        if config.gpus_per_timestamp < 0:
            raise ConfigError("invalid configuration: nvidia-smi-csv: --gpus-per-timestamp must be 1 or more")
        check_names("nvidia-smi-csv", config.cluster, config.node)
        if config.gpus_per_timestamp:
            return
        for path in config.paths:
            repeat = unidentified_repeat(path.read_bytes().decode("utf-8", errors="replace"), config.columns)
            if repeat is not None:
                raise ConfigError(
                    f"invalid configuration: nvidia-smi-csv: {path.name} has no index, uuid or pci.bus_id column "
                    f"and line {repeat[0]} has the time of line {repeat[1]} (one line per GPU): add index to "
                    "--query-gpu (--query-gpu=timestamp,index,...), or give --gpus-per-timestamp N to read each "
                    "time's N lines as GPUs 0..N-1, the order nvidia-smi prints them in"
                )

    @classmethod
    def from_config(cls, config: NvsmiCsvConfig) -> NvsmiCsvImporter:
        return cls(config)

    def open(self) -> None:
        """Nothing to open: each file is read when its block is."""

    def close(self) -> None:
        """Nothing held between blocks."""

    def total_rows(self) -> int | None:
        return sum(path.read_bytes().count(b"\n") for path in self.config.paths)

    def blocks(self) -> Iterator[Block]:
        for path in self.config.paths:
            yield self.read(path.read_bytes(), path.name, self.config.node or path.stem)

    def read(self, data: bytes, source: str, node: str) -> Block:
        """One file's rows (``source`` names it in origins), for GPUs on ``node``."""
        tz = zone(self.config.timezone)
        layout = _Layout.of(self.config.columns.split(",")) if self.config.columns else None
        per_time = self.config.gpus_per_timestamp
        read: list[tuple[int, str, int, str, dict[str, float]]] = []
        origins: list[str] = []
        originals: list[bytes] = []
        rejected: list[Rejection] = []
        # the lines of one time in a log without a GPU identity column: their order is their GPU index. A line whose
        # time cannot be read (and a record the CSV reader refused: cells None) still holds its GPU's place, so it
        # joins the time it is among (time None) and becomes the one dead letter of that time
        pending: list[tuple[int, list[str] | None, str, str | None]] = []

        def reject(line: int, why: str, record: str) -> None:
            rejected.append(Rejection("malformed", f"line {line}: {why}", f"{source}:{line}", record.encode()))

        def take(line: int, cells: list[str], record: str, index: int | None) -> None:
            assert layout is not None
            try:
                read.append(_row(layout, cells, tz, node, index))
            except BadValue as exc:
                reject(line, str(exc), record)
                return
            origins.append(f"{source}:{line}")
            originals.append(record.encode())

        def round_time() -> str | None:
            return next((at for _line, _cells, _record, at in pending if at is not None), None)

        def settle() -> None:
            """The pending time's lines as GPUs 0..N-1 when there are N of them, else as dead letters; a line
            without a readable time one past the N lines belongs to the next time (it is kept pending)."""
            carried = [pending.pop()] if len(pending) == per_time + 1 and pending[-1][3] is None else []
            if len(pending) == per_time:
                for index, (line, cells, record, _at) in enumerate(pending):
                    if cells is None:
                        reject(line, csv_refusal(record), record)
                    else:
                        take(line, cells, record, index)
            else:
                for line, cells, record, _at in pending:
                    why = csv_refusal(record) + "; and " if cells is None else ""
                    reject(
                        line,
                        f"{why}{len(pending)} lines at this time for --gpus-per-timestamp {per_time}: "
                        "which line is which GPU cannot be told",
                        record,
                    )
            pending[:] = carried

        last_time: str | None = None
        for line, cells, record in csv_records(data.decode("utf-8", errors="replace")):
            if cells is None:
                if per_time and layout is not None and not layout.identified:
                    pending.append((line, None, record, None))
                else:
                    reject(line, csv_refusal(record), record)
                continue
            if not record.strip():
                continue
            if _is_header(cells):  # the header (again, in a log appended to)
                while pending:  # a carried line is settled too: nothing follows it in this layout
                    settle()
                layout, last_time = _Layout.of(cells), None
                self.unmapped.update(layout.unmapped)
                continue
            if layout is None:
                reject(line, "data before any header (give columns=)", record)
                continue
            if layout.identified:
                take(line, cells, record, None)
                continue
            at = _time_cell(layout, cells)
            if per_time:
                known, current = (at if _readable(at, tz) else None), round_time()
                if known is not None and current is not None and known != current:
                    settle()
                pending.append((line, cells, record, known))
            elif at and at == last_time:
                reject(
                    line,
                    "no index, uuid or pci.bus_id column and this line repeats the time of the one "
                    "before: which GPU it is cannot be told (add index to --query-gpu, or give "
                    "--gpus-per-timestamp)",
                    record,
                )
            else:
                take(line, cells, record, None)
            last_time = at
        while pending:
            settle()
        return Block(_rows(node, read, origins, originals), tuple(rejected), source)


def _rows(
    node: str, read: list[tuple[int, str, int, str, dict[str, float]]], origins: list[str], originals: list[bytes]
) -> Rows:
    """The rows read from one file, (time, uuid, index, model, fields) each, as columns (NaN where a row lacks a
    field another has)."""
    fields = dict.fromkeys(name for row in read for name in row[4])
    return Rows(
        node=(node,) * len(read),
        gpu_uuid=tuple(r[1] for r in read),
        gpu_index=tuple(r[2] for r in read),
        gpu_model=tuple(r[3] for r in read),
        ts_ns=np.array([r[0] for r in read], dtype=np.int64),
        metrics={f: np.array([r[4].get(f, math.nan) for r in read], dtype=np.float64) for f in fields},
        origin=tuple(origins),
        original=tuple(originals),
    )


def _readable(cell: str, tz: Any) -> bool:
    """Whether a time cell reads as a time (a line whose time does not still holds its GPU's place)."""
    try:
        timestamp_ns(cell, "iso8601", tz)
    except BadValue:
        return False
    return True


def _row(
    layout: _Layout, cells: list[str], tz: Any, node: str, index: int | None = None
) -> tuple[int, str, int, str, dict[str, float]]:
    """One data line: its time, GPU identity and fields (a BadValue names the column and value); ``index`` is the
    GPU's by its place among the lines of its time, for a log without an identity column."""
    if len(cells) != len(layout.names):
        raise BadValue(f"{len(cells)} values for {len(layout.names)} columns")
    by_name = dict(zip(layout.names, cells, strict=True))
    ts = timestamp_ns(by_name["timestamp"], "iso8601", tz)
    if index is None:
        index_cell = by_name.get("index", "").strip()
        index = gpu_index(index_cell) if index_cell else 0
    uuid = by_name.get("uuid", "").strip()
    if not uuid or uuid.lower() in ("[n/a]", "n/a"):
        bus = by_name.get("pci.bus_id", "").strip()
        uuid = f"pci-{bus}" if bus else f"{node}-gpu{index}"
    metrics: dict[str, float] = {}
    taken: dict[str, str] = {}
    for name, cell, factor in zip(layout.names, cells, layout.factors, strict=True):
        spec = COLUMNS.get(name)
        if spec is None:
            continue
        target, _unit, read = spec
        try:
            value = read(cell, factor)
        except BadValue as exc:
            raise BadValue(f"{name} {exc}") from None
        if value != value:  # noqa: PLR0124 (NaN: no value)
            continue
        if target in taken and taken[target] in _PREFERRED:
            continue
        metrics[target], taken[target] = value, name
    return ts, uuid, index, by_name.get("name", "").strip(), metrics
