"""Workload-context stand-ins for the watch loop's tests: scripted context sources, a recording sink, and the
Slurm commands (``squeue`` / ``scontrol``) answering from recorded output."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.codec import decode_record
from pipeline.errors import SourceUnavailable
from pipeline.events import GpuContext, Workload
from producers.context.base import Observation


class Scripted:
    """A context source whose next answers are set by the test; an exception instance is raised instead."""

    def __init__(self, name: str, answer: Observation | Exception) -> None:
        self.name, self.answer, self.polls = name, answer, 0

    def poll(self) -> Observation:
        self.polls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Recorder:
    """The watch's publish callback: keeps (key, context or None for a tombstone)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, GpuContext | None]] = []

    def __call__(self, key: bytes, value: bytes | None) -> None:
        self.records.append((key.decode(), None if value is None else decode_record(GpuContext, value)))

    def take(self) -> dict[str, Workload | None]:
        """The workload per GPU uuid recorded since the last take."""
        out = {k.rsplit("/", 1)[1]: (c.workload if c else None) for k, c in self.records}
        self.records.clear()
        return out


class FakeSlurm:
    """``squeue`` / ``scontrol -d show job`` answering from recorded output; counts the calls; ``down``: the
    controller cannot be reached."""

    def __init__(self, squeue: str, scontrol: str) -> None:
        self.calls: list[list[str]] = []
        self.squeue = squeue
        self.scontrol = scontrol
        self.down = False

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        self.calls.append(list(argv))
        if self.down:
            raise SourceUnavailable("slurm_load_jobs error: Unable to contact slurm controller")
        if argv[0] == "squeue":
            return self.squeue
        job_id = argv[-1]
        return next(r for r in self.scontrol.split("\n\n") if r.startswith(f"JobId={job_id} "))
