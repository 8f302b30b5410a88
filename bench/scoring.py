"""Interpretation throughput: GPU samples/s per core of the processor's own work with and without the
interpretation stages, on the same batches, in one run.

    python -m bench.scoring [--nodes 125] [--gpus 8] [--rounds 40] [--withheld 0.2] [--json out.json]

1. A simulated fleet is learned first from 10 minutes of its history with the true applications, as
   ``hermeneut baselines train`` would: baselines per (application, GPU model, phase), priors, the classifier
   (processors.baselines.fit.fit_version).
2. The next rounds of the same fleet are encoded as raw node messages and cut into takes of 500 messages, the
   processor's batch (processors.app.BATCH_MAX).
3. Baseline: ``process_raw`` alone (decode, validate, normalize). Measured: ``process_raw`` then the stages
   ``build_interpreter`` runs (processors.app.interpreter_from: enrichment, scoring, detectors), and the same
   without the detectors, over the same takes, the context mirror holding each take's jobs. A
   share of the GPUs (``--withheld``) has no context, so the classifier path is part of the cost. CPU time of
   this one process (one core); best of 3.
Also reported: the verdicts on this normal fleet (false alarms) and the inferred applications' accuracy.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.baselines import BaselineManifest, BaselineRecord, ClassifierRecord
from pipeline.codec import encode_samples
from pipeline.config import Settings, ValidationSettings
from pipeline.events import GpuContext, InterpretedBatch, Verdict, Workload, gpu_key, node_key
from pipeline.topology import NodeTopology
from processors.app import BATCH_MAX, interpreter_from
from processors.baselines.fit import LabelledRows, fit_version
from processors.baselines.store import BaselineSet
from processors.features import features, infer_phase
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet

T0 = 1_800_000_000_000_000_000
#: rounds (seconds) of history the baselines learn from before the measured rounds
LEARN_ROUNDS = 600


def history(fleet: Fleet, rounds: int, start_ns: int) -> tuple[list[list[RawMessage]], list[dict[str, str]]]:
    """``rounds`` of the fleet as takes of raw node messages, and each round's true application per GPU."""
    msgs: list[RawMessage] = []
    truth: list[dict[str, str]] = []
    for r in range(rounds):
        msgs += [
            RawMessage(b.kafka_key, encode_samples(b), "bench", i % 6)
            for i, b in enumerate(fleet.tick(start_ns + r * 10**9))
        ]
        truth.append(dict(zip(fleet.uuids, fleet.applications(), strict=True)))
    return [msgs[i : i + BATCH_MAX] for i in range(0, len(msgs), BATCH_MAX)], truth


def learned(fleet: Fleet, rounds: int) -> BaselineSet:
    """Baselines and classifier learned from ``rounds`` of the fleet's history (its true applications)."""
    manifest, records, classifier = fitted(fleet, rounds)
    return BaselineSet(manifest, records, classifier)


