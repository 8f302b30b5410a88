"""Sampling profiles of running stages for the benchmarks: py-spy attached to a process for a while, and the
functions that spent the most time themselves (self time: the innermost frame of each sample).

py-spy reads the target's memory from outside (ptrace), so the profiled process runs unchanged; ``--nonblocking``
does not even pause it, at the price of an occasional torn stack.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

#: py-spy's collapsed-stack line: ``frame;frame;...;frame count``, a frame ``function (file:line)``
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^():]+)(?::\d+)?\)$")


def record(pid: int, seconds: float, out: Path, rate: int = 100) -> subprocess.Popen[bytes]:
    """Start profiling ``pid`` for ``seconds`` into ``out`` (collapsed stacks); wait on the returned process."""
    beside = Path(sys.executable).parent / "py-spy"  # the venv's, when its bin is not on PATH
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy; it is in the dev extras)")
    argv = [spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(rate)]
    argv += ["--format", "raw", "--output", str(out), "--nonblocking"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def self_time(path: Path, top: int = 10) -> list[tuple[str, float]]:
    """The ``top`` functions by self time, as (``function (file)``, share of all samples)."""
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        leaf = m["stack"].rsplit(";", 1)[-1]
        f = _FRAME.match(leaf)
        name = f"{f['function']} ({_short(f['file'])})" if f else leaf
        counts[name] += int(m["count"])
    total = sum(counts.values()) or 1
    return [(name, n / total) for name, n in counts.most_common(top)]


def _short(file: str) -> str:
    """A path from the package on (``site-packages/`` and the repository root dropped)."""
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in file:
            return file.split(marker, 1)[1]
    parts = Path(file).parts
    for root in ("hermeneut", "pipeline", "processors", "sinks", "alerting", "producers"):
        if root in parts:
            return "/".join(parts[parts.index(root) :])
    return file
