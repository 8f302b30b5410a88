"""The stages as child processes of the face: :func:`pipeline.services.stages.start_stage` with the face's own
command line, so the core never names the package above it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

from pipeline.config import Settings
from pipeline.services import stages

#: how a child process runs ``hermeneut``: this interpreter, this package's CLI (not whatever is on PATH)
ENTRY: Final = (sys.executable, "-m", "hermeneut.cli")


def start_stage(
    name: str,
    settings: Settings,
    run_dir: Path,
    *extra: str,
    command: tuple[str, ...] | None = None,
    session: bool = False,
) -> stages.Stage:
    """``hermeneut <command or name>`` as a child process (see :func:`pipeline.services.stages.start_stage`)."""
    return stages.start_stage(name, settings, run_dir, *extra, entry=ENTRY, command=command, session=session)
