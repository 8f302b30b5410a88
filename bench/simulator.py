"""The simulator's cost: CPU time per GPU sample, and whether one core sustains a 10,000-GPU fleet at 1 Hz.

For fleets of 1,000 and 10,000 GPUs (8 per node, the default mix) in two configurations:
- ``plain``: ``Fleet(nodes, 8)`` as the foundation's consumers use it (jobs, phases, no faults, no extras);
- ``full``: faults at an evaluation rate (``FaultPlan.for_evaluation``, every class ~5 times an hour) and every
  extra (per-link NVLink, processes, NIC ports, events): what ``hermeneut simulate`` and an evaluation publish.

Per configuration, after a warm-up: the process CPU time (``time.process_time``) of ``fleet.tick`` per round and of
``encode_samples`` over the very same batches, each the median over the measured rounds. Reported per GPU sample,
with the rounds per second one core can produce (tick + encode) and the share of the 1 s budget a round at 1 Hz
takes. Baseline, measured in the same run on the same batches: ``encode_samples`` alone (the work any producer
does to publish those samples), so ``vs encode`` says how many times the encoding the simulation itself costs.
``--calibration`` also prints the AcmeTrace comparison (``tests/unit/producers/simulator/test_calibration.py``).

Run: ``python -m bench.simulator [--quick] [--calibration] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.codec import encode_samples
from pipeline.events import SampleBatch
from producers.simulator import FaultPlan, Fleet
from producers.simulator.calibration import QUANTILES, compare_acme, format_comparison, llm_cluster_batches

GPUS_PER_NODE = 8
T0_NS = 1_790_000_000_123_456_789
TESTDATA = Path(__file__).parent.parent / "tests" / "testdata"


@dataclass(frozen=True)
class Plan:
    warmup: int  # rounds before measuring (the first round places every job)
    rounds: int  # measured rounds


FULL = Plan(warmup=5, rounds=20)
QUICK = Plan(warmup=2, rounds=5)


@dataclass
class Result:
    gpus: int
    config: str
    samples_per_round: float
    tick_us: float  # CPU µs per GPU sample
    encode_us: float
    total_us: float
    rounds_per_s: float  # one core, tick + encode
    budget_share: float  # CPU seconds per round at 1 Hz / 1 s
    vs_encode: float  # (tick + encode) / encode


def progress(msg: str) -> None:
    print(f"[bench.simulator] {msg}", flush=True)


def make_fleet(gpus: int, config: str) -> Fleet:
    nodes = gpus // GPUS_PER_NODE
    if config == "plain":
        return Fleet(nodes, GPUS_PER_NODE, seed=1)
    plan = FaultPlan.for_evaluation(nodes=nodes, seconds=3600, per_class=5)
    return Fleet(nodes, GPUS_PER_NODE, seed=1, faults=plan, extras=True)


def cpu_s(fn: object, *args: object) -> tuple[float, object]:
    start = time.process_time()
    out = fn(*args)  # type: ignore[operator]
    return time.process_time() - start, out


def encode_all(batches: list[SampleBatch]) -> None:
    for batch in batches:
        encode_samples(batch)


def measure(gpus: int, config: str, plan: Plan) -> Result:
    fleet = make_fleet(gpus, config)
    for r in range(plan.warmup):
        fleet.tick(T0_NS + r * 1_000_000_000)
    ticks, encodes, samples = [], [], []
    for r in range(plan.warmup, plan.warmup + plan.rounds):
        gc.collect()  # a collection inside one timing would be charged to whichever step it fell in
        t, batches = cpu_s(fleet.tick, T0_NS + r * 1_000_000_000)
        assert isinstance(batches, list)
        e, _ = cpu_s(encode_all, batches)
        ticks.append(t)
        encodes.append(e)
        samples.append(sum(len(b.samples) for b in batches))
    n = statistics.median(samples)
    tick, encode = statistics.median(ticks), statistics.median(encodes)
    return Result(
        gpus=gpus,
        config=config,
        samples_per_round=n,
        tick_us=tick / n * 1e6,
        encode_us=encode / n * 1e6,
        total_us=(tick + encode) / n * 1e6,
        rounds_per_s=1 / (tick + encode),
        budget_share=tick + encode,
        vs_encode=(tick + encode) / encode,
    )


def table(results: list[Result]) -> str:
    lines = [
        f"{'GPUs':>7} {'config':7} {'tick µs':>8} {'encode µs':>10} {'total µs':>9} {'rounds/s':>9} "
        f"{'1 Hz budget':>12} {'vs encode':>10}"
    ]
    for r in results:
        lines.append(
            f"{r.gpus:>7,} {r.config:7} {r.tick_us:8.1f} {r.encode_us:10.1f} {r.total_us:9.1f} {r.rounds_per_s:9.2f} "
            f"{r.budget_share:11.0%} {r.vs_encode:9.1f}x"
        )
    return "\n".join(lines)


def calibration() -> str:
    rows = csv.DictReader((TESTDATA / "acmetrace-utilization-cdfs" / "quantiles_summary.csv").open())
    reference = {
        r["series"].replace("_pct_of_80GiB", "_pct"): tuple(float(r[f"p{q}"]) for q in QUANTILES)
        for r in rows
        if "subset" not in r["series"]
    }
    batches = llm_cluster_batches(1_779_926_400_000_000_000)
    return format_comparison(compare_acme(batches, reference))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer measured rounds")
    parser.add_argument("--calibration", action="store_true", help="also print the AcmeTrace comparison")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    results = []
    for gpus in (1_000, 10_000):
        for config in ("plain", "full"):
            progress(f"{gpus:,} GPUs, {config}: {plan.warmup} warm-up + {plan.rounds} measured rounds")
            results.append(measure(gpus, config, plan))
    print()
    print(f"Simulator cost, CPU time per GPU sample (median of {plan.rounds} rounds, time.process_time);")
    print(f"baseline encode = encode_samples alone on the same batches; {os.cpu_count()} CPUs on this machine;")
    print("process_time counts every thread of this process; no GPU is involved")
    print(table(results))
    big = next(r for r in results if r.gpus == 10_000 and r.config == "full")
    verdict = "sustains" if big.budget_share < 1 else "does NOT sustain"
    print(f"\nOne core {verdict} 10,000 GPUs at 1 Hz with faults and extras: {big.budget_share:.0%} of each second.")
    if args.calibration:
        progress("calibration: 128 A100 nodes (llm-a100 mix), 8 windows of 20 min over a day, every 30 s")
        print()
        print(calibration())
    if args.json:
        args.json.write_text(json.dumps({"plan": asdict(plan), "results": [asdict(r) for r in results]}, indent=2))


if __name__ == "__main__":
    main()
