"""Catch-up from a backlog: the evaluation run that crash-looped (issue 17), at full size, with counts.

    python -m bench.catchup [--samples 1000000] [--nodes 16] [--gpus 8] [--seed 31337] [--json out.json]

A simulated fleet with every extra (HGX H100/H200/A100 NVSwitch nodes with 18 NVLinks per GPU, processes,
InfiniBand ports, injected faults that raise XIDs) and all its workload context is fast-forwarded into the raw topic
*before* the processor starts, as after an outage, a backfill or an import, so the processor's takes are as large
as they get (500 raw messages of one node). Then processor and sink drain it. Passes when every sample is stored or
dead-lettered (the counts add up), the processor's agent started once and never crashed, and no stage is stalled.
Reports the wall time and samples/s of the drain and the CPU µs per sample of the processor and the sink processes
(bench/pipeline.py measures throughput against the servers' own ceilings). Runs on a fresh local Kafka and influxd;
tests/integration/test_sizes.py runs the same :func:`catch_up` at CI size on the suite's servers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.pipeline import bench_settings
from hermeneut.stages import start_stage
from pipeline.config import Settings, load_settings
from pipeline.publisher import Publisher
from pipeline.services import influxdb, kafka
from pipeline.services.stages import wait_for
from pipeline.sizing import read_limits
from producers.agent import NodeAgent
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan
from producers.simulator.source import SimulatorSource


def preload(s: Settings, samples: int, nodes: int, gpus: int, seed: int, progress: bool = False) -> dict[str, int]:
    """Fast-forward a fleet with every extra into the raw topic until ``samples`` samples are there."""
    fleet = Fleet(nodes, gpus, cluster=s.cluster, seed=seed, extras=True, faults=FaultPlan(rate_scale=20.0))
    t = s.topics
    limits = read_limits(s.kafka.client_config(), (t.raw, t.context, t.topology, t.ground_truth, t.dead_letter))
    publisher = Publisher(s.kafka.client_config(), limits=limits)
    agent = NodeAgent(SimulatorSource.of(fleet), publisher, t, 1.0)
    history_s = max(1, samples // fleet.size)
    report = agent.run(threading.Event(), 0.0, fast_forward_s=history_s, progress=progress)
    assert report.undelivered == 0 and publisher.stats.failed == 0, report
    return {"samples": report.samples, "messages": report.messages, "events": report.events, "nics": report.nics}


def catch_up(
    s: Settings,
    run_dir: Path,
    samples: int,
    nodes: int = 16,
    gpus: int = 8,
    seed: int = 31337,
    timeout_s: float = 3600.0,
    progress: bool = False,
) -> dict[str, Any]:
    """Preload the backlog, drain it through processor and sink, and return the counts (see module docstring)."""
    loaded = preload(s, samples, nodes, gpus, seed, progress)
    stages = [start_stage("process", s, run_dir), start_stage("sink", s, run_dir)]
    processor, sink = stages

    def accounted() -> bool:
        if not all(st.alive() for st in stages):
            return True
        p = processor.stats()
        return p.get("samples_ok", 0) + p.get("dead_lettered", 0) >= loaded["samples"] and sink.stats().get(
            "points_written", 0
        ) >= p.get("samples_ok", 0)

    try:
        assert wait_for(lambda: sink.stats().get("points_written", 0) > 0 or not processor.alive(), 300, 0.1)
        start = time.perf_counter()
        drained = wait_for(accounted, timeout_s, 0.2)
        seconds = time.perf_counter() - start
        time.sleep(1.0)  # anything extra (a duplicate, a late dead letter) would show up now
        p, k = processor.stats(), sink.stats()
        alive = all(st.alive() for st in stages)
        cpu = {st.name: _cpu_s(st.proc.pid) for st in stages}
    finally:
        for st in stages:
            st.stop()
    return {
        "published": loaded,
        "drained": drained and alive,
        "seconds": round(seconds, 1),
        "samples_per_s": round(loaded["samples"] / seconds) if seconds else None,
        "cpu_us_per_sample": {name: round(c * 1e6 / max(loaded["samples"], 1), 1) for name, c in cpu.items()},
        "stored": k.get("points_written", 0),
        "samples_ok": p.get("samples_ok", 0),
        "dead_lettered": p.get("dead_lettered", 0),
        "processor": {
            key: p.get(key)
            for key in (
                "messages_in",
                "messages_out",
                "batches",
                "too_large",
                "processing_errors",
                "agent_starts",
                "agent_crashes",
                "stalls",
                "stalled",
                "write_failures",
            )
        },
        "sink": {key: k.get(key) for key in ("messages", "batches", "dead_lettered", "stalls", "stalled")},
    }


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a live process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def verdict(result: dict[str, Any]) -> list[str]:
    """What failed, empty when the catch-up passed."""
    failures = []
    p = result["processor"]
    if not result["drained"]:
        failures.append("the backlog was not drained (or a stage exited)")
    if result["samples_ok"] + result["dead_lettered"] != result["published"]["samples"]:
        failures.append("stored + dead-lettered samples differ from the samples published")
    if result["stored"] != result["samples_ok"]:
        failures.append("the sink stored another number of points than the processor passed")
    if p["agent_starts"] != 1 or p["agent_crashes"] != 0:
        failures.append(f"the processor's agent restarted ({p['agent_starts']} starts, {p['agent_crashes']} crashes)")
    if p["stalled"] or result["sink"]["stalled"]:
        failures.append("a stage is stalled")
    return failures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seed", type=int, default=31337)
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-catchup-"))
    print(f"starting local Kafka {base.kafka.version} and InfluxDB {base.influxdb.version} in {run_dir}")
    k = kafka.start(base.services.cache_dir, base.kafka.version, run_dir / "kafka", heap_mb=1024)
    i = influxdb.start(base.services.cache_dir, base.influxdb.version, run_dir / "influxdb", "hermeneut", "telemetry")
    try:
        s = bench_settings(base, k, i, "catchup")
        print(f"fast-forwarding {args.samples:,} samples of {args.nodes} x {args.gpus} GPUs into {s.topics.raw}")
        result = catch_up(s, run_dir / "stages", args.samples, args.nodes, args.gpus, args.seed, progress=True)
    finally:
        k.stop()
        i.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    failures = verdict(result)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
