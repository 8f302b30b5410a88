"""What the NVML collector costs: CPU time per GPU-sample, next to the bare NVML calls it makes, plus encoding.

For each configuration, on the NVML replay of producers/nvml/replay.py (devices replaying the real nvidia-smi captures
of tests/testdata; no GPU on the benchmark machine):

- *collector*: ``NvmlCollector.collect`` (NVML calls + mapping into GpuSample, rates, processes, NVLink), and the
  event drain of ``EventWatcher`` (one NVML call per round);
- *bare NVML calls*: the baseline, measured in the same run: the exact list of NVML calls one collector round
  made (recorded by the fake), replayed without any mapping;
- *encode*: ``encode_samples`` of the round's SampleBatch (what the agent adds before publishing);
- *AER*: ``AerReader.read`` of every GPU (its three AER files and its upstream port's, the kernel's sample output
  of tests/testdata/linux-pci-aer-stats, in a sysfs-like tree under a temporary folder: a regular file system, so
  the kernel's formatting of real sysfs attributes is not in it).

CPU time is the process's (``time.process_time``), over many rounds after four warm-up rounds (so unsupported
readings are already cached, as in steady state). Real NVML calls go into the driver and cost more than the
fake's, so on a GPU node the bare-call time is larger and our share smaller than the ratio here says: the ratio
is an upper bound of our overhead.

``--real`` measures this node's GPUs through the real ``pynvml`` instead (on a GPU node): the same columns, the
bare calls recorded from one round of a second collector reading through a recording proxy, AER from the real
``/sys`` (its rows are cumulative CPU of the process, so the driver's work inside each call is counted).

Run: ``python -m bench.collector [--rounds N] [--real] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from pipeline.codec import encode_samples
from pipeline.config import CollectorSettings
from pipeline.events import SampleBatch
from producers.nvml import NvmlCollector
from producers.nvml.aer import AerReader
from producers.nvml.capture import CapturedGpu, CapturedLink, parse_capture
from producers.nvml.collector import Costly
from producers.nvml.events import EventWatcher
from producers.nvml.replay import ReplayNvml

T0 = 1_763_790_000_123_456_789
TESTDATA = Path(__file__).resolve().parent.parent / "tests" / "testdata"
CAPTURES = TESTDATA / "nvidia-smi-xml"
AER_FILES = TESTDATA / "linux-pci-aer-stats"
MIX = (
    "rtx-3080-v13.xml",
    "a10g.xml",
    "rtx-3090-v12.xml",
    "3090-v13.xml",
    "rtx-4000-sff-ada-v13.xml",
    "rtx-3060-v12.xml",
    "quadro-p2000-v12.xml",
    "gt-1030.xml",
)


def mixed_node() -> list[CapturedGpu]:
    """Eight different real captures (no NVLink, sampled PCIe throughput)."""
    return [parse_capture(CAPTURES / name)[0] for name in MIX]


def nvlink_node() -> list[CapturedGpu]:
    """Eight A10G captures with 18 NVLinks each through 4 switches and PCIe byte counters: an HGX-like load."""
    base = parse_capture(CAPTURES / "a10g.xml")[0]
    gpus = []
    for i in range(8):
        values = dict(base.values) | {"pcie.tx_bytes": 10**9, "pcie.rx_bytes": 10**9, "energy_mj": 10**9}
        links = [
            CapturedLink(f"00000000:0{link % 4 + 5}:00.0", remote_type=pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
            for link in range(18)
        ]
        gpus.append(
            dataclasses.replace(
                base, uuid=f"GPU-{i:08x}", pci_bus_id=f"00000000:{i + 16:02X}:00.0", values=values, links=links
            )
        )
    return gpus


@dataclass
class Row:
    config: str
    gpus: int
    rounds: int
    nvml_calls_per_gpu: float
    collector_us: float
    events_us: float
    bare_calls_us: float
    ratio: float
    encode_us: float
    aer_us: float


def _cpu_per_sample(fn: Callable[[], Any], rounds: int, samples_per_round: int) -> float:
    start = time.process_time()
    for _ in range(rounds):
        fn()
    return (time.process_time() - start) / (rounds * samples_per_round) * 1e6


class Recording:
    """An NVML module whose ``nvml*`` calls are appended to :attr:`record` while it is a list (a real ``pynvml``
    recorded as the replay's fake records itself)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self.record: list[tuple[str, tuple[Any, ...]]] | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._nvml, name)
        if not name.startswith("nvml") or not callable(attr):
            return attr

        def call(*args: Any) -> Any:
            if self.record is not None:
                self.record.append((name, args))
            return attr(*args)

        return call


def _costly(every: int) -> Costly | None:
    """The collector's costly readings every ``every`` rounds, over the settings' default bound."""
    return Costly(CollectorSettings().costly_read_us, every) if every > 1 else None


def _round_calls(nvml: Any, ts: Iterator[int], costly_every: int) -> list[tuple[str, tuple[Any, ...]]]:
    """The NVML calls of ``costly_every`` steady-state rounds (after four warm-up rounds: the collector times its
    readings in rounds 2-4) of a collector reading ``nvml``."""
    recording = Recording(nvml) if not isinstance(nvml, ReplayNvml) else nvml
    collector = NvmlCollector(recording, "bench", "node-1", costly=_costly(costly_every))
    collector.open()
    for _ in range(4):
        collector.collect(next(ts))
    recording.record = []
    for _ in range(costly_every):
        collector.collect(next(ts))
    calls, recording.record = recording.record, None
    return calls


def measure(config: str, nvml: Any, rounds: int, sysfs: Path | None = None, costly_every: int = 1) -> Row:
    """``nvml``: a :class:`ReplayNvml` (AER from a temporary sysfs-like tree) or the real ``pynvml`` (AER from
    ``sysfs``); ``costly_every``: the collector's (1: every reading every round)."""
    ts = iter(range(T0, T0 + (rounds + costly_every + 20) * 10**9, 10**9))
    calls = _round_calls(nvml, ts, costly_every)
    collector = NvmlCollector(nvml, "bench", "node-1", costly=_costly(costly_every))
    collector.open()
    watcher = EventWatcher(nvml, "bench", "node-1")
    watcher.open(collector.devices)
    for _ in range(4):
        samples, _ = collector.collect(next(ts))
    n = len(samples)

    def replay() -> None:
        for name, args in calls:
            with contextlib.suppress(pynvml.NVMLError):
                getattr(nvml, name)(*args)

    def round_() -> None:
        collector.collect(next(ts))

    buses = [d.pci_bus_id for d in collector.devices]
    with tempfile.TemporaryDirectory() as folder:
        aer = AerReader(sysfs or _aer_tree(Path(folder), buses))
        aer_us = _cpu_per_sample(lambda: [aer.read(bus) for bus in buses], rounds, n)
        aer.close()
    batch = SampleBatch("bench", "node-1", tuple(samples))
    collector_us = _cpu_per_sample(round_, rounds, n)
    events_us = _cpu_per_sample(lambda: watcher.drain(T0), rounds, n)
    bare_us = _cpu_per_sample(replay, max(rounds // costly_every, 1), n * costly_every)
    encode_us = _cpu_per_sample(lambda: encode_samples(batch), rounds, n)
    calls_per_gpu = len(calls) / n / costly_every
    ratio = collector_us / bare_us
    return Row(config, n, rounds, calls_per_gpu, collector_us, events_us, bare_us, ratio, encode_us, aer_us)


def _aer_tree(root: Path, buses: Sequence[str]) -> Path:
    """Each GPU behind a port of its own (``/sys/devices/pci.../<port>/<gpu>``, linked from bus/pci/devices), both
    with the kernel's sample AER files."""
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for i, bus in enumerate(dict.fromkeys(buses)):  # two captures may share a bus id
        port = root / "devices" / f"pci0000:{i:02x}" / f"0000:{i:02x}:01.0"
        gpu = port / bus
        gpu.mkdir(parents=True)
        for folder in (port, gpu):
            for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
                shutil.copy(AER_FILES / name, folder / name)
        (links / bus).symlink_to(os.path.relpath(gpu, links))
    return root


def _real_config() -> str:
    """What the real NVML sees: ``1 x NVIDIA H100 80GB HBM3 (driver 580.159.04)``."""
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        names = sorted({pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)})
        return f"{count} x {'/'.join(names)} (driver {pynvml.nvmlSystemGetDriverVersion()})"
    finally:
        pynvml.nvmlShutdown()


def table(rows: Sequence[Row]) -> str:
    head = (
        f"{'configuration':34} {'NVML calls/GPU':>14} {'collector µs':>12} {'events µs':>9} "
        f"{'bare calls µs':>13} {'ratio':>6} {'encode µs':>9} {'AER µs':>6} {'µs total':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        total = r.collector_us + r.events_us + r.encode_us + r.aer_us
        lines.append(
            f"{r.config:34} {r.nvml_calls_per_gpu:14.0f} {r.collector_us:12.1f} {r.events_us:9.2f} "
            f"{r.bare_calls_us:13.1f} {r.ratio:6.2f} {r.encode_us:9.1f} {r.aer_us:6.1f} {total:8.1f}"
        )
    lines.append("(CPU µs per GPU-sample; ratio = collector / bare NVML calls of the same round, same run)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.collector", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--real", action="store_true", help="this node's GPUs through the real pynvml")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.real:
        every = max(1, round(CollectorSettings().costly_read_interval_s))  # at 1 Hz
        rows = [
            measure(f"{_real_config()}, all every round", pynvml, args.rounds, Path("/sys")),
            measure(f"costly readings every {every} rounds", pynvml, args.rounds, Path("/sys"), every),
        ]
    else:
        rows = [
            measure("8 captured GPUs (mix, no NVLink)", ReplayNvml(mixed_node()), args.rounds),
            measure("8 GPUs x 18 NVLinks (HGX-like)", ReplayNvml(nvlink_node()), max(args.rounds // 4, 50)),
        ]
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
