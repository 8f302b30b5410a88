"""Query latency benchmark: the same plans on Flux and on InfluxQL, the questions as the CLI asks them, and the
cost of the storage tasks, on a fresh local influxd holding a simulated fleet.

    python -m bench.queries [--nodes 16] [--seconds 3600] [--repeat 5] [--json out.json]

The data are the sink's own line protocol for ``--nodes`` x 8 GPUs sampled at 1 Hz for ``--seconds``, with
workloads (one job per node, a new one every 20 minutes), a few percent unusual/anomalous verdicts. Each
timing is the median of ``--repeat`` runs after one warm-up. Ratios: each plan's Flux time over its InfluxQL
time, both measured here, and every question against the fastest full read of the data (a pushed-down Flux
``count()`` of one field over the whole range, the floor any query over all samples pays).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from pipeline.codec import encode_samples
from pipeline.config import InfluxSettings, Settings, load_settings
from pipeline.events import Verdict, Workload
from pipeline.services import influxdb
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet
from sinks.influxdb.lines import batch_lines
from sinks.influxdb.schema import GPU
from sinks.influxdb.write import InfluxWriter
from sinks.query import (
    COMPARE_FEATURES,
    AnomalyQuery,
    CompareJobQuery,
    CompareModelsQuery,
    Scope,
    Store,
    TopQuery,
    TrendQuery,
    anomalies,
    compare_job,
    compare_models,
    top,
    trend,
)
from sinks.query.model import (
    BENIGN_MASKS,
    Aggregate,
    Expr,
    FieldEquals,
    Filter,
    Fn,
    TagIn,
    TimeRange,
    ValueBelow,
    ValueNotIn,
)
from sinks.query.output import iso
from sinks.retention import run_task, setup, task_specs

NS = 1_000_000_000
#: the simulator's profiles as application classes
APPLICATION = {
    "llm-training": "llm-pretraining",
    "llm-inference": "llm-serving",
    "resnet-training": "resnet-training",
    "stable-diffusion-inference": "stable-diffusion-inference",
}
JOB_S = 1200


def load(writer: InfluxWriter, nodes: int, seconds: int, start_ns: int) -> tuple[Fleet, int]:
    """Write the data set; returns the fleet and the number of points."""
    fleet = Fleet(nodes, 8, cluster="bench", seed=5)
    rng = np.random.default_rng(5)
    verdicts = np.array([Verdict.NORMAL, Verdict.UNUSUAL, Verdict.ANOMALOUS], dtype=object)
    profile = {u: p.name for u, p in zip(fleet.uuids, fleet.profile, strict=True)}
    points = 0
    pending: list[str] = []
    for r in tqdm(range(seconds), desc="writing the data set (s of fleet time)", unit="", mininterval=1):
        ts = start_ns + r * NS
        msgs = [RawMessage(b.kafka_key, encode_samples(b), "bench") for b in fleet.tick(ts)]
        for _, b in process_raw(msgs, ts + NS, Settings().validation).forward:
            wl = tuple(
                Workload(APPLICATION[profile[u]], job_id=f"{node}-{r // JOB_S}", user="bench", source="slurm")
                if profile[u] in APPLICATION
                else None
                for u, node in zip(b.gpu_uuid, b.node, strict=True)
            )
            picked = verdicts[rng.choice(3, size=len(b), p=[0.93, 0.05, 0.02])]
            pending += batch_lines([dataclasses.replace(b, workload=wl, verdict=tuple(picked))])
        if len(pending) >= 5000:
            writer.write(pending)
            points += len(pending)
            pending = []
    writer.write(pending)
    return fleet, points + len(pending)


def timed(call: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``repeat`` calls after one warm-up."""
    call()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16, help="nodes of 8 GPUs")
    ap.add_argument("--seconds", type=int, default=3600, help="seconds of 1 Hz samples")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tasks-only", action="store_true", help="only the storage tasks (for large fleets)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-bench-queries-"))
    print(f"starting InfluxDB {base.influxdb.version} in {run_dir}")
    proc = influxdb.start(
        base.services.cache_dir, base.influxdb.version, run_dir / "influxdb", "hermeneut", "telemetry"
    )
    settings = Settings(
        influxdb=InfluxSettings(url=proc.url, org=proc.org, bucket=proc.bucket, token=proc.token, timeout_s=600)
    )
    results: dict[str, Any] = {"influxdb_version": proc.version, "nodes": args.nodes, "gpus": args.nodes * 8}
    try:
        setup(settings)
        writer = InfluxWriter(proc.url, proc.token, proc.org, proc.bucket, 120)
        start = (time.time_ns() // (600 * NS) * 600 - args.seconds - 600) * NS
        t = time.perf_counter()
        fleet, points = load(writer, args.nodes, args.seconds, start)
        writer.close()
        results |= {"points": points, "write_s": time.perf_counter() - t}
        span = {"start": iso(start), "stop": iso(start + args.seconds * NS)}
        tr = TimeRange(start, start + args.seconds * NS)
        with Store.from_settings(settings) as store:
            if not args.tasks_only:
                results["plans"], results["questions"], results["floor_s"] = run_queries(store, fleet, tr, span, args)
            results["tasks"] = run_tasks(store, settings, start, args.seconds, args.repeat)
    finally:
        proc.stop()
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def run_queries(
    store: Store, fleet: Fleet, tr: TimeRange, span: dict[str, str], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    busy = [i for i, p in enumerate(fleet.profile) if p.name in APPLICATION]
    job = f"{fleet.nodes[busy[0] // 8]}-1"
    gpu, raw = fleet.uuids[busy[0]], store.buckets.raw
    on_llm = sorted({fleet.model[i].name for i in busy if fleet.profile[i].name == "llm-training"})
    models = list(dict.fromkeys(on_llm + sorted({m.name for m in fleet.model})))[:2]
    floor = timed(
        lambda: store.aggregate(Aggregate(raw, GPU, (Expr("power_watts", "count"),), tr), "flux"), args.repeat
    )

    def plan(field: str, fn: Fn, group: tuple[str, ...], window_s: int | None, *filters: Filter) -> Aggregate:
        return Aggregate(raw, GPU, (Expr(field, fn),), tr, filters, group, window_s * NS if window_s else None)

    identity = ("cluster", "node", "gpu", "gpu_model")
    plans = {
        "fleet mean(power) by model, 1m": plan("power_watts", "mean", ("gpu_model",), 60),
        "fleet max(temperature) by node, 1m": plan("temperature_gpu_celsius", "max", ("node",), 60),
        "fleet p95(temperature) by node, 1m": plan("temperature_gpu_celsius", "p95", ("node",), 60),
        "fleet median(power) by model, 5m": plan("power_watts", "median", ("gpu_model",), 300),
        "one GPU mean(power), 10s": plan("power_watts", "mean", ("gpu",), 10, TagIn("gpu", (gpu,))),
        "one job mean(power), whole range scanned": plan(
            "power_watts", "mean", ("gpu",), 60, FieldEquals("job_id", job)
        ),
        "verdict=anomalous count, 5m": plan("verdict", "count", (), 300, FieldEquals("verdict", "anomalous")),
        "one job: 5 features p50+p95, whole range": Aggregate(
            raw,
            GPU,
            tuple(Expr(f, fn) for f in COMPARE_FEATURES for fn in ("p50", "p95")),
            tr,
            (FieldEquals("job_id", job),),
            ("application", "gpu_model"),
        ),
        "top: max(temp ratio) per GPU": plan("temperature_ratio_of_slowdown", "max", identity, None),
        "top: throttled samples per GPU": plan(
            "throttle_reasons_mask", "count", identity, None, ValueNotIn(BENIGN_MASKS)
        ),
        "top: util < 10 samples per GPU": plan("utilization_gpu_percent", "count", identity, None, ValueBelow(10.0)),
    }
    plan_rows = []
    for name, p in tqdm(plans.items(), desc="plans on both backends", unit="plan"):
        row: dict[str, Any] = {"plan": name, "auto": store.choose(p).name}
        for backend in ("flux", "influxql"):
            row[backend] = timed(lambda p=p, backend=backend: store.aggregate(p, backend), args.repeat)  # type: ignore[misc]
        plan_rows.append(row)
    fleet_scope, job_scope = Scope(cluster="bench"), Scope(job=job)
    llm = "llm-pretraining"
    questions: dict[str, Callable[[], Any]] = {
        "trend p95(power) by node, auto window": lambda: trend(
            store, TrendQuery("power_watts", "node", None, None, "p95", fleet_scope, **span)
        ),
        "trend one job, by GPU, 1m": lambda: trend(
            store, TrendQuery("power_watts", "gpu", "1m", None, "mean", job_scope, **span)
        ),
        "top hot (max)": lambda: top(store, TopQuery("hot", 10, None, fleet_scope, **span)),
        "top throttled": lambda: top(store, TopQuery("throttled", 10, None, fleet_scope, **span)),
        "top wasted": lambda: top(store, TopQuery("wasted", 10, None, fleet_scope, **span)),
        "top power (p95)": lambda: top(store, TopQuery("power", 10, None, fleet_scope, "p95", **span)),
        "compare job vs baseline (extent, then narrowed)": lambda: compare_job(
            store, CompareJobQuery(job, None, **span)
        ),
        "anomaly history (1m windows + findings)": lambda: anomalies(
            store, AnomalyQuery(None, "1m", fleet_scope, **span)
        ),
    }
    if len(models) == 2:  # a tiny fleet may have one model only
        questions["compare models (5 features)"] = lambda: compare_models(
            store, CompareModelsQuery(llm, models[0], models[1], None, **span)
        )
    question_rows = [
        {"question": name, "seconds": timed(call, args.repeat)}
        for name, call in tqdm(questions.items(), desc="questions", unit="question")
    ]
    return plan_rows, question_rows, floor


def run_tasks(store: Store, settings: Settings, start: int, seconds: int, repeat: int) -> dict[str, Any]:
    """The task run for the end of the data (what it does every 10 minutes in production; the 1-minute rollups
    are computed by the sink, in the stream)."""
    (jobs,) = task_specs(settings)
    end = start + seconds * NS
    out: dict[str, Any] = {}
    for spec, at, every_s in ((jobs, end - end % (600 * NS), 600),):
        runs = [run_task(store, spec.name, at) for _ in range(repeat)]
        bad = [r for r in runs if r.status != "success"]
        if bad:
            raise RuntimeError(f"{spec.name}: {bad[0].log[-1] if bad[0].log else bad[0].status}")
        took = statistics.median(r.seconds for r in runs)
        out[spec.name] = {"run_s": took, "every_s": every_s, "share_of_one_core": took / every_s}
    return out


def report(r: dict[str, Any]) -> None:
    print(f"\n{r['points']:,} points ({r['gpus']} GPUs) in {r['write_s']:.0f} s, InfluxDB {r['influxdb_version']}")
    if "plans" in r:
        report_queries(r)
    print(f"\n{'storage task':52} {'run s':>8} {'every s':>8} {'core share':>10}")
    for name, t in r["tasks"].items():
        print(f"{name:52} {t['run_s']:8.2f} {t['every_s']:8d} {t['share_of_one_core']:10.1%}")


def report_queries(r: dict[str, Any]) -> None:
    print(f"floor: pushed-down count() over all samples of one field: {r['floor_s'] * 1000:.0f} ms\n")
    print(f"{'plan':46} {'flux ms':>9} {'influxql ms':>12} {'flux/iql':>9} {'auto':>9}")
    for p in r["plans"]:
        flux, iql = p["flux"] * 1000, p["influxql"] * 1000
        print(f"{p['plan']:46} {flux:9.0f} {iql:12.0f} {flux / iql:9.2f} {p['auto']:>9}")
    print(f"\n{'question (auto backend)':52} {'ms':>8} {'x floor':>8}")
    for q in r["questions"]:
        print(f"{q['question']:52} {q['seconds'] * 1000:8.0f} {q['seconds'] / r['floor_s']:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
