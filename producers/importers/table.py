"""Any CSV or parquet trace with a small TOML mapping file, as an importer (registered as ``table``).

The mapping says which column is the time (and how it is written: ISO 8601 in a time zone, or epoch seconds to
nanoseconds), what identifies the GPU (a uuid column; or a node and index; or a pod / job column: each value a
GPU of its own), which column is which schema field (with its unit, or a scale), constants (GPU model, memory
total, power limit) and the workload context (a column, constants, or a file of job -> application)::

    [time]
    column = "timestamp"          # required
    format = "iso8601"            # iso8601 (default) | unix_s | unix_ms | unix_us | unix_ns | a strftime pattern
    timezone = "UTC"              # for times written without a zone

    [gpu]
    node = "g150"                 # or node_column = "host"
    index_column = "gpu_index"    # or index = 0
    uuid_column = "pod"           # optional: else <node>-gpu<index>
    model = "NVIDIA H100 80GB HBM3"   # or model_column = "gpu_type"

    [fields]                      # schema field = column, or {column, unit | scale}
    power_watts = "power_W"
    memory_used_bytes = { column = "mem_used", unit = "MiB" }
    utilization_gpu_percent = { column = "util", unit = "ratio" }   # 0..1 -> percent

    [constants]                   # a value every row has
    memory_total_bytes = 85899345920

    [context]                     # application/job/user: constants or *_column; jobs_file maps job -> application
    application = "llm-pretraining"
    job = "nanogpt"

Every mapped column must exist (else one line at start-up, naming the columns the file has); a cell that cannot
be read makes its row a dead letter (``malformed``, with the line, the column and the value), and so does a record
the CSV reader refuses (a field over its 131,072-character limit); the file's other rows are imported. CSV is read
by :mod:`csv` alone (:func:`~producers.importers.parse.csv_records`: a quoted cell may hold a line break, a form
feed in a cell is part of it). An application outside the vocabulary is ``unknown`` (counted in the summary),
never a made-up class.
"""

from __future__ import annotations

import csv
import json
import math
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

import numpy as np

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.events import APPLICATIONS, METRIC_INDEX, Workload
from pipeline.registry import setting, with_options
from producers.importers.parse import (
    TIME_FORMATS,
    BadValue,
    csv_records,
    csv_refusal,
    gpu_index,
    number,
    timestamp_ns,
    unit_factor,
    zone,
)
from producers.importers.rows import Block, Rejection, Rows
from producers.source import check_names

_SECTIONS: Final = frozenset({"time", "gpu", "fields", "constants", "context"})
_CONTEXT: Final = ("application", "job", "user", "tenant", "model", "framework")


@dataclass(frozen=True, slots=True)
class Mapping:
    """A parsed mapping file (see module docstring); ``validate_columns`` checks it against a file's header."""

    time_column: str
    time_format: str
    timezone: str
    node: str
    node_column: str | None
    index: int
    index_column: str | None
    uuid_column: str | None
    model: str
    model_column: str | None
    #: field -> (column, factor)
    fields: dict[str, tuple[str, float]]
    constants: dict[str, float]
    #: application/job/... -> constant value; and -> column
    context: dict[str, str]
    context_columns: dict[str, str]
    #: job id -> application, from ``jobs_file``
    job_applications: dict[str, str]

    def columns(self) -> set[str]:
        named = {self.time_column, *(c for c, _ in self.fields.values()), *self.context_columns.values()}
        return named | {c for c in (self.node_column, self.index_column, self.uuid_column, self.model_column) if c}

    def validate_columns(self, header: list[str], source: str) -> None:
        missing = sorted(self.columns() - set(header))
        if missing:
            raise ConfigError(
                f"invalid configuration: {source} has no column {missing[0]!r} named in the mapping "
                f"(it has: {', '.join(repr(h)[1:-1] for h in header)[:300]})"  # repr: a line break stays one line
            )


