"""Directories of ``nvidia-smi -q -x`` captures as an importer (registered as ``nvidia-smi-xml``).

Each capture is replayed through the real NVML collector (:class:`producers.nvml.collector.NvmlCollector` over
:class:`producers.nvml.replay.ReplayNvml`), so the mapping from NVML's answers to the schema stays in one place:
what the collector would have read from that board at that moment, ``N/A`` absent exactly where the board says
so, its processes counted (``process_count``). The time is the capture's ``<timestamp>`` (nvidia-smi's local
time, ``Tue Dec 30 10:49:50 2025``: ``timezone`` says which zone, default UTC). One block per capture file, files
in name order; the node is ``node`` (nvidia-smi does not name the host), else the capture's folder name.

A file that is not a capture (not XML, no ``<gpu>``, no timestamp) is a dead letter (``malformed``) with its
bytes; the other files are still imported. A ``<gpu>`` whose values cannot be read (``<total>`` of 5,000 digits, a
number past a float's range) is a dead letter of its own (``malformed``, naming the GPU); the capture's other GPUs
are imported.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.registry import setting, with_options
from producers.importers.parse import zone
from producers.importers.rows import Block, Rejection, empty_rows, rows_of
from producers.nvml.capture import gpu_from_xml
from producers.nvml.collector import NvmlCollector
from producers.nvml.replay import ReplayNvml
from producers.source import check_names


@dataclass(frozen=True, slots=True)
class NvsmiXmlConfig:
    """The ``nvidia-smi-xml`` importer's settings."""

    #: capture files, or folders of them (every ``*.xml`` inside)
    paths: tuple[Path, ...] = setting((), "nvidia-smi -q -x captures, or folders of them.", input=True, argument=True)
    cluster: str = "local"
    #: the node the captures are from; empty: each capture's folder name
    node: str = setting("", "The node the captures are from [default: each capture's folder name].")
    timezone: str = setting("UTC", "nvidia-smi prints local time: which zone.")


def capture_files(paths: tuple[Path, ...]) -> list[Path]:
    """The capture files named, folders expanded to their ``*.xml`` in name order."""
    out: list[Path] = []
    for path in paths:
        out.extend(sorted(path.glob("*.xml")) if path.is_dir() else [path])
    return out


@dataclass
class NvsmiXmlImporter:
    """Replays captures through the NVML collector (see module docstring)."""

    config: NvsmiXmlConfig
    name: str = "nvidia-smi-xml"

    Config = NvsmiXmlConfig
    #: what it reads: the help of its ``hermeneut import`` subcommand
    description: ClassVar[str] = "Folders (or files) of nvidia-smi -q -x captures, replayed through the NVML collector."

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> NvsmiXmlConfig:
        return with_options(NvsmiXmlConfig(cluster=settings.cluster), options, "the nvidia-smi-xml importer")

    @classmethod
    def validate(cls, config: NvsmiXmlConfig) -> None:
        """Files or folders that exist and hold captures, a known time zone, names that fit a Kafka key."""
        if not config.paths:
            raise ConfigError("invalid configuration: nvidia-smi-xml: give capture files or folders of them")
        for path in config.paths:
            if not path.exists():
                raise ConfigError(f"invalid configuration: nvidia-smi-xml: {path} does not exist")
        if not capture_files(config.paths):
            raise ConfigError("invalid configuration: nvidia-smi-xml: no *.xml capture in the folders given")
        zone(config.timezone)
        check_names("nvidia-smi-xml", config.cluster, config.node)

    @classmethod
    def from_config(cls, config: NvsmiXmlConfig) -> NvsmiXmlImporter:
        return cls(config)

    def open(self) -> None:
        """Nothing to open: each capture is read when its block is."""

    def close(self) -> None:
        """Nothing held between blocks."""

    def total_rows(self) -> int | None:
        return None  # a capture holds as many GPUs as it holds: known only once read

    def blocks(self) -> Iterator[Block]:
        for path in capture_files(self.config.paths):
            yield self.read(path.read_bytes(), path.name, self.config.node or path.parent.name)

    def read(self, data: bytes, source: str, node: str) -> Block:
        """One capture: each GPU (and MIG device) as the collector reads it, at the capture's time."""
        try:
            root = ET.fromstring(data)
            stamp = (root.findtext("timestamp") or "").strip()
            ts_ns = _capture_time(stamp, self.config.timezone)
            elements = root.findall("gpu")
            if not elements:
                raise ValueError("no <gpu> element")
        except (ET.ParseError, ValueError) as exc:
            rejected = Rejection("malformed", f"not an nvidia-smi -q -x capture: {exc}", source, data)
            return Block(empty_rows(), (rejected,), source)
        gpus, bad = [], []
        for number_, element in enumerate(elements, 1):
            try:
                gpus.append(gpu_from_xml(element, source))
            except (ValueError, OverflowError) as exc:  # a value past what an int or a float holds
                name = element.get("id") or f"<gpu> {number_}"
                bad.append(
                    Rejection(
                        "malformed", f"{name}: a value cannot be read: {str(exc)[:200]}", f"{source}:gpu {name}", data
                    )
                )
        if not gpus:
            return Block(empty_rows(), tuple(bad), source)
        collector = NvmlCollector(ReplayNvml(gpus), self.config.cluster, node, processes=True)
        collector.open()
        try:
            samples, events = collector.collect(ts_ns)
        finally:
            collector.close()
        origins = tuple(f"{source}:gpu {s.gpu_index}" for s in samples)
        rows = rows_of(samples, origins, (data,) * len(samples), events=tuple(events))
        return Block(rows, tuple(bad), source)


def _capture_time(stamp: str, timezone: str) -> int:
    """nvidia-smi's ``<timestamp>`` (``Tue Dec 30 10:49:50 2025``, local time) as UTC epoch ns."""
    if not stamp:
        raise ValueError("it has no <timestamp>: when it was taken is unknown")
    try:
        parsed = datetime.strptime(" ".join(stamp.split()), "%a %b %d %H:%M:%S %Y")
    except ValueError:
        raise ValueError(f"timestamp {stamp!r} is not nvidia-smi's") from None
    return int(parsed.replace(tzinfo=zone(timezone)).timestamp()) * 1_000_000_000
