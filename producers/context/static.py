"""Workloads declared in a file (TOML or CSV): GPU -> application, job, user, tenant, model, framework.

For GPUs whose use is fixed by people rather than a scheduler: an inference pool, a render farm, a reserved
spare. TOML::

    [[gpu]]
    node = "gpu-07"              # or "*" for every node that reads this file
    gpu = "GPU-5f0a3c1e-..."     # a uuid, a MIG- uuid, an index ("0"), or "*" for every GPU of the node
    application = "llm-serving"  # one of pipeline.events.APPLICATIONS
    job_id = "search-inference"  # optional: job_id user tenant model framework job_gpus confidence

CSV: a header row naming the same columns (``node,gpu,application`` required), ``#`` comment lines allowed.

An entry for one GPU beats a ``*`` entry. The file is checked completely at start-up: an unknown application,
an unknown column or a malformed line is a :class:`~pipeline.errors.ConfigError` naming the line. A file that
becomes invalid while the watch runs keeps its last good content (logged once).
"""

from __future__ import annotations

import csv
import difflib
import functools
import io
import logging
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pipeline.errors import ConfigError
from pipeline.events import APPLICATIONS, Workload
from pipeline.registry import setting, with_options
from producers.context.base import Observation, is_application
from producers.context.inventory import GpuInventory

if TYPE_CHECKING:
    from pipeline.config import Settings

log = logging.getLogger(__name__)

REQUIRED: Final = ("node", "gpu", "application")
OPTIONAL: Final = ("job_id", "user", "tenant", "model", "framework", "job_gpus", "confidence")
_GPU_REF: Final = re.compile(r"^(?:\*|\d+|(?:GPU|MIG)-[0-9A-Za-z/-]+)$")


@dataclass(frozen=True, slots=True)
class StaticEntry:
    node: str
    gpu: str
    workload: Workload
    line: int


