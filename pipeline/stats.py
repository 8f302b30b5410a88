"""Self-metrics of a stage written to a JSON file (atomically), read by the main job, tests and benchmarks, and
the stall watch every writing stage keeps (:class:`Stall`): the file is each stage's health."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def write_stats(path: Path | None, values: dict[str, Any]) -> None:
    """Replace ``path`` with ``values`` as JSON, so a reader never sees half a file; no-op without a path."""
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(values))
    tmp.replace(path)


@dataclass
class Stall:
    """A stage's write that keeps failing (or waiting): after ``after`` failures in a row, or ``after_s`` seconds
    without an acknowledgement, the stage is *stalled*: one log line with the record's size and source, a counter
    (``stalls``), and ``stalled: true`` in its stats until the write succeeds (logged once more). The stage keeps
    retrying in place; it neither skips the record nor restarts."""

    stage: str
    after: int = 3
    after_s: float = 30.0
    stalled: bool = False
    #: episodes of being stalled, and failed attempts of any write
    stalls: int = 0
    write_failures: int = 0
    #: what it is stalled on (topic or destination, size, source, last error), while stalled
    stalled_on: str = ""
    _streak: int = field(default=0, repr=False)
    _since: float = field(default=0.0, repr=False)

    def failed(self, what: str, size: int, source: str, error: str) -> None:
        """One failed attempt to write ``what`` (``size`` bytes, from ``source``)."""
        self.write_failures += 1
        self._streak += 1
        if not self._since:
            self._since = time.monotonic()
        if self._streak >= self.after:
            self._stall(f"{what}: {size} bytes from {source}; {self._streak} attempts failed, last: {error}"[:500])

    def waiting(self, what: str, size: int, source: str) -> None:
        """A write still unacknowledged; stalled once that has lasted ``after_s``."""
        if not self._since:
            self._since = time.monotonic()
        elif time.monotonic() - self._since >= self.after_s:
            waited = time.monotonic() - self._since
            self._stall(f"{what}: {size} bytes from {source}; unacknowledged for {waited:.0f} s")

    def _stall(self, on: str) -> None:
        self.stalled_on = on
        if not self.stalled:
            self.stalled = True
            self.stalls += 1
            log.error("%s stalled writing %s (retrying; nothing is committed past it)", self.stage, on)

    def ok(self) -> None:
        """The write went through."""
        if self.stalled:
            log.warning("%s no longer stalled after %.0f s", self.stage, time.monotonic() - self._since)
        self.stalled, self.stalled_on, self._streak, self._since = False, "", 0, 0.0

    def values(self) -> dict[str, Any]:
        """What goes into the stage's stats file."""
        return {
            "stalled": self.stalled,
            "stalls": self.stalls,
            "write_failures": self.write_failures,
            "stalled_on": self.stalled_on,
        }
