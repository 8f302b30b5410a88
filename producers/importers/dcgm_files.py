"""Saved dcgm-exporter scrapes as an importer (registered as ``dcgm-exporter``): one file per scrape (``curl
http://node:9400/metrics > node-<time>.prom``), or several scrapes in a file when its lines carry timestamps.

The time of a sample is its line's timestamp (Prometheus text format: milliseconds since the epoch after the
value); a file without timestamps is one scrape taken when the file was last written (its modification time, as
``curl > file`` leaves it), or at ``time`` when given. The mapping is the live dcgm-exporter source's
(:mod:`producers.importers.exposition`). Files in name order, one block each; folders are expanded to their
``*.prom``, ``*.txt`` and ``*.metrics`` files.

A file that is not valid exposition text (a repeated series, a line that is not a sample, a timestamp outside
1970..2262, a line over 4,096 characters) is a dead letter as a whole (``malformed``, with the line number): which
of its values are right cannot be told. It counts as one row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Final

from pipeline.codec import INT64_MAX
from pipeline.config import Settings
from pipeline.errors import ConfigError, DecodeError
from pipeline.events import APPLICATIONS
from pipeline.registry import setting, with_options
from producers.dcgm_exporter import PromSample, parse_exposition
from producers.importers.exposition import Scrapes
from producers.importers.parse import BadValue, timestamp_ns
from producers.importers.rows import Block, Rejection, empty_rows
from producers.source import check_names

_SUFFIXES = (".prom", ".txt", ".metrics")


#: the longest line a scrape file may hold: dcgm-exporter's lines, every label included, are a few hundred
#: characters; the value parser's time grows with the square of a value's length (20,000 digits: 18 s)
MAX_LINE: Final = 4096


def _first_long_line(data: bytes) -> int | None:
    """The number of the first line over :data:`MAX_LINE` bytes, None when there is none."""
    lengths = [len(line) for line in data.split(b"\n")]
    return next((n for n, length in enumerate(lengths, 1) if length > MAX_LINE), None)


@dataclass(frozen=True, slots=True)
class DcgmFilesConfig:
    """The ``dcgm-exporter`` importer's settings."""

    paths: tuple[Path, ...] = setting((), "Saved scrapes, or folders of them.", input=True, argument=True)
    cluster: str = "local"
    #: the node of series without a ``Hostname`` label; empty: each file's name without its suffix
    node: str = setting("", "The node of series without a Hostname label [default: each file's name].")
    #: the time of a file without timestamps (RFC 3339); empty: the file's modification time
    time: str = setting("", "The time of files without timestamps (RFC 3339) [default: file mtime].")
    #: the application of the jobs the workload labels name (pod, hpc_job); empty: unknown
    application: str = setting("", "Application of the jobs the labels name.", choices=APPLICATIONS)


def scrape_files(paths: tuple[Path, ...]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        out.extend(sorted(p for p in path.iterdir() if p.suffix in _SUFFIXES) if path.is_dir() else [path])
    return out


@dataclass
class DcgmFilesImporter:
    """Reads saved scrapes (see module docstring)."""

    config: DcgmFilesConfig
    scrapes: dict[str, Scrapes] = field(default_factory=dict)
    name: str = "dcgm-exporter"

    Config = DcgmFilesConfig
    #: what it reads: the help of its ``hermeneut import`` subcommand
    description: ClassVar[str] = "Saved dcgm-exporter scrapes (one per file, or timestamped lines)."

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> DcgmFilesConfig:
        return with_options(DcgmFilesConfig(cluster=settings.cluster), options, "the dcgm-exporter importer")

    @classmethod
    def validate(cls, config: DcgmFilesConfig) -> None:
        if not config.paths:
            raise ConfigError("invalid configuration: dcgm-exporter: give scrape files or folders of them")
        for path in config.paths:
            if not path.exists():
                raise ConfigError(f"invalid configuration: dcgm-exporter: {path} does not exist")
        if config.time:
            try:
                timestamp_ns(config.time)
            except BadValue as exc:
                raise ConfigError(f"invalid configuration: dcgm-exporter: --time {exc}") from None
        if config.application and config.application not in APPLICATIONS:
            raise ConfigError(
                f"invalid configuration: application {config.application!r} is not one of {', '.join(APPLICATIONS)}"
            )
        check_names("dcgm-exporter", config.cluster, config.node)

    @classmethod
    def from_config(cls, config: DcgmFilesConfig) -> DcgmFilesImporter:
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
        long = _first_long_line(data)
        if long is not None:
            detail = f"line {long} is over {MAX_LINE:,} characters: not a line dcgm-exporter writes"
            return Block(empty_rows(), (Rejection("malformed", detail, source, data),), source)
        try:
            samples = parse_exposition(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return Block(empty_rows(), (Rejection("malformed", f"not UTF-8 text: {exc}", source, data),), source)
        except DecodeError as exc:
            return Block(empty_rows(), (Rejection(exc.reason, exc.detail, source, data),), source)
        default_ns = timestamp_ns(self.config.time) if self.config.time else written_ns
        by_time: dict[int, list[PromSample]] = {}
        for s in samples:
            ts_ns = default_ns if s.ts_ms is None else s.ts_ms * 1_000_000
            if not 0 <= ts_ns <= INT64_MAX:
                detail = f"line {s.line}: timestamp {str(s.ts_ms)[:40]} ms is outside 1970..2262"
                return Block(empty_rows(), (Rejection("malformed", detail, source, data),), source)
            by_time.setdefault(ts_ns, []).append(s)
        scrapes = self.scrapes.setdefault(node, Scrapes(self.config.cluster, node, self.config.application))
        return Block(scrapes.rows(sorted(by_time.items()), source, data), (), source)
