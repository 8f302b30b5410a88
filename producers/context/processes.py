"""Workload inferred from the processes on each GPU, for GPUs no scheduler or file speaks for (or to add the
framework and model a scheduler does not know).

The processes per GPU come from an injected lister: the node agent's own NVML process list, or
``nvidia-smi -q -x -d PIDS`` by default (``<processes><process_info>`` per GPU). Each process's command line
(``/proc/<pid>/cmdline``), working directory and a few whitelisted environment variables
(:data:`~producers.context.inference.EVIDENCE_ENV`: model names and launcher markers, never anything else) are
read under an injectable proc root; in a container, mount the host's ``/proc`` (and run with hostPID) or the pids
name nothing, or the wrong processes. When ``/proc`` cannot be read the name nvidia-smi reports is the evidence.
The rules are :mod:`producers.context.inference`; confidence is capped at 0.7, below a scheduler's declaration.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import ContextSettings
from pipeline.errors import ConfigError, DecodeError, SourceUnavailable
from pipeline.events import GpuProcess, Workload
from pipeline.registry import from_section, section_config
from producers.context.base import PROCESS_CONFIDENCE_CAP, Observation
from producers.context.inference import EVIDENCE_ENV, Evidence, infer_many
from producers.context.inventory import GpuInventory

if TYPE_CHECKING:
    from pipeline.config import Settings

log = logging.getLogger(__name__)

#: GPU uuid -> processes using it
GpuProcessLister = Callable[[], Mapping[str, Sequence[GpuProcess]]]

_KINDS = {"C": "compute", "G": "graphics", "C+G": "compute"}
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    name: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None

    def evidence(self) -> Evidence:
        return Evidence(argv=self.argv, env=self.env, cwd=self.cwd)


def read_process(proc_root: Path, process: GpuProcess) -> ProcessInfo:
    """What ``/proc`` says about a GPU process; falls back to its reported name where ``/proc`` is silent."""
    base = proc_root / str(process.pid)
    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd = None
    with contextlib.suppress(OSError):  # gone, or another pid namespace
        argv = tuple(a for a in (base / "cmdline").read_bytes().decode(errors="replace").split("\0") if a)
    try:
        pairs = (e.partition("=") for e in (base / "environ").read_bytes().decode(errors="replace").split("\0"))
        env = tuple((k, v) for k, _, v in pairs if k in EVIDENCE_ENV)
    except OSError:
        pass  # reading another user's environment needs root: the command line is enough
    with contextlib.suppress(OSError):
        cwd = os.readlink(base / "cwd")
    if not argv:
        argv = tuple(process.name.split())
    return ProcessInfo(process.pid, process.name, argv, env, cwd)


def _memory(text: str | None) -> int | None:
    number, _, unit = (text or "").strip().partition(" ")
    if not number.isdigit() or unit not in _UNITS:
        return None
    return int(number) * _UNITS[unit]


def parse_nvidia_smi_processes(text: str) -> dict[str, tuple[GpuProcess, ...]]:
    """Processes per GPU from ``nvidia-smi -q -x`` output, keyed by uuid, or by index (the ``<gpu>`` element's
    position, NVML order) where a display filter such as ``-d PIDS`` left the uuid out."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise DecodeError("malformed", f"not nvidia-smi XML: {exc}") from exc
    out: dict[str, tuple[GpuProcess, ...]] = {}
    for index, gpu in enumerate(root.iter("gpu")):
        uuid = (gpu.findtext("uuid") or "").strip() or str(index)
        procs = []
        for info in gpu.iterfind("processes/process_info"):
            pid = (info.findtext("pid") or "").strip()
            if not pid.isdigit():
                continue
            kind = _KINDS.get((info.findtext("type") or "").strip(), "compute")
            name = (info.findtext("process_name") or "").strip()
            procs.append(GpuProcess(int(pid), name, _memory(info.findtext("used_memory")), kind))
        out[uuid] = tuple(procs)
    return out


def nvidia_smi_lister(timeout_s: float = 10.0, binary: str = "nvidia-smi") -> GpuProcessLister:
    def lister() -> Mapping[str, Sequence[GpuProcess]]:
        try:
            done = subprocess.run(
                [binary, "-q", "-x", "-d", "PIDS"], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SourceUnavailable(f"{binary}: {exc}") from exc
        if done.returncode != 0:
            raise SourceUnavailable(f"{binary} exited {done.returncode}: {done.stdout.strip()[:200]}")
        try:
            return parse_nvidia_smi_processes(done.stdout)
        except DecodeError as exc:
            raise SourceUnavailable(f"{binary}: {exc.detail}") from exc

    return lister


def infer_gpu(processes: Sequence[ProcessInfo]) -> Workload | None:
    """The workload the processes on one GPU suggest, or None when they suggest nothing."""
    found = infer_many(p.evidence() for p in processes)
    if found is None:
        return None
    confidence = min(found.confidence, PROCESS_CONFIDENCE_CAP) if found.application != "unknown" else 0.0
    return Workload(
        found.application, source="process", confidence=confidence, model=found.model, framework=found.framework
    )


@dataclass(frozen=True, slots=True)
class ProcessesConfig:
    """The ``processes`` context source's settings (the ``context`` section's)."""

    proc_root: Path = from_section(ContextSettings, "proc_root")
    command_timeout_s: float = from_section(ContextSettings, "command_timeout_s")


class ProcessSource:
    """Per GPU of the node, what its processes look like (registered as ``processes``)."""

    name = "processes"
    description = "Infer from the command lines of the GPUs' processes."
    covers = "the GPUs' processes"
    Config = ProcessesConfig

    @classmethod
    def configure(cls, settings: Settings, **options: object) -> ProcessesConfig:
        return section_config(ProcessesConfig, settings.context, "the processes context source", **options)

    @classmethod
    def validate(cls, config: ProcessesConfig) -> None:
        """The bounds are the settings'."""

    @classmethod
    def from_config(
        cls, config: ProcessesConfig, node: str, inventory: GpuInventory, lister: GpuProcessLister | None = None
    ) -> ProcessSource:
        """Built with ``nvidia-smi`` (which must be on PATH) listing the processes, or ``lister``'s stand-in."""
        if lister is None:
            if shutil.which("nvidia-smi") is None:
                raise ConfigError("--processes needs nvidia-smi on PATH to list each GPU's processes")
            lister = nvidia_smi_lister(config.command_timeout_s)
        return cls(lister, inventory, config.proc_root)

    def __init__(self, lister: GpuProcessLister, inventory: GpuInventory, proc_root: Path) -> None:
        self.lister, self.inventory, self.proc_root = lister, inventory, proc_root

    def poll(self) -> Observation:
        out: dict[str, Workload] = {}
        for ref, processes in self.lister().items():
            uuid = self.inventory.resolve(ref)
            if uuid is None or not processes:
                continue
            workload = infer_gpu([read_process(self.proc_root, p) for p in processes])
            if workload is not None:
                out[uuid] = workload
        return out
