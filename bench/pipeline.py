"""End-to-end benchmark: GPU samples/s, latency and the CPU each process spends per sample through producer ->
Kafka -> processor -> InfluxDB, next to the raw ceilings of the same servers measured in the same run.

    python -m bench.pipeline [--gpus 10000] [--duration 60] [--backlog 200000] [--workers 1 [2 ...]]
                             [--profile SECONDS] [--json out.json]

Phases, each on its own topics of the same config (``pipeline.topics``), on a fresh local Kafka and influxd:
1. Kafka ceiling: Kafka's own ProducerPerformance and ConsumerPerformance, records the size of one encoded node
   message, same partitions, acks=all, idempotence, lz4; reported as GPU samples/s (records x GPUs per node).
2. InfluxDB ceiling: a raw influxdb-client synchronous write of the very lines the sink writes, 5,000 per
   request, with influxd's CPU per point; then the same lines with the moving readings written on change (not
   what the sink does: what it would save influxd, :func:`on_change`).
3. Saturation: a backlog of samples (with their workload context and topology) is put in Kafka first, learned
   baselines are published, then processor(s) + sink(s) drain it; samples/s between the first and the last
   stored point, and the processor stage's own drain rate (its lag reaching zero). Ratio = this / the slower
   ceiling. With several ``--workers`` counts, once per count (N processors and N sinks, each its consumer
   group's member, on the partitions of the same topics), each against the first.
4. Live fleet: a simulated fleet (``--gpus``) sampled at 1 Hz for ``--duration`` seconds while the pipeline runs,
   published as a collector and a context watcher would (topology, workload context, samples) and judged against
   the same learned baselines as the drain; sustained stored samples/s and latency sample time -> InfluxDB
   acknowledged (p50/p99).

Every phase reports the CPU-microseconds per sample of each process, read from /proc: the broker, influxd, the
processor(s), the sink(s) and the producer (this process: simulation, encoding, publishing), their central sum
and the ceiling it implies (cores / sum), with the load average the run saw. influxd's share includes writing out
what the phase left in its write cache (a TSM snapshot once its shards go quiet, waited for after each phase):
otherwise a phase that fits in one cache would end before influxd wrote any of it. On a shared machine that per-sample
CPU is the robust figure; absolute samples/s hold only for the load they were measured under.
Everything shares the machine's cores, as it would on one node.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.cpu import CpuMeter, central_sum, per_sample_us, rss_bytes
from bench.fields import field_budget, fields_in, on_change
from bench.profile import record, self_time
from bench.scoring import fitted
from hermeneut.jobs.training import publish as publish_baselines
from hermeneut.stages import start_stage
from pipeline.baselines import BaselineManifest, BaselineRecord, ClassifierRecord
from pipeline.codec import encode_record, encode_samples
from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings, TopicSettings, load_settings
from pipeline.events import GpuContext, InterpretedBatch, node_key
from pipeline.publisher import Publisher
from pipeline.services import influxdb, kafka
from pipeline.services.stages import Stage, wait_for
from pipeline.topics import ensure_topics, topic_specs
from processors.app import interpreter_from
from processors.baselines.store import BaselineSet
from processors.normalize import RawMessage, process_raw
from producers.agent import NodeAgent
from producers.dcgm_exporter import PromSample, parse_exposition
from producers.simulator import Fleet
from producers.simulator.source import SimulatorSource
from sinks.influxdb.lines import InfoTracker, batch_lines
from sinks.influxdb.write import InfluxWriter

GPUS_PER_NODE = 8
#: the seed of the fleet the baselines learn from (the drain's fleet is seed 3, the live one seed 4)
LEARN_SEED = 5
#: the benchmark's influxd writes a cache to a TSM file once its shard has had no writes for this long, so the
#: snapshot of what a phase left in the cache happens right after the phase and is counted with it (influxd's
#: default waits 10 minutes). Live writes come every second, so it changes nothing while a fleet writes.
SETTLE_COLD = "2s"


def settled_influxd_s(i: influxdb.InfluxProcess, meter: CpuMeter, timeout_s: float = 120.0) -> float:
    """influxd's CPU seconds from the end of ``meter``'s phase until its caches are written out: the final writes
    and the snapshot work the phase left behind.

    A drain of 200,000 samples fits in one cache (64 MiB); without this it would end before influxd wrote any of
    it to disk and look cheaper than a sustained load is.
    """
    if not wait_for(lambda: influxd_cache_bytes(i.url) == 0, timeout_s, 0.2):
        raise RuntimeError(f"influxd still holds {influxd_cache_bytes(i.url):,.0f} cache bytes after {timeout_s}s")
    return meter.since_stop("influxd")


def scraped(url: str, timeout_s: float = 5.0) -> list[PromSample]:
    """The samples of the Prometheus exposition served at ``url``."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_exposition(response.read().decode())


