"""Interpretation throughput: GPU samples/s per core of the processor's own work with and without the
interpretation stages, on the same batches, in one run.

    python -m bench.scoring [--nodes 125] [--gpus 8] [--rounds 40] [--withheld 0.2] [--json out.json]

1. A simulated fleet is learned first, as ``hermeneut baselines train`` would from its history: baselines per
   (application, GPU model, phase), priors, the classifier (processors.learn.fit_version).
2. Fresh rounds of the same fleet are encoded as raw node messages and cut into takes of 500 messages, the
   processor's batch (processors.app.BATCH_MAX).
3. Baseline: ``process_raw`` alone (decode, validate, normalize). Measured: ``process_raw`` then the stages
   ``build_interpreter`` would run (processors.app.interpreter_from: enrichment, scoring and whatever stage
   is added there, e.g. the detectors), over the same takes. A share of the GPUs (``--withheld``) has no
   context, so the classifier path is part of the cost. CPU time of this one process (one core); best of 3.
Also reported: the verdicts on this normal fleet (false alarms) and the inferred applications' accuracy.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.baselines import BaselineManifest
from pipeline.codec import encode_samples
from pipeline.config import Settings, ValidationSettings
from pipeline.events import InterpretedBatch, Verdict
from processors.app import BATCH_MAX, interpreter_from
from processors.baselines import BaselineSet
from processors.features import features, infer_phase
from processors.learn import LabelledRows, fit_version
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet
from producers.simulator.context import application_of, fleet_contexts

T0 = 1_800_000_000_000_000_000


def learned(fleet: Fleet, rounds: int) -> BaselineSet:
    """Baselines and classifier learned from ``rounds`` of the fleet's history."""
    batches: list[InterpretedBatch] = []
    for r in range(rounds):
        now = T0 + r * 10**9
        msgs = [RawMessage(b.kafka_key, encode_samples(b), "bench") for b in fleet.tick(now)]
        batches += [b for _, b in process_raw(msgs, now, ValidationSettings()).forward]
    f = np.vstack([features(b.metrics, b.relative, b.gpu_model) for b in batches])
    uuids = np.array([u for b in batches for u in b.gpu_uuid])
    models = np.array([m for b in batches for m in b.gpu_model])
    truth = {u: application_of(fleet, i) for i, u in enumerate(fleet.uuids)}
    apps = np.array([truth[u] for u in uuids])
    ts = np.concatenate([b.ts_ns for b in batches])
    gpu = np.unique(uuids, return_inverse=True)[1]
    phase = infer_phase(f)
    parts = [
        LabelledRows(str(a), str(m), f[sel], phase[sel], gpu[sel], ts[sel])
        for a in np.unique(apps)
        for m in np.unique(models)
        if (sel := (apps == a) & (models == m)).any()
    ]
    fitted = fit_version(parts, 1, T0, 300, 30, 0.6)
    manifest = BaselineManifest(1, T0, T0, T0, tuple(r.baseline_id for r in fitted.records), classifier=True)
    return BaselineSet(manifest, fitted.records, fitted.classifier)


def takes(fleet: Fleet, rounds: int, start_ns: int) -> list[list[RawMessage]]:
    msgs = [
        RawMessage(b.kafka_key, encode_samples(b), "bench", i % 6)
        for r in range(rounds)
        for i, b in enumerate(fleet.tick(start_ns + r * 10**9))
    ]
    return [msgs[i : i + BATCH_MAX] for i in range(0, len(msgs), BATCH_MAX)]


def _cpu(run: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--withheld", type=float, default=0.2, help="share of GPUs without context")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    fleet = Fleet(args.nodes, args.gpus, seed=11)
    t = time.perf_counter()
    baselines = learned(fleet, 120)
    fit_s = time.perf_counter() - t
    start_ns = T0 + 1000 * 10**9
    work = takes(fleet, args.rounds, start_ns)
    samples = fleet.size * args.rounds
    now = start_ns + args.rounds * 10**9
    limits = Settings().validation
    rng = np.random.default_rng(0)
    withheld = set(np.array(fleet.uuids)[rng.random(fleet.size) < args.withheld].tolist())
    contexts = {c.kafka_key: c for c in fleet_contexts(fleet, start_ns) if c.gpu_uuid not in withheld}

    def normalize_only() -> None:
        for take in work:
            process_raw(take, now, limits)

    results: list[InterpretedBatch] = []

    def interpret() -> None:
        interpreter = interpreter_from(Settings(), contexts.get, lambda: baselines)
        results.clear()
        for take in work:
            for _, batch in process_raw(take, now, limits).forward:
                results.append(interpreter.apply(batch, now)[0])

    base_s, full_s = _cpu(normalize_only), _cpu(interpret)
    stages = [type(s).__name__ for s in interpreter_from(Settings(), contexts.get, lambda: baselines).stages]
    verdicts = [v for b in results for v in b.verdict]
    truth = {u: application_of(fleet, i) for i, u in enumerate(fleet.uuids)}
    inferred = [
        (w.application, truth[u])
        for b in results
        for u, w in zip(b.gpu_uuid, b.workload, strict=True)
        if w is not None and w.source == "inferred"
    ]
    out = {
        "gpus": fleet.size,
        "samples": samples,
        "takes": len(work),
        "stages": stages,
        "baselines": len(baselines.baselines),
        "fit_s": round(fit_s, 2),
        "normalize_samples_per_core_s": round(samples / base_s),
        "interpret_samples_per_core_s": round(samples / full_s),
        "ratio": round(base_s / full_s, 3),
        "interpretation_us_per_sample": round((full_s - base_s) / samples * 1e6, 2),
        "verdicts": {v.value: verdicts.count(v) / len(verdicts) for v in Verdict},
        "inferred_rows": len(inferred),
        "inferred_accuracy": round(float(np.mean([a == b for a, b in inferred])), 4) if inferred else None,
    }
    print(f"fleet {fleet.size} GPUs, {samples} samples in {len(work)} takes; stages {', '.join(stages)}")
    print(f"learned {out['baselines']} baselines + classifier in {fit_s:.1f}s")
    print(f"normalize alone           {out['normalize_samples_per_core_s']:>10,} samples/s per core")
    print(f"normalize + interpretation {out['interpret_samples_per_core_s']:>10,} samples/s per core")
    print(f"ratio {out['ratio']:.3f} ({out['interpretation_us_per_sample']} us of interpretation per sample)")
    print("verdicts on a normal fleet: " + ", ".join(f"{k} {v:.2%}" for k, v in out["verdicts"].items()))
    print(f"inferred application accuracy {out['inferred_accuracy']} over {len(inferred)} rows without context")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
