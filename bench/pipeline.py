"""End-to-end benchmark: GPU samples/s and latency through producer -> Kafka -> processor -> InfluxDB,
next to the raw ceilings of the same servers measured in the same run.

    python -m bench.pipeline [--gpus 10000] [--duration 60] [--backlog 200000] [--json out.json]

Phases, each on its own topics of the same config (``pipeline.topics``), on a fresh local Kafka and influxd:
1. Kafka ceiling: Kafka's own ProducerPerformance and ConsumerPerformance, records the size of one encoded node
   message, same partitions, acks=all, idempotence, lz4; reported as GPU samples/s (records x GPUs per node).
2. InfluxDB ceiling: a raw influxdb-client synchronous write of the very lines the sink writes, 5,000 per request.
3. Saturation: a backlog of samples is put in Kafka first, then processor + sink drain it; samples/s between the
   first and the last stored point. Ratio = this / the slower ceiling.
4. Live fleet: a simulated fleet (``--gpus``) sampled at 1 Hz for ``--duration`` seconds while the pipeline runs;
   sustained stored samples/s and latency sample time -> InfluxDB acknowledged (p50/p99).
Everything shares the machine's cores, as it would on one node.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.codec import encode_samples
from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings, TopicSettings, load_settings
from pipeline.publisher import Publisher
from pipeline.services import influxdb, kafka
from pipeline.services.stages import Stage, start_stage, wait_for
from pipeline.topics import ensure_topics, topic_specs
from processors.normalize import RawMessage, process_raw
from producers.agent import NodeAgent
from producers.simulator import Fleet
from producers.simulator.source import SimulatorSource
from sinks.influxdb.lines import batch_lines
from sinks.influxdb.write import InfluxWriter

GPUS_PER_NODE = 8


def bench_settings(base: Settings, k: kafka.KafkaProcess, i: influxdb.InfluxProcess, tag: str) -> Settings:
    s = Settings(
        cluster=f"bench-{tag}",
        group_prefix=f"bench-{tag}",
        kafka=KafkaSettings(bootstrap_servers=k.bootstrap_servers, session_timeout_s=6.0),
        influxdb=InfluxSettings(url=i.url, org=i.org, bucket=i.bucket, token=i.token),
        topics=TopicSettings.with_prefix(f"bench.{tag}"),
        services=ServiceSettings(cache_dir=base.services.cache_dir, state_dir=base.services.state_dir),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return s


def kafka_ceiling(base: Settings, k: kafka.KafkaProcess, s: Settings, records: int, record_size: int) -> dict[str, Any]:
    """Kafka's own perf tools on a topic configured like the raw topic."""
    cache, version = base.services.cache_dir, k.version
    props = [
        f"bootstrap.servers={k.bootstrap_servers}",
        "acks=all",
        "enable.idempotence=true",
        "compression.type=lz4",
        "linger.ms=20",
        "batch.size=1000000",
    ]
    produce = subprocess.run(
        kafka.java_cmd(
            cache, version, "org.apache.kafka.tools.ProducerPerformance",
            "--topic", s.topics.raw, "--num-records", str(records), "--record-size", str(record_size),
            "--throughput", "-1", "--producer-props", *props,
        ),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    summary = [line for line in produce.stdout.splitlines() if "records sent" in line][-1]
    produced_per_s = float(re.search(r"([\d.]+) records/sec", summary).group(1))  # type: ignore[union-attr]
    consume = subprocess.run(
        kafka.java_cmd(
            cache, version, "org.apache.kafka.tools.ConsumerPerformance",
            "--bootstrap-server", k.bootstrap_servers, "--topic", s.topics.raw, "--messages", str(records),
            "--timeout", "60000", "--hide-header",
        ),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    row = [line for line in consume.stdout.splitlines() if line.count(",") >= 5][-1].split(",")
    consumed_per_s = float(row[5])
    return {
        "record_bytes": record_size,
        "producer_records_per_s": produced_per_s,
        "consumer_records_per_s": consumed_per_s,
        "producer_samples_per_s": produced_per_s * GPUS_PER_NODE,
        "consumer_samples_per_s": consumed_per_s * GPUS_PER_NODE,
    }


def interpreted_lines(fleet: Fleet, rounds: int, start_ns: int) -> list[str]:
    """The exact line protocol the sink writes for ``rounds`` of ``fleet``."""
    lines: list[str] = []
    for r in range(rounds):
        ts = start_ns + r * 1_000_000_000
        msgs = [RawMessage(b.kafka_key, encode_samples(b), "bench") for b in fleet.tick(ts)]
        out = process_raw(msgs, time.time_ns(), Settings().validation)
        lines += batch_lines(b for _, b in out.forward)
    return lines


def influx_ceiling(s: Settings, points: int) -> dict[str, Any]:
    """A raw influxdb-client write of the sink's own lines, 5,000 per request, as fast as it goes."""
    fleet = Fleet(125, GPUS_PER_NODE, cluster=f"{s.cluster}-raw", seed=2)
    lines = interpreted_lines(fleet, max(1, points // fleet.size), time.time_ns() - 3600 * 10**9)
    writer = InfluxWriter.from_settings(s.influxdb)
    start = time.perf_counter()
    for n in range(0, len(lines), 5000):
        writer.write(lines[n : n + 5000])
    elapsed = time.perf_counter() - start
    writer.close()
    return {"points": len(lines), "points_per_s": len(lines) / elapsed}


def preload(s: Settings, samples: int) -> int:
    """Put ``samples`` simulated samples (recent timestamps) into the raw topic; returns how many."""
    fleet = Fleet(125, GPUS_PER_NODE, cluster=s.cluster, seed=3)
    rounds = max(1, samples // fleet.size)
    start_ns = time.time_ns() - rounds * 1_000_000_000
    pub = Publisher(s.kafka.client_config())
    for r in range(rounds):
        for b in fleet.tick(start_ns + r * 1_000_000_000):
            pub.publish(s.topics.raw, b.kafka_key, encode_samples(b))
    assert pub.close(120) == 0
    return rounds * fleet.size


def saturation(s: Settings, run_dir: Path, samples: int) -> dict[str, Any]:
    total = preload(s, samples)
    stages = [start_stage("process", s, run_dir), start_stage("sink", s, run_dir)]
    sink = stages[1]
    try:
        wait_for(_progress(stages, "points_written", 1), 120, 0.05)
        first_t, first_n = time.perf_counter(), sink.stats().get("points_written", 0)
        done = wait_for(_progress(stages, "points_written", total), 600, 0.1)
        last_t = time.perf_counter()
        stats = sink.stats()
    finally:
        _stop(stages)
    if not done:
        raise RuntimeError(f"saturation run stored only {stats.get('points_written')} of {total}")
    return {"samples": total, "samples_per_s": (total - first_n) / (last_t - first_t)}


def live(s: Settings, run_dir: Path, gpus: int, duration_s: float) -> dict[str, Any]:
    nodes = max(1, gpus // GPUS_PER_NODE)
    fleet = Fleet(nodes, GPUS_PER_NODE, cluster=s.cluster, seed=4)
    stages = [start_stage("process", s, run_dir), start_stage("sink", s, run_dir)]
    processor, sink = stages
    try:
        assert wait_for(lambda: all(st.stats().get("assigned") for st in stages), 120)
        publisher = Publisher(s.kafka.client_config())
        stop = threading.Event()
        start = time.perf_counter()
        report = NodeAgent(SimulatorSource.of(fleet, samples_only=True), publisher, s.topics, 1.0).run(stop, duration_s)
        produced_s = time.perf_counter() - start
        drained = wait_for(_progress(stages, "points_written", report.samples), 300, 0.1)
        drain_s = time.perf_counter() - start - produced_s
        stats, pstats = sink.stats(), processor.stats()
    finally:
        _stop(stages)
    return {
        "gpus": fleet.size,
        "duration_s": duration_s,
        "samples": report.samples,
        "late_rounds": report.late_rounds,
        "stored": stats.get("points_written", 0),
        "dead_lettered": pstats.get("dead_lettered", 0),
        "drained": drained,
        "drain_after_last_round_s": drain_s,
        "samples_per_s": stats.get("points_written", 0) / (produced_s + drain_s),
        "latency_p50_s": stats.get("latency_p50_s"),
        "latency_p99_s": stats.get("latency_p99_s"),
        "latency_max_s": stats.get("latency_max_s"),
    }


def _progress(stages: list[Stage], key: str, at_least: int) -> Callable[[], bool]:
    """A wait condition on the last stage's stats that fails loudly if any stage died."""

    def check() -> bool:
        dead = [st for st in stages if not st.alive()]
        if dead:
            raise RuntimeError(f"stage {dead[0].name} exited; see {dead[0].log}")
        return int(stages[-1].stats().get(key, 0)) >= at_least

    return check


def _stop(stages: list[Stage]) -> None:
    for st in stages:
        st.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=10_000, help="live fleet size (GPUs sampled at 1 Hz)")
    ap.add_argument("--duration", type=float, default=60.0, help="live phase seconds")
    ap.add_argument("--backlog", type=int, default=200_000, help="samples for the saturation phase")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-bench-"))
    print(f"starting local Kafka {base.kafka.version} and InfluxDB {base.influxdb.version} in {run_dir}")
    k = kafka.start(base.services.cache_dir, base.kafka.version, run_dir / "kafka", heap_mb=1024)
    i = influxdb.start(base.services.cache_dir, base.influxdb.version, run_dir / "influxdb", "hermeneut", "telemetry")
    results: dict[str, Any] = {"kafka_version": k.version, "influxdb_version": i.version}
    try:
        fleet = Fleet(125, GPUS_PER_NODE, seed=1)
        record = round(sum(len(encode_samples(b)) for b in fleet.tick(time.time_ns())) / len(fleet.nodes))
        print(f"1/4 Kafka ceiling: perf tools, {args.backlog // GPUS_PER_NODE} records of {record} B")
        results["kafka"] = kafka_ceiling(base, k, bench_settings(base, k, i, "perf"), args.backlog // 8, record)
        print(f"2/4 InfluxDB ceiling: raw influxdb-client write of {args.backlog} sink lines")
        results["influxdb"] = influx_ceiling(bench_settings(base, k, i, "raw"), args.backlog)
        print(f"3/4 saturation: draining a backlog of {args.backlog} samples through the pipeline")
        results["saturation"] = saturation(bench_settings(base, k, i, "sat"), run_dir / "sat", args.backlog)
        print(f"4/4 live: {args.gpus} GPUs at 1 Hz for {args.duration:.0f}s")
        results["live"] = live(bench_settings(base, k, i, "live"), run_dir / "live", args.gpus, args.duration)
    finally:
        k.stop()
        i.stop()
    kc, ic, sat, lv = results["kafka"], results["influxdb"], results["saturation"], results["live"]
    ceiling = min(kc["producer_samples_per_s"], kc["consumer_samples_per_s"], ic["points_per_s"])
    results["ratio_to_slower_ceiling"] = sat["samples_per_s"] / ceiling
    print()
    print(f"{'measure':48} {'samples/s':>12}")
    print(f"{'Kafka ProducerPerformance (x8 samples/record)':48} {kc['producer_samples_per_s']:>12,.0f}")
    print(f"{'Kafka ConsumerPerformance (x8 samples/record)':48} {kc['consumer_samples_per_s']:>12,.0f}")
    print(f"{'InfluxDB raw client write (points/s)':48} {ic['points_per_s']:>12,.0f}")
    print(f"{'pipeline, saturated (backlog drain)':48} {sat['samples_per_s']:>12,.0f}")
    print(f"{'ratio to the slower ceiling':48} {results['ratio_to_slower_ceiling']:>12.2f}")
    print(
        f"{'pipeline, live ' + str(lv['gpus']) + ' GPUs @1 Hz (sustained)':48} {lv['samples_per_s']:>12,.0f}"
        f"   late rounds {lv['late_rounds']}, drained {lv['drained']}"
    )
    print(
        f"{'latency sample -> stored p50 / p99 / max (s)':48} "
        f"{lv['latency_p50_s']:.3f} / {lv['latency_p99_s']:.3f} / {lv['latency_max_s']:.3f}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