def fitted(fleet: Fleet, rounds: int) -> tuple[BaselineManifest, list[BaselineRecord], ClassifierRecord | None]:
    """What ``hermeneut baselines train`` would publish after ``rounds`` of the fleet's history (version 1)."""
    work, truth = history(fleet, rounds, T0)
    batches = [b for take in work for _, b in process_raw(take, T0 + rounds * 10**9, ValidationSettings()).forward]
    f = np.vstack([features(b.metrics, b.relative, b.gpu_model) for b in batches])
    ts = np.concatenate([b.ts_ns for b in batches])
    uuids = np.array([u for b in batches for u in b.gpu_uuid])
    rounds_of = ((ts - T0) // 10**9).tolist()
    apps = np.array([truth[r][u] for r, u in zip(rounds_of, uuids.tolist(), strict=True)])
    models = np.array([m for b in batches for m in b.gpu_model])
    gpu = np.unique(uuids, return_inverse=True)[1]
    phase = infer_phase(f)
    parts = [
        LabelledRows(str(a), str(m), f[sel], phase[sel], gpu[sel], ts[sel])
        for a in np.unique(apps)
        for m in np.unique(models)
        if (sel := (apps == a) & (models == m)).any()
    ]
    version = fit_version(parts, 1, T0, 300, 30, 0.6)
    manifest = BaselineManifest(1, T0, T0, T0, tuple(r.baseline_id for r in version.records), classifier=True)
    return manifest, version.records, version.classifier


def _contexts(fleet: Fleet, apps: dict[str, str], withheld: set[str]) -> dict[bytes, GpuContext]:
    """The context topic's content for these applications per GPU (None where idle), less the withheld GPUs."""
    node = dict(zip(fleet.uuids, (n for n in fleet.nodes for _ in range(fleet.gpus_per_node)), strict=True))
    return {
        gpu_key(fleet.cluster, node[u], u): GpuContext(
            fleet.cluster, node[u], u, T0, None if app == "idle" else Workload(app, source="bench", confidence=1.0)
        )
        for u, app in apps.items()
        if u not in withheld
    }


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
    baselines = learned(fleet, LEARN_ROUNDS)
    fit_s = time.perf_counter() - t
    start_ns = T0 + LEARN_ROUNDS * 10**9
    work, truth = history(fleet, args.rounds, start_ns)
    samples = fleet.size * args.rounds
    now = start_ns + args.rounds * 10**9
    limits = Settings().validation
    rng = np.random.default_rng(0)
    withheld = set(np.array(fleet.uuids)[rng.random(fleet.size) < args.withheld].tolist())
    # what the context mirror holds while each take is processed: the jobs of the take's last round
    per_take = [
        _contexts(fleet, truth[min(len(truth) - 1, (i + 1) * len(take) // len(fleet.nodes))], withheld)
        for i, take in enumerate(work)
    ]
    mirrored: list[dict[bytes, GpuContext]] = [per_take[0]]
    topologies = {t.kafka_key: t for t in fleet.topologies(now)}

    def topology_of(cluster: str, node: str) -> NodeTopology | None:
        return topologies.get(node_key(cluster, node))

    def context_of(key: bytes) -> GpuContext | None:
        return mirrored[0].get(key)

    def normalize_only() -> None:
        for take in work:
            process_raw(take, now, limits)

    results: list[InterpretedBatch] = []

    def interpret(stages: int | None = None) -> None:
        interpreter = interpreter_from(Settings(), context_of, topology_of, lambda: baselines)
        interpreter.stages = interpreter.stages[:stages]
        results.clear()
        for take, contexts in zip(work, per_take, strict=True):
            mirrored[0] = contexts
            for _, batch in process_raw(take, now, limits).forward:
                results.append(interpreter.apply(batch, now)[0])

    stages = [type(s).__name__ for s in interpreter_from(Settings(), context_of, topology_of, lambda: baselines).stages]
    base_s, scored_s = _cpu(normalize_only), _cpu(lambda: interpret(2))
    full_s = _cpu(interpret)
    verdicts = [v for b in results for v in b.verdict]
    inferred = [
        (w.application, truth[(ts - start_ns) // 10**9][u])
        for b in results
        for u, w, ts in zip(b.gpu_uuid, b.workload, b.ts_ns.tolist(), strict=True)
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
        "enrich_score_samples_per_core_s": round(samples / scored_s),
        "interpret_samples_per_core_s": round(samples / full_s),
        "ratio_enrich_score": round(base_s / scored_s, 3),
        "ratio": round(base_s / full_s, 3),
        "enrich_score_us_per_sample": round((scored_s - base_s) / samples * 1e6, 2),
        "interpretation_us_per_sample": round((full_s - base_s) / samples * 1e6, 2),
        "verdicts": {v.value: verdicts.count(v) / len(verdicts) for v in Verdict},
        "inferred_rows": len(inferred),
        "inferred_accuracy": round(float(np.mean([a == b for a, b in inferred])), 4) if inferred else None,
    }
    print(f"fleet {fleet.size} GPUs, {samples} samples in {len(work)} takes; stages {', '.join(stages)}")
    print(f"learned {out['baselines']} baselines + classifier in {fit_s:.1f}s")
    print(f"normalize alone                      {out['normalize_samples_per_core_s']:>10,} samples/s per core")
    print(
        f"normalize + enrich + score           {out['enrich_score_samples_per_core_s']:>10,} samples/s per core"
        f"  ratio {out['ratio_enrich_score']:.3f} ({out['enrich_score_us_per_sample']} us per sample)"
    )
    print(
        f"normalize + enrich + score + detect  {out['interpret_samples_per_core_s']:>10,} samples/s per core"
        f"  ratio {out['ratio']:.3f} ({out['interpretation_us_per_sample']} us per sample)"
    )
    print("verdicts on a normal fleet: " + ", ".join(f"{k} {v:.2%}" for k, v in out["verdicts"].items()))
    print(f"inferred application accuracy {out['inferred_accuracy']} over {len(inferred)} rows without context")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