def _by_label(samples: list[PromSample], name: str, label: str) -> dict[str, float]:
    """The values of metric ``name`` summed per value of its ``label``."""
    out: dict[str, float] = {}
    for sample in samples:
        if sample.name == name:
            out[sample.labels[label]] = out.get(sample.labels[label], 0.0) + sample.value
    return out


def judged(processors: list[Stage]) -> tuple[dict[str, int], dict[str, float]]:
    """What the processors judged so far, from their /metrics: samples by verdict
    (``hermeneut_processor_verdicts_total``) and GPU-seconds by the application they were judged as
    (``hermeneut_gpu_seconds_total``; ``unknown`` where nothing named one)."""
    samples = [sample for st in processors if st.metrics_url for sample in scraped(st.metrics_url, 30.0)]
    verdicts = _by_label(samples, "hermeneut_processor_verdicts_total", "verdict")
    return {v: int(n) for v, n in verdicts.items()}, _by_label(samples, "hermeneut_gpu_seconds_total", "application")


def influxd_cache_bytes(url: str) -> float:
    """What influxd's write caches hold now, all shards together (``storage_cache_inuse_bytes`` of its /metrics):
    0 once everything written is in TSM files."""
    return sum(s.value for s in scraped(f"{url}/metrics") if s.name == "storage_cache_inuse_bytes")


