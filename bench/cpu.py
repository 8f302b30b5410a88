"""Per-process CPU accounting for the benchmarks: CPU seconds of named processes read from ``/proc``, turned into
CPU-microseconds per sample, and the machine's load to label absolute numbers with.

On a shared, noisy machine the throughput of a run depends on what else runs; the CPU time each process spends
per sample does not (much), so it is the figure the benchmarks compare and the one the ceilings are derived from:
``cores / sum of the central processes' CPU per sample`` is the rate the box could carry with nothing else on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

_TICKS: Final = os.sysconf("SC_CLK_TCK")
#: the processes that run centrally in a real deployment; the producer runs on the GPU nodes
CENTRAL: Final = ("broker", "influxd", "processor", "sink")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far; 0.0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # the command name is in parentheses and may hold spaces: count fields after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return one, five, fifteen


@dataclass
class CpuMeter:
    """CPU seconds each named process spent between :meth:`start` and :meth:`stop` (``self``: this process).

    A name may stand for several processes (two processors): their CPU is added under that name.
    """

    pids: Mapping[str, tuple[int, ...]]
    _start: dict[str, float] = field(default_factory=dict)
    _end: dict[str, float] = field(default_factory=dict)
    _t0: float = 0.0
    spent: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def _now(self) -> dict[str, float]:
        return {name: sum(_cpu(p) for p in pids) for name, pids in self.pids.items()}

    def start(self) -> CpuMeter:
        self._start, self._t0 = self._now(), time.perf_counter()
        return self

    def stop(self) -> CpuMeter:
        self._end = self._now()
        self.wall_s = time.perf_counter() - self._t0
        self.spent = {name: self._end[name] - self._start[name] for name in self.pids}
        self.load = load_average()
        return self

    def since_stop(self, name: str) -> float:
        """CPU seconds ``name`` has spent since :meth:`stop` (work a phase left behind, counted after it)."""
        return sum(_cpu(p) for p in self.pids[name]) - self._end[name]


def _cpu(pid: int) -> float:
    if pid == os.getpid():
        t = os.times()
        return t.user + t.system
    return cpu_seconds(pid)


def per_sample_us(spent: Mapping[str, float], samples: Mapping[str, int] | int) -> dict[str, float]:
    """CPU-microseconds per sample of each process; ``samples`` is one count for all, or one per process (a
    processor is charged for what it processed, a sink for what it stored)."""
    out = {}
    for name, seconds in spent.items():
        n = samples if isinstance(samples, int) else samples.get(name, 0)
        out[name] = seconds * 1e6 / n if n else float("nan")
    return out


def central_sum(us: Mapping[str, float]) -> float:
    """The CPU per sample of the central processes together (the producer runs on the nodes)."""
    return sum(us.get(name, 0.0) for name in CENTRAL)


def ceiling(us_per_sample: float, cores: int | None = None) -> float:
    """Samples/s the machine's cores could carry at this CPU cost per sample, with nothing else running."""
    return (cores or os.cpu_count() or 1) * 1e6 / us_per_sample if us_per_sample > 0 else float("inf")


def cpu_table(title: str, us: dict[str, float], extra: str = "") -> None:
    """A phase's CPU-us per sample of each process, the central sum and the rate it implies."""
    print(f"  {title}: CPU-us per sample" + (f" ({extra})" if extra else ""))
    for name in (*CENTRAL, "producer"):
        if name in us:
            print(f"    {name:12} {us[name]:8.1f}")
    total = central_sum(us)
    print(f"    {'central sum':12} {total:8.1f}   => ceiling {ceiling(total):,.0f} samples/s on {os.cpu_count()} cores")