def workload_from_fields(fields: Mapping[str, object], source: str) -> Workload:
    """A validated Workload from user-given fields; raises ValueError with a message fit for one line."""
    application = str(fields.get("application") or "")
    if not is_application(application):
        close = difflib.get_close_matches(application, APPLICATIONS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f" (one of: {', '.join(APPLICATIONS)})"
        raise ValueError(f"unknown application {application!r}{hint}")
    job_gpus = fields.get("job_gpus")
    if job_gpus in ("", None):
        job_gpus = None
    else:
        try:
            job_gpus = int(str(job_gpus))
        except ValueError:
            raise ValueError(f"job_gpus must be a whole number, got {job_gpus!r}") from None
        if job_gpus < 1:
            raise ValueError(f"job_gpus must be at least 1, got {job_gpus}")
    confidence = fields.get("confidence")
    try:
        confidence = 1.0 if confidence in ("", None) else float(str(confidence))
    except ValueError:
        raise ValueError(f"confidence must be a number, got {confidence!r}") from None
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if application == "unknown":
        confidence = 0.0

    def text(name: str) -> str | None:
        value = fields.get(name)
        return None if value in ("", None) else str(value)

    return Workload(
        application,
        job_id=text("job_id"),
        user=text("user"),
        source=source,
        confidence=confidence,
        tenant=text("tenant"),
        model=text("model"),
        framework=text("framework"),
        job_gpus=job_gpus,
    )


def _entry(fields: Mapping[str, object], line_of: Callable[[str | None], int], where: str) -> StaticEntry:
    """One checked entry; ``line_of(field)`` is the line a problem with that field (None: the entry) is on."""
    unknown = sorted(set(fields) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        known = ", ".join(REQUIRED + OPTIONAL)
        raise ConfigError(f"{where}:{line_of(unknown[0])}: unknown column {unknown[0]!r} (known: {known})")
    for name in REQUIRED:
        if fields.get(name) in ("", None):
            raise ConfigError(f"{where}:{line_of(None)}: {name} is missing")
    gpu = str(fields["gpu"]).strip()
    if not _GPU_REF.match(gpu):
        raise ConfigError(f"{where}:{line_of('gpu')}: gpu must be a uuid (GPU-/MIG-), an index or *, got {gpu!r}")
    try:
        workload = workload_from_fields(fields, "static")
    except ValueError as exc:
        field = next((f for f in (*REQUIRED, *OPTIONAL) if str(exc).startswith((f, f"unknown {f}"))), None)
        raise ConfigError(f"{where}:{line_of(field)}: {exc}") from None
    return StaticEntry(str(fields["node"]).strip(), gpu, workload, line_of(None))


def _toml_line_finder(lines: list[str], start: int) -> Callable[[str | None], int]:
    """Line numbers within the ``[[gpu]]`` table whose header is on line ``start`` (tomllib gives none)."""

    def line_of(field: str | None) -> int:
        for number in range(start + 1, len(lines) + 1):
            text = lines[number - 1].strip()
            if text.startswith("["):
                break
            if field is not None and re.match(rf"{re.escape(field)}\s*=", text):
                return number
        return start

    return line_of


def parse_toml(text: str, where: str) -> list[StaticEntry]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: malformed TOML: {exc}") from None
    extra = sorted(set(doc) - {"gpu"})
    if extra:
        raise ConfigError(f"{where}: unknown table {extra[0]!r}; entries are [[gpu]] tables")
    tables = doc.get("gpu", [])
    if not isinstance(tables, list):
        raise ConfigError(f"{where}: entries must be [[gpu]] tables")
    lines = text.splitlines()
    headers = [n for n, line in enumerate(lines, 1) if line.strip().startswith("[[gpu]]")]
    if len(headers) != len(tables):  # inline arrays of tables: no line numbers to give
        headers = [0] * len(tables)
    return [_entry(t, _toml_line_finder(lines, headers[i]), where) for i, t in enumerate(tables)]


def _same_line(number: int, _field: str | None) -> int:
    return number  # a CSV row is one line, whatever the field


def parse_csv(text: str, where: str) -> list[StaticEntry]:
    rows = [
        (n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rows:
        return []
    header_line, header = rows[0]
    names = [h.strip() for h in next(csv.reader([header]))]
    entries = []
    for number, line in rows[1:]:
        values = next(csv.reader(io.StringIO(line)))
        if len(values) != len(names):
            raise ConfigError(
                f"{where}:{number}: expected {len(names)} columns (header on line {header_line}), got {len(values)}"
            )
        row = dict(zip(names, (v.strip() for v in values), strict=True))
        entries.append(_entry(row, functools.partial(_same_line, number), where))
    return entries


def load(path: Path) -> list[StaticEntry]:
    """Read and check the whole file; raises ConfigError naming the file and line of the first problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read static context file {path}: {exc.strerror}") from None
    entries = parse_csv(text, str(path)) if path.suffix.lower() == ".csv" else parse_toml(text, str(path))
    seen: dict[tuple[str, str], int] = {}
    for e in entries:
        if (e.node, e.gpu) in seen:
            raise ConfigError(
                f"{path}:{e.line}: node {e.node} gpu {e.gpu} is already given on line {seen[e.node, e.gpu]}"
            )
        seen[e.node, e.gpu] = e.line
    return entries


def observe(
    entries: list[StaticEntry], node: str, inventory: GpuInventory
) -> tuple[dict[str, Workload], list[StaticEntry]]:
    """The workloads the entries give this node's GPUs, and the entries naming a GPU this node lacks.

    Specific beats wildcard: (node, gpu) > (node, *) > (*, gpu) > (*, *).
    """
    out: dict[str, tuple[int, Workload]] = {}
    unmatched = []
    for e in entries:
        if e.node not in (node, "*"):
            continue
        specificity = (e.node != "*") * 2 + (e.gpu != "*")
        uuids = inventory.uuids if e.gpu == "*" else tuple(u for u in [inventory.resolve(e.gpu)] if u)
        if not uuids and e.gpu != "*":
            unmatched.append(e)
        for uuid in uuids:
            if uuid not in out or out[uuid][0] < specificity:
                out[uuid] = (specificity, e.workload)
    return {uuid: w for uuid, (_, w) in out.items()}, unmatched


@dataclass(frozen=True, slots=True)
class StaticConfig:
    """The ``static`` context source's settings."""

    path: Path | None = setting(None, "TOML/CSV file of GPU -> workload.", required=True)


class StaticSource:
    """The static file as a context source (registered as ``static``); re-read when it changes."""

    name = "static"
    description = "Workloads from a TOML/CSV file of GPU -> workload, re-read when it changes."
    #: what it says: two sources that say the same are two ways to one answer (the watch takes one)
    covers = "a file's workloads"
    Config = StaticConfig

    @classmethod
    def configure(cls, settings: Settings, **options: object) -> StaticConfig:
        return with_options(StaticConfig(), options, "the static context source")

    @classmethod
    def validate(cls, config: StaticConfig) -> None:
        """The file is read and checked: a bad line is a ConfigError naming it."""
        if config.path is None:
            raise ConfigError("invalid configuration: the static context source needs its file (--static FILE)")
        load(config.path)

    @classmethod
    def from_config(cls, config: StaticConfig, node: str, inventory: GpuInventory) -> StaticSource:
        assert config.path is not None  # validate's check
        return cls(config.path, node, inventory)

    def __init__(self, path: Path, node: str, inventory: GpuInventory) -> None:
        self.path, self.node, self.inventory = path, node, inventory
        self._entries = load(path)  # ConfigError at start-up
        self._mtime = self._stat()
        self._broken: str | None = None
        self._warned: set[int] = set()
        self.reload_errors = 0

    def _stat(self) -> int | None:
        try:
            return self.path.stat().st_mtime_ns
        except OSError:
            return None

    def poll(self) -> Observation:
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._entries = load(self.path)
                if self._broken:
                    log.info("static context file %s is valid again", self.path)
                self._broken = None
            except ConfigError as exc:
                self.reload_errors += 1
                if str(exc) != self._broken:
                    log.error("%s; keeping its last good content", exc)
                self._broken = str(exc)
        observed, unmatched = observe(self._entries, self.node, self.inventory)
        for e in unmatched:
            if e.line not in self._warned:
                self._warned.add(e.line)
                log.warning("%s:%d: gpu %s is not a GPU of node %s", self.path, e.line, e.gpu, self.node)
        return observed