def load_mapping(path: Path) -> Mapping:
    """Read and check a mapping file; a ConfigError naming the file and what is wrong otherwise."""
    where = f"mapping {path}"
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"invalid configuration: {where}: {exc}") from exc
    unknown = sorted(set(raw) - _SECTIONS)
    if unknown:
        raise ConfigError(f"invalid configuration: {where}: unknown section [{unknown[0]}]")
    time_ = raw.get("time", {})
    gpu, ctx = raw.get("gpu", {}), raw.get("context", {})
    if "column" not in time_:
        raise ConfigError(f"invalid configuration: {where}: [time] needs column = the time column")
    fmt = str(time_.get("format", "iso8601"))
    if fmt not in TIME_FORMATS and "%" not in fmt:
        raise ConfigError(f"invalid configuration: {where}: time format {fmt!r} is not one of {TIME_FORMATS}")
    zone(str(time_.get("timezone", "UTC")))
    fields: dict[str, tuple[str, float]] = {}
    for name, spec in raw.get("fields", {}).items():
        if name not in METRIC_INDEX:
            raise ConfigError(f"invalid configuration: {where}: {name!r} is not a schema field")
        if isinstance(spec, str):
            fields[name] = (spec, 1.0)
        elif isinstance(spec, dict) and "column" in spec:
            factor = float(spec.get("scale", 1.0)) * unit_factor(str(spec.get("unit", "")), f"{where}: {name}")
            fields[name] = (str(spec["column"]), factor)
        else:
            raise ConfigError(f"invalid configuration: {where}: {name} must be a column or {{column, unit|scale}}")
    constants = {}
    for name, value in raw.get("constants", {}).items():
        if name not in METRIC_INDEX or not isinstance(value, int | float):
            raise ConfigError(f"invalid configuration: {where}: constant {name!r} must be a schema field = a number")
        constants[name] = float(value)
    application = ctx.get("application")
    if application is not None and application not in APPLICATIONS:
        raise ConfigError(
            f"invalid configuration: {where}: application {application!r} is not one of {', '.join(APPLICATIONS)}"
        )
    jobs_file = ctx.get("jobs_file")
    job_applications = _jobs_file(path.parent / str(jobs_file), where) if jobs_file else {}
    return Mapping(
        time_column=str(time_["column"]),
        time_format=fmt,
        timezone=str(time_.get("timezone", "UTC")),
        node=str(gpu.get("node", "")),
        node_column=gpu.get("node_column"),
        index=int(gpu.get("index", 0)),
        index_column=gpu.get("index_column"),
        uuid_column=gpu.get("uuid_column"),
        model=str(gpu.get("model", "")),
        model_column=gpu.get("model_column"),
        fields=fields,
        constants=constants,
        context={k: str(ctx[k]) for k in _CONTEXT if k in ctx},
        context_columns={k: str(ctx[f"{k}_column"]) for k in _CONTEXT if f"{k}_column" in ctx},
        job_applications=job_applications,
    )


def _jobs_file(path: Path, where: str) -> dict[str, str]:
    """A CSV with columns ``job`` and ``application``: the class of each job of the trace."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise ConfigError(f"invalid configuration: {where}: jobs_file: {exc}") from exc
    out = {}
    for number_, row in enumerate(rows, start=2):
        job, application = (row.get("job") or "").strip(), (row.get("application") or "").strip()
        if not job or application not in APPLICATIONS:
            raise ConfigError(
                f"invalid configuration: {path}:{number_}: needs a job and an application of {', '.join(APPLICATIONS)}"
            )
        out[job] = application
    return out


@dataclass(frozen=True, slots=True)
class TableConfig:
    """The ``table`` importer's settings."""

    paths: tuple[Path, ...] = setting((), "CSV or parquet files.", input=True, argument=True)
    mapping: Path | None = setting(None, "The TOML mapping.", required=True, input=True)
    cluster: str = "local"


