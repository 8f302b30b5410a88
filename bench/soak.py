"""Soak run: the whole pipeline for an hour at 1,000 GPUs, with the resident memory of every process sampled.

    python -m bench.soak [--gpus 1000] [--minutes 60] [--interval 10] [--json out.json]

On a fresh local Kafka and influxd: the simulated fleet at 1 Hz with faults injected (``hermeneut simulate``, the
collector's agent loop: findings flow), the processor, the sink and the alert manager, each a child process as in
a deployment. Every ``--interval`` seconds the resident memory (VmRSS, /proc) of each process is read: the broker,
influxd, the producer, the processor, the sink and the alert manager.

What counts as growth: memory after a warm-up (the first ``--warmup`` share of the run: caches, the per-GPU slot
tables and InfluxDB's series fill up then) to the end, and the slope of a least-squares line over the second half
(MiB per hour), the figure that tells a leak from a plateau. A process's growth is **bounded** when the slope over
the second half stays under ``--bound`` of its warm memory per hour (default 5%). Also reported: every sample the
producer queued is stored or dead-lettered (distinct GPU points in InfluxDB against the producer's count), the
findings and the alerts the manager made of them. The exit code is 1 when one of the project's processes grew past
the bound, a stage died, or samples were lost; the broker and influxd are reported next to them, for reference.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bench.cpu import load_average, rss_bytes
from hermeneut.stages import start_stage
from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings, TopicSettings, load_settings
from pipeline.services import influxdb, kafka
from pipeline.services.stages import Stage, wait_for
from pipeline.topics import ensure_topics, topic_specs
from producers.simulator.plan import FaultPlan
from sinks.query.store import flux_rows

MIB = 2**20
GPUS_PER_NODE = 8
FAULTS_PER_CLASS = 3.0
#: reported for reference, not judged: a JVM's resident memory grows toward its fixed heap for a long while, and
#: influxd's with the series and caches of the data it holds; neither is this project's code
SERVERS = ("broker", "influxd")


@dataclass
class Series:
    """One process's memory over the run."""

    name: str
    pid: int
    t_s: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)

    def sample(self, t_s: float) -> None:
        rss = rss_bytes(self.pid)
        if rss:  # 0: the process is gone (the producer at its end; a dead stage stops the run)
            self.t_s.append(t_s)
            self.rss.append(rss)

    def summary(self, warmup: float, bound: float) -> dict[str, Any]:
        t, rss = np.asarray(self.t_s), np.asarray(self.rss, dtype=np.float64)
        warm_at = t[-1] * warmup
        warm = rss[t >= warm_at][0]
        half = t >= t[-1] / 2
        slope = float(np.polyfit(t[half] / 3600, rss[half], 1)[0]) if half.sum() >= 3 else float("nan")
        return {
            "warm_mib": warm / MIB,
            "end_mib": rss[-1] / MIB,
            "max_mib": rss.max() / MIB,
            "growth_after_warmup_mib": (rss[-1] - warm) / MIB,
            "slope_second_half_mib_per_h": slope / MIB,
            "bounded": bool(slope <= bound * warm),
        }


