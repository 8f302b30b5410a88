"""Saved AMD device-metrics-exporter scrapes as an importer (registered as ``amd-exporter``): one file per scrape
(``curl http://node:5000/metrics > node-<time>.prom``). Lines may carry their own timestamps, but a series given
twice in one file is malformed (the strict exposition parser shared with dcgm-exporter's): one scrape per file.

The mapping is the live source's (:func:`producers.amd.exporter.to_batches`: units, generations, throttling by
cause, AFID events), with its memory (AFIDs, residency counters) kept per GPU across the files, so a file's
AFIDs are events only where they differ from the GPU's previous file's. A sample's time is its line's timestamp
(milliseconds since the epoch), else the file's modification time (as ``curl > file`` leaves it), else ``time``
when given. The workload labels the exporter adds (``pod``, ``namespace`` from its Kubernetes mapping,
``job_id`` from its Slurm mapping) become the GPU's workload, as for dcgm-exporter's. Files in name order, one
block each; folders are expanded to their ``*.prom``, ``*.txt`` and ``*.metrics`` files.

A file that is not valid exposition text is a dead letter as a whole (``malformed``, with the line number),
counted as one row: which of its values are right cannot be told.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from pipeline.config import Settings
from pipeline.errors import ConfigError, DecodeError
from pipeline.events import APPLICATIONS, GpuEvent, GpuSample, Workload
from pipeline.registry import setting, with_options
from producers.amd.exporter import ExporterState, ScrapeStats, identity, to_batches
from producers.dcgm_exporter import PromSample, parse_exposition
from producers.importers.exposition import workload_of
from producers.importers.parse import BadValue, timestamp_ns
from producers.importers.rows import Block, Rejection, empty_rows, rows_of
from producers.source import check_names

_SUFFIXES: Final = (".prom", ".txt", ".metrics")
#: the exporter's workload labels -> the names :func:`workload_of` reads (Slurm's job id is an HPC job)
_WORKLOAD: Final = {"pod": "pod", "namespace": "namespace", "container": "container", "job_id": "hpc_job"}


@dataclass(frozen=True, slots=True)
class AmdFilesConfig:
    """The ``amd-exporter`` importer's settings."""

    paths: tuple[Path, ...] = setting((), "Saved scrapes, or folders of them.", input=True, argument=True)
    cluster: str = "local"
    #: the node of series without a ``hostname`` label; empty: each file's name without its suffix
    node: str = setting("", "The node of series without a hostname label [default: each file's name].")
    #: the time of a file without timestamps (RFC 3339); empty: the file's modification time
    time: str = setting("", "The time of files without timestamps (RFC 3339) [default: file mtime].")
    #: the application of the jobs the workload labels name (pod, job_id); empty: unknown
    application: str = setting("", "Application of the jobs the labels name.", choices=APPLICATIONS)


def scrape_files(paths: tuple[Path, ...]) -> list[Path]:
    """The files to read: files as given, folders as their scrape files in name order."""
    out: list[Path] = []
    for path in paths:
        out.extend(sorted(p for p in path.iterdir() if p.suffix in _SUFFIXES) if path.is_dir() else [path])
    return out


def workload_labels(samples: list[PromSample], default_node: str) -> dict[str, dict[str, str]]:
    """Per GPU uuid, the workload labels its series carry (empty values are no label)."""
    out: dict[str, dict[str, str]] = {}
    for s in samples:
        labels = {k.lower(): v for k, v in s.labels.items()}
        found = {_WORKLOAD[k]: v for k, v in labels.items() if k in _WORKLOAD and v}
        ident = identity(labels, default_node) if found else None
        if ident is not None:
            out.setdefault(ident[1], {}).update(found)
    return out


@dataclass
class AmdFilesImporter:
    """Reads saved scrapes (see the module docstring)."""

    config: AmdFilesConfig
    #: AFIDs and residency counters per GPU (uuids are unique across nodes), carried from file to file
    state: ExporterState = field(default_factory=ExporterState)
    stats: ScrapeStats = field(default_factory=ScrapeStats)
    name: str = "amd-exporter"

    Config = AmdFilesConfig
    #: what it reads: the help of its ``hermeneut import`` subcommand
    description: ClassVar[str] = "Saved AMD device-metrics-exporter scrapes (one scrape per file)."

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> AmdFilesConfig:
        return with_options(AmdFilesConfig(cluster=settings.cluster), options, "the amd-exporter importer")

    @classmethod
    def validate(cls, config: AmdFilesConfig) -> None:
        """Files that exist, a readable time, a known application, names that fit a Kafka key."""
        if not config.paths:
            raise ConfigError("invalid configuration: amd-exporter: give scrape files or folders of them")
        for path in config.paths:
            if not path.exists():
                raise ConfigError(f"invalid configuration: amd-exporter: {path} does not exist")
        if config.time:
            try:
                timestamp_ns(config.time)
            except BadValue as exc:
                raise ConfigError(f"invalid configuration: amd-exporter: --time {exc}") from None
        if config.application and config.application not in APPLICATIONS:
            raise ConfigError(
                f"invalid configuration: application {config.application!r} is not one of {', '.join(APPLICATIONS)}"
            )
        check_names("amd-exporter", config.cluster, config.node)

    @classmethod
    def from_config(cls, config: AmdFilesConfig) -> AmdFilesImporter:
        return cls(config)

    def open(self) -> None:
        """Nothing to open: each file is read when its block is."""

    def close(self) -> None:
        """Nothing held between blocks."""

    def total_rows(self) -> int | None:
        return None  # GPUs per scrape are known once read

    def blocks(self) -> Iterator[Block]:
        for path in scrape_files(self.config.paths):
            yield self.read(path.read_bytes(), path.name, self.config.node or path.stem, path.stat().st_mtime_ns)

    def read(self, data: bytes, source: str, node: str, written_ns: int) -> Block:
        """One file: its scrapes (by timestamp) as rows, or the whole file as one dead letter."""
        try:
            samples = parse_exposition(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return Block(empty_rows(), (Rejection("malformed", f"not UTF-8 text: {exc}", source, data),), source)
        except DecodeError as exc:
            return Block(empty_rows(), (Rejection(exc.reason, exc.detail, source, data),), source)
        default_ns = timestamp_ns(self.config.time) if self.config.time else written_ns
        by_time: dict[int, list[PromSample]] = {}
        for s in samples:
            by_time.setdefault(default_ns if s.ts_ms is None else s.ts_ms * 1_000_000, []).append(s)
        gpus: list[GpuSample] = []
        workloads: list[Workload | None] = []
        events: list[GpuEvent] = []
        labelled = False
        for ts_ns, scrape in sorted(by_time.items()):
            labels = workload_labels(scrape, node)
            labelled |= bool(labels)
            for batch in to_batches(scrape, self.config.cluster, node, ts_ns, self.state, self.stats):
                gpus.extend(batch.samples)
                events.extend(batch.events)
                workloads.extend(workload_of(labels.get(s.gpu_uuid), self.config.application) for s in batch.samples)
        n = len(gpus)
        rows = rows_of(gpus, (source,) * n, (data,) * n, tuple(workloads) if labelled else None, tuple(events))
        return Block(rows, (), source)