def bench_settings(base: Settings, k: kafka.KafkaProcess, i: influxdb.InfluxProcess, tag: str) -> Settings:
    s = Settings(
        cluster=f"bench-{tag}",
        group_prefix=f"bench-{tag}",
        kafka=KafkaSettings(bootstrap_servers=k.bootstrap_servers, session_timeout_s=6.0),
        # the benchmark's own influxd, with the sink's batching as configured (HERMENEUT_INFLUXDB__BATCH_SIZE, ...)
        influxdb=InfluxSettings(
            url=i.url,
            org=i.org,
            bucket=i.bucket,
            token=i.token,
            batch_size=base.influxdb.batch_size,
            flush_interval_s=base.influxdb.flush_interval_s,
            timeout_s=base.influxdb.timeout_s,
        ),
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
            cache,
            version,
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic",
            s.topics.raw,
            "--num-records",
            str(records),
            "--record-size",
            str(record_size),
            "--throughput",
            "-1",
            "--producer-props",
            *props,
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    summary = [line for line in produce.stdout.splitlines() if "records sent" in line][-1]
    produced_per_s = float(re.search(r"([\d.]+) records/sec", summary).group(1))  # type: ignore[union-attr]
    consume = subprocess.run(
        kafka.java_cmd(
            cache,
            version,
            "org.apache.kafka.tools.ConsumerPerformance",
            "--bootstrap-server",
            k.bootstrap_servers,
            "--topic",
            s.topics.raw,
            "--messages",
            str(records),
            "--timeout",
            "60000",
            "--hide-header",
        ),
        capture_output=True,
        text=True,
        check=True,
    )
    row = [line for line in consume.stdout.splitlines() if line.count(",") >= 5][-1].split(",")
    consumed_per_s = float(row[5])
    return {
        "record_bytes": record_size,
        "producer_records_per_s": produced_per_s,
        "consumer_records_per_s": consumed_per_s,
        "producer_samples_per_s": produced_per_s * GPUS_PER_NODE,
        "consumer_samples_per_s": consumed_per_s * GPUS_PER_NODE,
    }


Learned = tuple[BaselineManifest, list[BaselineRecord], ClassifierRecord | None]


def interpreted_batches(
    fleet: Fleet, rounds: int, start_ns: int, learned: Learned | None, partitions: int = 1
) -> Iterator[InterpretedBatch]:
    """What the processor sends the sink for ``rounds`` of ``fleet``, interpreted with the fleet's workload context
    and the ``learned`` baselines: a batch per round and raw partition (``partitions``: node messages spread over
    them by a hash of their key, as the producer's partitioner does)."""
    baselines = BaselineSet(*learned) if learned else None
    contexts: dict[bytes, GpuContext] = {}
    topologies = {t.kafka_key: t for t in fleet.topologies(start_ns)}
    interpreter = interpreter_from(
        Settings(), contexts.get, lambda c, n: topologies.get(node_key(c, n)), lambda: baselines
    )
    for r in range(rounds):
        sim = fleet.round(start_ns + r * 1_000_000_000)
        contexts |= {c.kafka_key: c for c in sim.contexts}
        msgs = [
            RawMessage(b.kafka_key, encode_samples(b), "bench", zlib.crc32(b.kafka_key) % partitions)
            for b in sim.batches
        ]
        now = time.time_ns()
        out = process_raw(msgs, now, Settings().validation)
        yield from (interpreter.apply(b, now)[0] for _, b in out.forward)


def interpreted_lines(fleet: Fleet, rounds: int, start_ns: int, learned: Learned | None) -> list[str]:
    """The exact line protocol the sink writes for ``rounds`` of ``fleet`` (see :func:`interpreted_batches`), what
    changes rarely on change."""
    return batch_lines(interpreted_batches(fleet, rounds, start_ns, learned), InfoTracker())


def raw_fleet(cluster: str) -> Fleet:
    """The 1,000 GPUs whose lines the raw InfluxDB write sends (``bench.repeats`` counts the same fleet's readings)."""
    return Fleet(125, GPUS_PER_NODE, cluster=cluster, seed=2)


def _raw_write(s: Settings, lines: list[str], i: influxdb.InfluxProcess) -> tuple[CpuMeter, float]:
    """Write ``lines`` with influxdb-client, 5,000 per request, as fast as it goes; the meter and influxd's CPU
    seconds writing out its cache after."""
    writer = InfluxWriter.from_settings(s.influxdb)
    meter = CpuMeter({"influxd": (i.pid,), "writer": (os.getpid(),)}).start()
    for n in range(0, len(lines), 5000):
        writer.write(lines[n : n + 5000])
    meter.stop()
    writer.close()
    settle_s = settled_influxd_s(i, meter)
    meter.spent["influxd"] += settle_s
    return meter, settle_s


def influx_ceiling(s: Settings, points: int, i: influxdb.InfluxProcess, learned: Learned | None) -> dict[str, Any]:
    """A raw influxdb-client write of the sink's own lines, 5,000 per request, as fast as it goes; then the same
    lines with the moving readings on change (:func:`on_change`), as new series of another cluster name."""
    cluster = f"{s.cluster}-raw"
    fleet = raw_fleet(cluster)
    lines = interpreted_lines(fleet, max(1, points // fleet.size), time.time_ns() - 3600 * 10**9, learned)
    fields = sum(fields_in(line) for line in lines)
    meter, settle_s = _raw_write(s, lines, i)
    tag = f",cluster={cluster},"
    if not all(tag in line for line in lines):
        raise RuntimeError(f"not every line has the tag cluster={cluster}")
    changes = on_change([line.replace(tag, f",cluster={cluster}-changes,", 1) for line in lines])
    change_fields = sum(fields_in(line) for line in changes)
    change_meter, _ = _raw_write(s, changes, i)
    return {
        "points": len(lines),
        "fields_per_point": fields / len(lines),
        "points_per_s": len(lines) / meter.wall_s,
        "influxd_us_per_point": meter.spent["influxd"] * 1e6 / len(lines),
        "influxd_us_per_field": meter.spent["influxd"] * 1e6 / fields,
        "influxd_settle_us_per_point": settle_s * 1e6 / len(lines),
        "field_budget": field_budget(lines),
        "load": meter.load,
        "on_change": {
            "fields_per_point": change_fields / len(lines),
            "points_per_s": len(lines) / change_meter.wall_s,
            "influxd_us_per_point": change_meter.spent["influxd"] * 1e6 / len(lines),
            "influxd_us_per_field": change_meter.spent["influxd"] * 1e6 / change_fields,
            "load": change_meter.load,
        },
    }


def preload(s: Settings, samples: int, broker_pid: int) -> dict[str, Any]:
    """Put ``samples`` simulated samples (recent timestamps) into the raw topic, with the fleet's workload context
    and topology as a collector and a context watcher would publish them; the CPU it took."""
    fleet = Fleet(125, GPUS_PER_NODE, cluster=s.cluster, seed=3)
    rounds = max(1, samples // fleet.size)
    start_ns = time.time_ns() - rounds * 1_000_000_000
    pub = Publisher(s.kafka.client_config())
    meter = CpuMeter({"broker": (broker_pid,), "producer": (os.getpid(),)}).start()
    for topo in fleet.topologies(start_ns):
        pub.publish(s.topics.topology, topo.kafka_key, encode_record(topo))
    for r in range(rounds):
        sim = fleet.round(start_ns + r * 1_000_000_000)
        for ctx in sim.contexts:
            pub.publish(s.topics.context, ctx.kafka_key, encode_record(ctx))
        for b in sim.batches:
            pub.publish(s.topics.raw, b.kafka_key, encode_samples(b))
    assert pub.close(120) == 0
    meter.stop()
    total = rounds * fleet.size
    return {"samples": total, "us_per_sample": per_sample_us(meter.spent, total), "wall_s": meter.wall_s}


def learn(nodes: int, rounds: int) -> Learned:
    """Baselines and the classifier learned from ``rounds`` of a fleet like the benchmark's but of other jobs (its
    own seed), as ``baselines train`` would from a fleet's history. That history must hold many jobs per
    application, as a deployment's does: learned from 32 nodes (2 LLM pre-training jobs, 5-18 of the other
    applications), a quarter of the live fleet's samples were ``unusual`` (each "differs from its baseline"), a
    false-alarm rate no operator would keep; from 512 nodes (32-176 jobs per application), 4%."""
    print(f"learning baselines from {nodes * GPUS_PER_NODE} GPUs x {rounds} rounds of history", flush=True)
    return fitted(Fleet(nodes, GPUS_PER_NODE, seed=LEARN_SEED), rounds)


def load_baselines(s: Settings, learned: Learned) -> int:
    """Publish learned baselines and the classifier as training would: the processors start with them loaded.
    Returns how many baselines."""
    manifest, records, classifier = learned
    publish_baselines(s, manifest, records, classifier)
    return len(records)


def start_workers(s: Settings, run_dir: Path, workers: int) -> tuple[list[Stage], list[Stage]]:
    """``workers`` processors and as many sinks, each a member of its stage's consumer group."""
    processors = [start_stage(f"process-{i}", s, run_dir, command=("process",)) for i in range(workers)]
    sinks = [start_stage(f"sink-{i}", s, run_dir, command=("sink",)) for i in range(workers)]
    return processors, sinks


def _pids(
    k: kafka.KafkaProcess, i: influxdb.InfluxProcess, processors: list[Stage], sinks: list[Stage]
) -> dict[str, tuple[int, ...]]:
    return {
        "broker": (k.pid,),
        "influxd": (i.pid,),
        "processor": tuple(st.proc.pid for st in processors),
        "sink": tuple(st.proc.pid for st in sinks),
        "producer": (os.getpid(),),
    }


def _sum(stages: list[Stage], key: str) -> int:
    return sum(int(st.stats().get(key, 0)) for st in stages)


def _least(stages: list[Stage], key: str) -> int:
    return min(int(st.stats().get(key, 0)) for st in stages)


def saturation(
    s: Settings,
    run_dir: Path,
    samples: int,
    k: kafka.KafkaProcess,
    i: influxdb.InfluxProcess,
    workers: int,
    learned: Learned | None,
    profile_s: float = 0.0,
) -> dict[str, Any]:
    baselines = load_baselines(s, learned) if learned else 0
    loaded = preload(s, samples, k.pid)
    total = loaded["samples"]
    processors, sinks = start_workers(s, run_dir, workers)
    stages = processors + sinks
    try:
        wait_for(_progress(stages, sinks, "points_written", 1), 180, 0.05)
        first_stored, first_processed = _sum(sinks, "points_written"), _sum(processors, "samples_ok")
        meter = CpuMeter(_pids(k, i, processors, sinks)).start()
        t0 = time.perf_counter()
        processed_s: float | None = None
        profiled = [(st.name, st.proc.pid, run_dir / f"{st.name}.profile.txt") for st in (processors[0], sinks[0])]
        spies = {name: (out, record(pid, profile_s, out)) for name, pid, out in profiled if profile_s}

        def drained() -> bool:
            nonlocal processed_s
            if processed_s is None and _sum(processors, "samples_ok") >= total:
                processed_s = time.perf_counter() - t0
            return _progress(stages, sinks, "points_written", total)()

        done = wait_for(drained, 900, 0.1)
        meter.stop()
        profiles = {}
        for name, (path, spy) in spies.items():
            spy.wait(profile_s + 60)
            profiles[name] = self_time(path) if path.exists() else []
        time.sleep(1.2)  # the processors write their stats every second
        stored, processed = _sum(sinks, "points_written"), _sum(processors, "samples_ok")
        dead = _sum(processors, "dead_lettered")
        version = _least(processors, "baselines_version")
        verdicts, _ = judged(processors)
    finally:
        _stop(stages)
    if not done:
        raise RuntimeError(f"saturation run stored only {stored} of {total}")
    settle_s = settled_influxd_s(i, meter)
    meter.spent["influxd"] += settle_s
    stored_here = dict.fromkeys(("broker", "influxd", "sink", "producer"), stored - first_stored)
    counts = {"processor": processed - first_processed} | stored_here
    us = per_sample_us(meter.spent, counts)
    us["producer"] = loaded["us_per_sample"]["producer"]
    # the meter starts at the first stored point the stages' counts (written every second) show: a backlog drained
    # by then leaves nothing to divide by (it printed nan)
    metered = stored - first_stored
    unmeasured = (
        f"only {metered:,} of the backlog's {total:,} samples were stored after the first stored point was seen: "
        "too small a backlog to measure per sample (give a larger --backlog)"
        if 2 * metered < total
        else None
    )
    return {
        "unmeasured": unmeasured,
        "samples": total,
        "workers": workers,
        "baselines": baselines,
        "baselines_version": version,
        "verdicts": verdicts,
        "dead_lettered": dead,
        "samples_per_s": (stored - first_stored) / meter.wall_s,
        "processor_drain_samples_per_s": (total - first_processed) / processed_s if processed_s else None,
        "us_per_sample": us,
        "broker_ingest_us_per_sample": loaded["us_per_sample"]["broker"],
        "central_us_per_sample": central_sum(us),
        "influxd_settle_us_per_sample": per_sample_us({"influxd": settle_s}, counts)["influxd"],
        "load": meter.load,
        "profiles": profiles,
    }


def live(
    s: Settings,
    run_dir: Path,
    gpus: int,
    duration_s: float,
    k: kafka.KafkaProcess,
    i: influxdb.InfluxProcess,
    workers: int,
    learned: Learned | None,
) -> dict[str, Any]:
    nodes = max(1, gpus // GPUS_PER_NODE)
    fleet = Fleet(nodes, GPUS_PER_NODE, cluster=s.cluster, seed=4)
    baselines = load_baselines(s, learned) if learned else 0
    processors, sinks = start_workers(s, run_dir, workers)
    stages = processors + sinks
    try:
        assert wait_for(lambda: all(st.stats().get("assigned") for st in stages), 180)
        idle_rss = {st.name: rss_bytes(st.proc.pid) for st in stages}
        publisher = Publisher(s.kafka.client_config())
        stop = threading.Event()
        meter = CpuMeter(_pids(k, i, processors, sinks)).start()
        start = time.perf_counter()
        report = NodeAgent(SimulatorSource.of(fleet), publisher, s.topics, 1.0).run(stop, duration_s)
        produced_s = time.perf_counter() - start
        drained = wait_for(_progress(stages, sinks, "points_written", report.samples), 300, 0.1)
        meter.stop()
        # what holding the fleet's state costs each stage: resident memory now over what it had idle
        grown = {st.name: rss_bytes(st.proc.pid) - idle_rss[st.name] for st in stages}
        drain_s = time.perf_counter() - start - produced_s
        time.sleep(1.2)
        stored = _sum(sinks, "points_written")
        sink_stats = [st.stats() for st in sinks]
        dead = _sum(processors, "dead_lettered")
        version = _least(processors, "baselines_version")
        verdicts, app_seconds = judged(processors)
    finally:
        _stop(stages)
    settle_s = settled_influxd_s(i, meter)
    meter.spent["influxd"] += settle_s
    us = per_sample_us(meter.spent, stored)
    return {
        "gpus": fleet.size,
        "workers": workers,
        "baselines": baselines,
        "baselines_version": version,
        "verdicts": verdicts,
        "gpu_seconds_by_application": app_seconds,
        "duration_s": duration_s,
        "samples": report.samples,
        "late_rounds": report.late_rounds,
        "stored": stored,
        "dead_lettered": dead,
        "drained": drained,
        "drain_after_last_round_s": drain_s,
        "samples_per_s": stored / (produced_s + drain_s),
        # with several sinks: the worst of them
        "latency_p50_s": max(float(st.get("latency_p50_s") or 0.0) for st in sink_stats),
        "latency_p99_s": max(float(st.get("latency_p99_s") or 0.0) for st in sink_stats),
        "latency_max_s": max(float(st.get("latency_max_s") or 0.0) for st in sink_stats),
        "write_retries": sum(int(st.get("write_retries", 0)) for st in sink_stats),
        "processor_bytes_per_gpu": sum(grown[st.name] for st in processors) / fleet.size,
        "sink_bytes_per_gpu": sum(grown[st.name] for st in sinks) / fleet.size,
        "us_per_sample": us,
        "central_us_per_sample": central_sum(us),
        "influxd_settle_us_per_sample": settle_s * 1e6 / stored,
        "load": meter.load,
    }


def _progress(stages: list[Stage], counted: list[Stage], key: str, at_least: int) -> Callable[[], bool]:
    """A wait condition on the ``counted`` stages' stats that fails loudly if any stage died."""

    def check() -> bool:
        dead = [st for st in stages if not st.alive()]
        if dead:
            raise RuntimeError(f"stage {dead[0].name} exited; see {dead[0].log}")
        return _sum(counted, key) >= at_least

    return check


def _stop(stages: list[Stage]) -> None:
    for st in stages:
        st.stop()


def main(argv: list[str] | None = None) -> int:
    from bench import peer as peer_path  # it builds on this module's phases
    from bench.report import report

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=10_000, help="live fleet size (GPUs sampled at 1 Hz)")
    ap.add_argument("--duration", type=float, default=60.0, help="live phase seconds (0: no live phase)")
    ap.add_argument("--backlog", type=int, default=200_000, help="samples for the saturation phase")
    ap.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        help="processors and sinks (each its group's member); several: "
        "a saturation phase per count, compared with the first",
    )
    ap.add_argument(
        "--learn-nodes", type=int, default=512, help=f"nodes of {GPUS_PER_NODE} GPUs the baselines learn from"
    )
    ap.add_argument("--learn-rounds", type=int, default=60, help="history rounds baselines learn from (0: none)")
    ap.add_argument("--skip-ceilings", action="store_true", help="no Kafka/InfluxDB ceiling phases")
    ap.add_argument("--peer-rounds", type=int, default=20, help="rounds the Telegraf peer moves (0: no peer)")
    ap.add_argument(
        "--profile", type=float, default=0.0, help="seconds of py-spy on the first processor and sink while draining"
    )
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-bench-"))
    print(f"starting local Kafka {base.kafka.version} and InfluxDB {base.influxdb.version} in {run_dir}")
    k = kafka.start(base.services.cache_dir, base.kafka.version, run_dir / "kafka", heap_mb=1024)
    i = influxdb.start(
        base.services.cache_dir,
        base.influxdb.version,
        run_dir / "influxdb",
        "hermeneut",
        "telemetry",
        env={"INFLUXD_STORAGE_CACHE_SNAPSHOT_WRITE_COLD_DURATION": SETTLE_COLD},
    )
    results: dict[str, Any] = {"kafka_version": k.version, "influxdb_version": i.version, "cores": os.cpu_count()}
    learned = learn(args.learn_nodes, args.learn_rounds) if args.learn_rounds else None
    try:
        if not args.skip_ceilings:
            fleet = Fleet(125, GPUS_PER_NODE, seed=1)
            record = round(sum(len(encode_samples(b)) for b in fleet.tick(time.time_ns())) / len(fleet.nodes))
            print(f"1/4 Kafka ceiling: perf tools, {args.backlog // GPUS_PER_NODE} records of {record} B")
            results["kafka"] = kafka_ceiling(base, k, bench_settings(base, k, i, "perf"), args.backlog // 8, record)
            print(f"2/4 InfluxDB ceiling: raw influxdb-client write of {args.backlog} sink lines")
            results["influxdb"] = influx_ceiling(bench_settings(base, k, i, "raw"), args.backlog, i, learned)
        results["saturation"] = []
        for n in args.workers:
            print(f"3/4 saturation: draining a backlog of {args.backlog} samples through {n} processor(s) and sink(s)")
            results["saturation"].append(
                saturation(
                    bench_settings(base, k, i, f"sat{n}"),
                    run_dir / f"sat{n}",
                    args.backlog,
                    k,
                    i,
                    n,
                    learned,
                    args.profile,
                )
            )
        if args.duration > 0:
            print(f"4/4 live: {args.gpus} GPUs at 1 Hz for {args.duration:.0f}s")
            results["live"] = live(
                bench_settings(base, k, i, "live"),
                run_dir / "live",
                args.gpus,
                args.duration,
                k,
                i,
                args.workers[0],
                learned,
            )
        if args.peer_rounds > 0:
            results["peer"] = peer_path.phase(base, k, i, run_dir / "peer", args.gpus, args.peer_rounds, learned)
    finally:
        k.stop()
        i.stop()
        for data in ("kafka", "influxdb"):  # hundreds of MB per run; the stages' logs and profiles are kept
            shutil.rmtree(run_dir / data, ignore_errors=True)
    report(results)
    print(f"stage logs and profiles: {run_dir}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