def soak_settings(base: Settings, k: kafka.KafkaProcess, i: influxdb.InfluxProcess) -> Settings:
    s = Settings(
        cluster="soak",
        group_prefix="soak",
        kafka=KafkaSettings(bootstrap_servers=k.bootstrap_servers),
        influxdb=InfluxSettings(url=i.url, org=i.org, bucket=i.bucket, token=i.token),
        topics=TopicSettings.with_prefix("soak"),
        services=ServiceSettings(cache_dir=base.services.cache_dir, state_dir=base.services.state_dir / "soak"),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return s


def stored_samples(s: Settings) -> int:
    """GPU samples of the soak's cluster in InfluxDB: one ``power_watts`` value per GPU and time (a point written
    twice is one point)."""
    [rows] = flux_rows(
        s,
        f'from(bucket: "{s.influxdb.bucket}") |> range(start: 0) '
        f'|> filter(fn: (r) => r._measurement == "gpu" and r.cluster == "{s.cluster}" and r._field == "power_watts") '
        "|> group() |> count()",
    )
    return int(rows[0]["_value"]) if rows else 0


def run(gpus: int, minutes: float, interval_s: float, warmup: float, bound: float) -> dict[str, Any]:
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-soak-"))
    print(f"starting local Kafka {base.kafka.version} and InfluxDB {base.influxdb.version} in {run_dir}")
    k = kafka.start(base.services.cache_dir, base.kafka.version, run_dir / "kafka", heap_mb=1024)
    i = influxdb.start(base.services.cache_dir, base.influxdb.version, run_dir / "influxdb", "hermeneut", "telemetry")
    s = soak_settings(base, k, i)
    stages: list[Stage] = []
    try:
        stages = [start_stage(name, s, run_dir / "stages") for name in ("process", "sink")]
        stages.append(start_stage("alerts", s, run_dir / "stages", command=("alerts", "run")))
        assert wait_for(lambda: all(st.stats().get("assigned") for st in stages), 180), "stages did not start"
        duration_s = minutes * 60
        nodes = max(1, gpus // GPUS_PER_NODE)
        # faults at a rate that brings each class FAULTS_PER_CLASS times over the run: findings and alerts flow
        scale = FaultPlan.for_evaluation(nodes, duration_s, per_class=FAULTS_PER_CLASS).rate_scale
        producer = start_stage(
            "simulate",
            s,
            run_dir / "stages",
            "--nodes",
            str(nodes),
            "--gpus",
            str(GPUS_PER_NODE),
            "--duration",
            str(duration_s),
            "--faults",
            "--fault-mix",
            "balanced",
            "--fault-rate-scale",
            f"{scale:.1f}",
        )
        stages.append(producer)
        series = [Series("broker", k.pid), Series("influxd", i.pid)] + [Series(st.name, st.proc.pid) for st in stages]
        start = time.monotonic()
        with tqdm(total=int(duration_s), desc="soak", unit="s", mininterval=5.0) as bar:
            while producer.alive():
                now = time.monotonic() - start
                for one in series:
                    one.sample(now)
                bar.update(min(int(now), int(duration_s)) - bar.n)
                dead = [st.name for st in stages if not st.alive() and st is not producer]
                if dead:
                    raise RuntimeError(f"stage {dead[0]} died; see {run_dir / 'stages'}")
                time.sleep(interval_s)
        produced = int(producer.stats().get("samples", 0))
        # what the processor or the sink dead-lettered is accounted for, not stored
        lettered = sum(int(st.stats().get("dead_lettered", 0)) for st in stages[:2])
        wait_for(lambda: stored_samples(s) + lettered >= produced, 600, interval_s=10.0)
        time.sleep(5.0)  # a duplicate would show now
        stored = stored_samples(s)
        processed = stages[0].stats()
        alerts = stages[2].stats()
    finally:
        for st in stages:
            st.stop()
        k.stop()
        i.stop()
    return {
        "gpus": nodes * GPUS_PER_NODE,
        "minutes": minutes,
        "interval_s": interval_s,
        "warmup_share": warmup,
        "bound_per_hour": bound,
        "samples_produced": produced,
        "samples_stored": stored,
        "dead_lettered": lettered,
        "findings": int(processed.get("findings", 0)),
        "alerts": int(alerts.get("alerts_known", 0)),
        "load": load_average(),
        "memory": {one.name: one.summary(warmup, bound) for one in series},
        # every sample, so that a process flagged as growing can be looked at (--json)
        "series": {one.name: {"t_s": one.t_s, "rss_mib": [round(b / MIB, 2) for b in one.rss]} for one in series},
        "run_dir": str(run_dir),
    }


def report(r: dict[str, Any]) -> None:
    print(
        f"\nsoak: {r['gpus']} GPUs at 1 Hz for {r['minutes']:g} min (load {r['load'][0]:.1f}); memory every "
        f"{r['interval_s']:.0f} s, growth counted after the first {r['warmup_share']:.0%}"
    )
    print(
        f"  samples: {r['samples_produced']:,} produced, {r['samples_stored']:,} stored, {r['dead_lettered']} "
        f"dead-lettered; {r['findings']} findings, {r['alerts']} alerts"
    )
    print(f"  {'process':10} {'warm MiB':>9} {'end MiB':>8} {'max MiB':>8} {'growth MiB':>11} {'MiB/h 2nd half':>15}")
    for name, m in r["memory"].items():
        flag = "bounded" if m["bounded"] else f"GREW past {r['bound_per_hour']:.0%}/h"
        print(
            f"  {name:10} {m['warm_mib']:9.1f} {m['end_mib']:8.1f} {m['max_mib']:8.1f} "
            f"{m['growth_after_warmup_mib']:11.1f} {m['slope_second_half_mib_per_h']:15.1f}  {flag}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1000, help="fleet size (GPUs sampled at 1 Hz)")
    ap.add_argument("--minutes", type=float, default=60.0, help="how long the fleet runs")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between memory samples")
    ap.add_argument("--warmup", type=float, default=0.25, help="share of the run before growth is counted")
    ap.add_argument("--bound", type=float, default=0.05, help="bounded: second-half slope under this share per hour")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    r = run(args.gpus, args.minutes, args.interval, args.warmup, args.bound)
    report(r)
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    accounted = r["samples_stored"] + r["dead_lettered"] == r["samples_produced"]
    ours = [m for name, m in r["memory"].items() if name not in SERVERS]
    ok = all(m["bounded"] for m in ours) and accounted
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
