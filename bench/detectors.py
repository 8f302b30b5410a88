"""What the detectors cost the processor: samples per second per core with and without them, on the same batches.

A simulated fleet (``Fleet(128, 8, seed=2)``: 1,024 GPUs, one message per node round, every GPU with a job
context so the straggler peer groups are formed) is encoded once. The baseline is the processor's own per-batch
work, ``processors.normalize.process_raw`` (decode, validate, normalize); the measured run is ``process_raw``
followed by ``Detectors.apply`` (and ``tick``) on its output, as ``processors/app.py`` runs them. Two shapes of
batch: *live* (one round of every node per batch: 128 messages, what a processor sees at 1 Hz) and *replay*
(500 messages per batch, the processor's ``BATCH_MAX``, several rounds of each node: what a fast-forward replay
or a catch-up after a stall gives). Reported: samples/s per core for both, the ratio, and the detectors' own
microseconds per sample. Single process, ``time.process_time`` (CPU time, so other load on the machine does not
count), best of ``--repeats``.

Run: ``python -m bench.detectors [--rounds 120] [--repeats 3] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pipeline.codec import encode_samples
from pipeline.config import DetectorSettings, ValidationSettings
from pipeline.events import InterpretedBatch, Workload
from processors.detectors.stage import Detectors
from processors.normalize import RawMessage, process_raw
from producers.simulator.fleet import Fleet

NODES, GPUS, SEED = 128, 8, 2
BATCH_MAX = 500
APPS = {
    "llm-training": "llm-pretraining",
    "llm-inference": "llm-serving",
    "resnet-training": "resnet-training",
    "stable-diffusion-inference": "stable-diffusion-inference",
    "idle": "idle",
}


@dataclass
class Result:
    shape: str
    batches: int
    samples: int
    normalize_samples_per_s: float
    with_detectors_samples_per_s: float
    ratio: float
    detectors_us_per_sample: float


def messages(rounds: int) -> tuple[list[RawMessage], int]:
    fleet = Fleet(NODES, GPUS, cluster="bench", seed=SEED)
    t0 = time.time_ns() - rounds * 1_000_000_000
    out = []
    for r in range(rounds):
        for b in fleet.tick(t0 + r * 1_000_000_000):
            out.append(RawMessage(b.kafka_key, encode_samples(b), f"raw/0/{len(out)}", 0))
    return out, t0


def workloads(fleet_profiles: dict[str, str], batch: InterpretedBatch) -> InterpretedBatch:
    """The job context the Enricher would attach: one job per node, as the simulated fleet places them."""
    wl = tuple(
        Workload(fleet_profiles[u], job_id=f"job-{n}", source="simulator", job_gpus=GPUS)
        for u, n in zip(batch.gpu_uuid, batch.node, strict=True)
    )
    return replace(batch, workload=wl)


def run(msgs: list[RawMessage], per_batch: int, with_detectors: bool, profiles: dict[str, str]) -> float:
    """CPU seconds to process every message in batches of ``per_batch``."""
    limits = ValidationSettings()
    det = Detectors(DetectorSettings())
    now = time.time_ns()
    # the context join is the Enricher's cost, not ours: prepared outside the timed part
    chunks = [msgs[i : i + per_batch] for i in range(0, len(msgs), per_batch)]
    gc.collect()  # as bench.simulator does: a collection of what came before is not this run's cost
    start = time.process_time()
    for chunk in chunks:
        outcome = process_raw(chunk, now, limits)
        if with_detectors:
            for _part, batch in outcome.forward:
                det.apply(workloads(profiles, batch), now)
            det.tick(now)
    return time.process_time() - start


def context_cost(msgs: list[RawMessage], per_batch: int, profiles: dict[str, str]) -> float:
    """CPU seconds of the context attachment alone (subtracted from the with-detectors run)."""
    limits = ValidationSettings()
    now = time.time_ns()
    batches = [
        b for i in range(0, len(msgs), per_batch) for _p, b in process_raw(msgs[i : i + per_batch], now, limits).forward
    ]
    gc.collect()
    start = time.process_time()
    for b in batches:
        workloads(profiles, b)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    msgs, _t0 = messages(args.rounds)
    fleet = Fleet(NODES, GPUS, cluster="bench", seed=SEED)
    profiles = {u: APPS[p.name] for u, p in zip(fleet.uuids, fleet.profile, strict=True)}
    samples = args.rounds * NODES * GPUS
    results = []
    for shape, per_batch in (("live", NODES), ("replay", BATCH_MAX)):
        base = min(run(msgs, per_batch, False, profiles) for _ in range(args.repeats))
        ctx = min(context_cost(msgs, per_batch, profiles) for _ in range(args.repeats))
        full = min(run(msgs, per_batch, True, profiles) for _ in range(args.repeats)) - ctx
        results.append(
            Result(
                shape,
                -(-len(msgs) // per_batch),
                samples,
                samples / base,
                samples / full,
                base / full,
                (full - base) / samples * 1e6,
            )
        )
    print(f"{NODES} nodes x {GPUS} GPUs, {args.rounds} rounds ({samples} samples), best of {args.repeats}, CPU time")
    print(f"{'batches':10} {'normalize':>16} {'+ detectors':>16} {'ratio':>7} {'detectors':>14}")
    for r in results:
        print(
            f"{r.shape:10} {r.normalize_samples_per_s:>12,.0f} s/s {r.with_detectors_samples_per_s:>12,.0f} s/s "
            f"{r.ratio:>7.2f} {r.detectors_us_per_sample:>9.1f} us/s."
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