@dataclass
class TableImporter:
    """Reads CSV or parquet files through a mapping, one block per file (see module docstring)."""

    config: TableConfig
    mapping: Mapping
    #: rows whose application was not in the vocabulary (labelled unknown)
    unknown_applications: dict[str, int] = field(default_factory=dict)
    name: str = "table"
    _last_time: tuple[str, int] = ("", 0)
    _workloads: dict[tuple[str, ...], Workload | None] = field(default_factory=dict)
    _outside: dict[tuple[str, ...], str] = field(default_factory=dict)

    Config = TableConfig
    #: what it reads: the help of its ``hermeneut import`` subcommand
    description: ClassVar[str] = (
        "CSV or parquet traces, read through a mapping file (time, GPU or pod, fields and units, context)."
    )

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> TableConfig:
        return with_options(TableConfig(cluster=settings.cluster), options, "the table importer")

    @classmethod
    def validate(cls, config: TableConfig) -> None:
        """Files that exist and a mapping file that reads; nothing else is opened."""
        if not config.paths:
            raise ConfigError("invalid configuration: table: give one or more CSV or parquet files")
        if config.mapping is None:
            raise ConfigError("invalid configuration: table: give a mapping file (--mapping, see docs)")
        for path in (*config.paths, config.mapping):
            if not path.is_file():
                raise ConfigError(f"invalid configuration: table: {path} is not a file")
        mapping = load_mapping(config.mapping)
        check_names("table", config.cluster, mapping.node)

    @classmethod
    def from_config(cls, config: TableConfig) -> TableImporter:
        assert config.mapping is not None
        return cls(config, load_mapping(config.mapping))

    def open(self) -> None:
        """Every file's header against the mapping: a missing column stops the import before anything is sent."""
        for path in self.config.paths:
            self.mapping.validate_columns(_header(path), str(path))

    def close(self) -> None:
        """Nothing held between blocks."""

    def total_rows(self) -> int | None:
        total = 0
        for path in self.config.paths:
            if _is_parquet(path):
                import pyarrow.parquet as pq

                total += pq.ParquetFile(path).metadata.num_rows
            else:
                total += max(path.read_bytes().count(b"\n") - 1, 0)
        return total

    def blocks(self) -> Iterator[Block]:
        for path in self.config.paths:
            records = _parquet_records(path) if _is_parquet(path) else _csv_records(path)
            yield self.read(records, path.name)

    def read(self, records: Iterator[tuple[int, dict[str, str] | None, bytes]], source: str) -> Block:
        """Rows from ``(line, cells by column, original bytes)`` records of one file (cells None: a record the
        CSV reader refused)."""
        m = self.mapping
        tz = zone(m.timezone)
        out: dict[str, list[Any]] = {k: [] for k in ("node", "uuid", "index", "model", "ts", "origin", "orig", "work")}
        values: dict[str, list[float]] = {name: [] for name in (*m.fields, *m.constants)}
        rejected: list[Rejection] = []
        for line, cells, original in records:
            origin = f"{source}:{line}"
            if cells is None:
                rejected.append(
                    Rejection("malformed", f"line {line}: {csv_refusal(original.decode())}", origin, original)
                )
                continue
            try:
                row = self._row(cells, tz)
            except BadValue as exc:
                rejected.append(Rejection("malformed", f"line {line}: {exc}", origin, original))
                continue
            node, uuid, index, model, ts, metrics, workload = row
            for key, value in zip(out, (node, uuid, index, model, ts, origin, original, workload), strict=True):
                out[key].append(value)
            for name, value in metrics.items():
                values[name].append(value)
        has_context = bool(m.context or m.context_columns)
        rows = Rows(
            node=tuple(out["node"]),
            gpu_uuid=tuple(out["uuid"]),
            gpu_index=tuple(out["index"]),
            gpu_model=tuple(out["model"]),
            ts_ns=np.array(out["ts"], dtype=np.int64),
            metrics={k: np.array(v, dtype=np.float64) for k, v in values.items()},
            origin=tuple(out["origin"]),
            original=tuple(out["orig"]),
            workload=tuple(out["work"]) if has_context else None,
        )
        return Block(rows, tuple(rejected), source)

    def _time(self, text: str, tz: Any) -> int:
        """A time cell in ns; the rows of one sample round share it, so the last one is kept."""
        if text != self._last_time[0]:
            self._last_time = (text, timestamp_ns(text, self.mapping.time_format, tz))
        return self._last_time[1]

    def _row(self, cells: dict[str, str], tz: Any) -> tuple[str, str, int, str, int, dict[str, float], Any]:
        m = self.mapping
        ts = self._time(cells[m.time_column], tz)
        node = cells[m.node_column].strip() if m.node_column else m.node
        if not node or "/" in node:
            raise BadValue(f"node {node!r} is not a node name")
        index = m.index
        if m.index_column:
            index = gpu_index(cells[m.index_column], m.index_column)
        uuid = cells[m.uuid_column].strip() if m.uuid_column else f"{node}-gpu{index}"
        if not uuid:
            raise BadValue(f"{m.uuid_column} is empty: the row names no GPU")
        model = cells[m.model_column].strip() if m.model_column else m.model
        metrics = dict(m.constants)
        for name, (column, factor) in m.fields.items():
            try:
                metrics[name] = number(cells[column], factor) if cells[column].strip() else math.nan
            except BadValue as exc:
                raise BadValue(f"{column} {exc}") from None
        return node, uuid, index, model, ts, metrics, self._workload(cells)

    def _workload(self, cells: dict[str, str]) -> Workload | None:
        """The row's workload (None: its job cell is empty, nothing runs); one object per distinct context."""
        m = self.mapping
        key = tuple(cells[c] for c in m.context_columns.values())
        if key not in self._workloads:
            self._workloads[key] = self._new_workload(cells, key)
        outside = self._outside.get(key)
        if outside is not None:  # counted per row, as the summary reports it
            self.unknown_applications[outside] = self.unknown_applications.get(outside, 0) + 1
        return self._workloads[key]

    def _new_workload(self, cells: dict[str, str], key: tuple[str, ...]) -> Workload | None:
        m = self.mapping
        given = m.context | {k: cells[c].strip() for k, c in m.context_columns.items()}
        job = given.get("job") or None
        if "job" in m.context_columns and job is None:
            return None
        application = given.get("application") or (m.job_applications.get(job, "") if job else "") or "unknown"
        if application not in APPLICATIONS:
            self._outside[key] = application
            application = "unknown"
        return Workload(
            application,
            job_id=job,
            user=given.get("user") or None,
            source="import",
            confidence=1.0 if application != "unknown" else 0.0,
            tenant=given.get("tenant") or None,
            model=given.get("model") or None,
            framework=given.get("framework") or None,
        )


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def _header(path: Path) -> list[str]:
    """The file's column names; a ConfigError when it has none a reader can take (not parquet, not CSV)."""
    if _is_parquet(path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            return list(pq.ParquetFile(path).schema_arrow.names)
        except (pa.ArrowException, OSError) as exc:
            raise ConfigError(f"invalid configuration: {path} is not a parquet file: {exc}") from None
    with path.open(newline="", errors="replace") as f:
        try:
            return [c.strip() for c in next(csv.reader(f, skipinitialspace=True), [])]  # as csv_records reads
        except csv.Error as exc:
            raise ConfigError(f"invalid configuration: {path}: its first line is not a CSV header ({exc})") from None


def _csv_records(path: Path) -> Iterator[tuple[int, dict[str, str] | None, bytes]]:
    return csv_rows(path.read_bytes().decode("utf-8", errors="replace"))


def csv_rows(text: str) -> Iterator[tuple[int, dict[str, str] | None, bytes]]:
    """(line number, cells by column, the record's bytes) for every data record of a CSV text with a header; cells
    None for a record the CSV reader refused."""
    records = csv_records(text)
    first = next(records, None)
    header = [c.strip() for c in first[1] or []] if first is not None else []
    for line, cells, record in records:
        if cells is None:
            yield line, None, record.encode()
        elif record.strip():
            padded = cells + [""] * (len(header) - len(cells))  # a short row: its missing cells are empty
            yield line, dict(zip(header, padded, strict=False)), record.encode()


def _parquet_records(path: Path) -> Iterator[tuple[int, dict[str, str], bytes]]:
    """(row number, cells as text, the row as JSON) for every row of a parquet file."""
    import pyarrow.parquet as pq

    start = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=65_536):
        columns = batch.to_pydict()
        names = list(columns)
        for i, row in enumerate(zip(*columns.values(), strict=True)):
            cells = {n: "" if v is None else _text(v) for n, v in zip(names, row, strict=True)}
            yield start + i + 1, cells, json.dumps(cells).encode()
        start += batch.num_rows


def _text(value: Any) -> str:
    """A parquet cell as the text the mapping reads: datetimes as ISO 8601, numbers as Python prints them."""
    return value.isoformat() if hasattr(value, "isoformat") else str(value)
