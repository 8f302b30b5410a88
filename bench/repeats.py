"""How often a reading repeats its GPU's previous value: what writing readings only on change would save InfluxDB.

The sink writes every moving reading of every sample and the states and counters only when they change
(sinks/influxdb/lines.py). influxd's cost is per field value (docs/performance.md), so for each moving reading this
counts the samples that carry it and, of those, the ones equal to the same GPU's previous value of it, and sums
what a sample would write if moving readings were written on change too, refreshed at each GPU's first sample of
every 10 minutes as the states are. Sources:

- a real H100 read through hermeneut's NVML source at 1 Hz (tests/testdata/nvml-h100-lent: 15 s idle, 45 s of a
  matmul at the 700 W limit, 15 s idle; every reading every round);
- a real 8-GPU nanoGPT training run's nvidia-smi series (tests/testdata/nanogpt-pr643-h100x8-nvsmi-timeseries,
  through the ``table`` importer; read every ~0.33 s, thinned here to a sample per GPU and second; three readings);
- the simulated fleet of ``bench.pipeline``'s raw write (1,000 GPUs), ``--rounds`` seconds of it.

Run: ``python -m bench.repeats [--rounds 120]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bench.fields import MOVING
from bench.pipeline import raw_fleet
from producers.importers.table import TableConfig, TableImporter
from sinks.influxdb.lines import INFO_REFRESH_NS

TESTDATA: Final = Path(__file__).resolve().parent.parent / "tests" / "testdata"
LENT: Final = TESTDATA / "nvml-h100-lent" / "readings.jsonl"
NANOGPT: Final = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
#: a GPU sample as this benchmark needs it: the GPU, its time, its readings
Reading = tuple[str, int, Mapping[str, float]]


@dataclass(frozen=True)
class Repeats:
    """Of ``samples`` samples, per reading: how many carried it and how many of those repeated the GPU's
    previous value of it; ``refreshes`` is how many (GPU, reading) values a 10-minute refresh would write again."""

    samples: int
    carried: Mapping[str, int]
    unchanged: Mapping[str, int]
    refreshes: int

    def written_now(self) -> float:
        """Moving fields per sample the sink writes today."""
        return sum(self.carried.values()) / max(self.samples, 1)

    def written_on_change(self) -> float:
        """Moving fields per sample if each were written only when it changed, plus the 10-minute refresh."""
        changed = sum(self.carried.values()) - sum(self.unchanged.values())
        return (changed + self.refreshes) / max(self.samples, 1)


def repeats(samples: Iterable[Reading], names: Sequence[str] = MOVING) -> Repeats:
    """Counts over ``samples`` (each GPU's in time order): per reading in ``names``, the samples carrying it and
    those whose value equals the GPU's previous value of it (an absent reading does not break the run: on change,
    nothing is written where nothing was read). The first value of a GPU is a change; a value repeated at the
    GPU's first sample of a 10-minute period counts as a refresh."""
    wanted = frozenset(names)
    last: dict[tuple[str, str], tuple[float, int]] = {}
    carried: Counter[str] = Counter()
    unchanged: Counter[str] = Counter()
    refreshes = 0
    n = 0
    for gpu, ts_ns, metrics in samples:
        n += 1
        period = ts_ns // INFO_REFRESH_NS
        for name, value in metrics.items():
            if name not in wanted:
                continue
            carried[name] += 1
            key = (gpu, name)
            before = last.get(key)
            if before is not None and before[0] == value:
                unchanged[name] += 1
                if before[1] != period:
                    refreshes += 1
            last[key] = (value, period)
    return Repeats(n, carried, unchanged, refreshes)


def lent_h100(path: Path = LENT) -> Iterator[Reading]:
    """The lent H100's samples, as its NVML source read them."""
    with path.open() as f:
        for line in f:
            for s in json.loads(line)["samples"]:
                yield s["gpu_uuid"], int(s["ts_ns"]), s["metrics"]


def nanogpt(folder: Path = NANOGPT, every_ns: int = 10**9) -> Iterator[Reading]:
    """The nanoGPT run's samples through the ``table`` importer, a GPU's first in each ``every_ns``."""
    importer = TableImporter.from_config(
        TableConfig(paths=(folder / "gpu_metrics_f4f827dd.csv",), mapping=folder / "mapping.toml")
    )
    importer.open()
    seen: set[tuple[str, int]] = set()
    for block in importer.blocks():
        rows = block.rows
        for i, gpu in enumerate(rows.gpu_uuid):
            ts = int(rows.ts_ns[i])
            if (gpu, ts // every_ns) in seen:
                continue
            seen.add((gpu, ts // every_ns))
            yield gpu, ts, {k: float(v[i]) for k, v in rows.metrics.items() if not math.isnan(v[i])}
    importer.close()


def simulated(rounds: int) -> Iterator[Reading]:
    """``rounds`` seconds of the simulated fleet of ``bench.pipeline``'s raw write, from the start of a 10-minute
    refresh period: its first samples are the refresh, and the next comes at round 600 whatever the
    clock says (a refresh in a short run adds a whole refresh of every GPU to its count)."""
    fleet = raw_fleet("repeats")
    start = (time.time_ns() // INFO_REFRESH_NS - 1) * INFO_REFRESH_NS
    for r in range(rounds):
        for batch in fleet.tick(start + r * 10**9):
            for s in batch.samples:
                yield s.gpu_uuid, s.ts_ns, s.metrics


def table(results: Mapping[str, Repeats]) -> str:
    """Per reading and source: samples carrying it (share) and, of those, unchanged from the GPU's previous one."""

    def cells(name: str, r: Repeats) -> str:
        c = r.carried.get(name, 0)
        unchanged = f"{r.unchanged.get(name, 0) / c:>13.2f}" if c else f"{'-':>13}"
        return f"{c / max(r.samples, 1):>13.2f}{unchanged}"

    def row(label: str, values: Iterable[str]) -> str:
        return f"{label:32}" + "".join(values)

    lines = [
        row("reading", (f"{label:>26}" for label in results)),
        row("", (f"{'carried':>13}{'unchanged':>13}" for _ in results)),
    ]
    for name in MOVING:
        if any(r.carried.get(name) for r in results.values()):
            lines.append(row(name, (cells(name, r) for r in results.values())))
    lines.append(row("moving fields per sample, now", (f"{r.written_now():>26.2f}" for r in results.values())))
    lines.append(row("  written on change", (f"{r.written_on_change():>26.2f}" for r in results.values())))
    lines.append(row("samples", (f"{r.samples:>26,}" for r in results.values())))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.repeats", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=120, help="seconds of the simulated 1,000-GPU fleet")
    args = ap.parse_args(argv)
    results = {
        "H100 lent (NVML)": repeats(lent_h100()),
        "nanoGPT 8xH100 (smi)": repeats(nanogpt()),
        "simulator 1,000 GPUs": repeats(simulated(args.rounds)),
    }
    print(table(results))


if __name__ == "__main__":
    main()
