"""What the Prometheus metrics cost the stages, each next to the stage's own work on the same data, in one run.

A simulated fleet (``Fleet(128, 8, seed=2)``: 1,024 GPUs) is encoded once, one message per node round.

- *processor*: the baseline is ``process_raw`` (decode, validate, normalize) and the detectors on its output, as
  ``processors/app.py`` runs them per take (one round of every node); the metrics are what the app adds per take
  for /metrics (``Conclusions.observe`` of the judged batch, the per-take histograms), timed on the same batches.
  Reported: samples/s per core without and with them, the ratio, and the metrics' own microseconds per sample.
- *sink*: the baseline is the InfluxDB sink's line protocol of the interpreted batches (``sinks.influxdb.lines``);
  the metric is the per-sample latency histogram of the same batches (``BulkHistogram``), and, for scale, the same
  values through prometheus_client's ``Histogram.observe`` one call per sample.
- *scrape*: CPU milliseconds to render the processor's /metrics for the fleet (4 verdict series and a score per GPU),
  and its share of one core at a 15 s scrape interval.

Single process, ``time.process_time`` (CPU time: other load on the machine does not count), best of ``--repeats``.

Run: ``python -m bench.metrics [--rounds 60] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.detectors import APPS, GPUS, NODES, SEED, messages, workloads
from pipeline.config import DetectorSettings, ValidationSettings
from pipeline.deadletter import DeadLetter
from pipeline.events import InterpretedBatch
from pipeline.metrics import BulkHistogram
from processors.detectors.stage import Detectors
from processors.metrics import ProcessorMetrics
from processors.normalize import RawMessage, process_raw
from producers.simulator.fleet import Fleet
from sinks.influxdb.lines import InfoTracker, batch_lines
from sinks.runner import LATENCY_BUCKETS


def processor(msgs: list[RawMessage], profiles: dict[str, str]) -> tuple[float, float]:
    """CPU seconds of the processor's work per take (one round of every node), and of its metrics on the same
    takes."""
    limits, det, now = ValidationSettings(), Detectors(DetectorSettings()), time.time_ns()
    takes = [msgs[i : i + NODES] for i in range(0, len(msgs), NODES)]
    judged: list[tuple[int, list[InterpretedBatch], list[DeadLetter]]] = []
    start = time.process_time()
    for take in takes:
        outcome = process_raw(take, now, limits)
        batches = [det.apply(workloads(profiles, batch), now)[0] for _part, batch in outcome.forward]
        judged.append((len(take), batches, outcome.dead))
    work = time.process_time() - start
    metrics = ProcessorMetrics(CollectorRegistry(), dict)
    start = time.process_time()
    for size, batches, dead in judged:
        for batch in batches:
            metrics.conclusions.observe(batch)
        metrics.took(size, dead, 0.01)
    return work, time.process_time() - start


def interpreted(msgs: list[RawMessage], profiles: dict[str, str]) -> list[InterpretedBatch]:
    now, limits = time.time_ns(), ValidationSettings()
    return [
        workloads(profiles, b)
        for i in range(0, len(msgs), NODES)
        for _p, b in process_raw(msgs[i : i + NODES], now, limits).forward
    ]


def sink(batches: list[InterpretedBatch]) -> tuple[float, float, float]:
    """CPU seconds of the sink's lines of every batch; of the latency figure of each sample through the bulk
    histogram; and of the same through prometheus_client's Histogram, one call per sample."""
    info = InfoTracker()
    start = time.process_time()
    for b in batches:
        batch_lines((b,), info)
    lines = time.process_time() - start
    ack_ns = time.time_ns()
    latencies = [(ack_ns - b.ts_ns) / 1e9 for b in batches]
    bulk = BulkHistogram("x_seconds", "x", LATENCY_BUCKETS, None)
    start = time.process_time()
    for values in latencies:
        bulk.observe(values)
    bulk_s = time.process_time() - start
    single = Histogram("x_seconds", "x", buckets=LATENCY_BUCKETS, registry=None)
    start = time.process_time()
    for values in latencies:
        for v in values.tolist():
            single.observe(v)
    return lines, bulk_s, time.process_time() - start


def scrape(batches: list[InterpretedBatch]) -> tuple[float, int]:
    """CPU seconds and bytes of one scrape of the processor's metrics after these batches."""
    registry = CollectorRegistry()
    metrics = ProcessorMetrics(registry, dict)
    for b in batches:
        metrics.conclusions.observe(replace(b, score=np.ones(len(b))))
    start = time.process_time()
    text = generate_latest(registry)
    return time.process_time() - start, len(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    msgs, _t0 = messages(args.rounds)
    fleet = Fleet(NODES, GPUS, cluster="bench", seed=SEED)
    profiles = {u: APPS[p.name] for u, p in zip(fleet.uuids, fleet.profile, strict=True)}
    samples = args.rounds * NODES * GPUS
    print(f"{NODES} nodes x {GPUS} GPUs, {args.rounds} rounds ({samples} samples), best of {args.repeats}, CPU time")

    runs = [processor(msgs, profiles) for _ in range(args.repeats)]
    base, added = min(r[0] for r in runs), min(r[1] for r in runs)
    print(
        f"processor  normalize + detectors {samples / base:>10,.0f} samples/s; + metrics "
        f"{samples / (base + added):>10,.0f}; ratio {base / (base + added):.3f}; metrics "
        f"{added / samples * 1e6:.2f} us/sample"
    )

    batches = interpreted(msgs, profiles)
    runs = [sink(batches) for _ in range(args.repeats)]
    lines, bulk, single = (min(r[i] for r in runs) for i in range(3))
    print(
        f"sink       lines {samples / lines:>10,.0f} samples/s; + latency histogram "
        f"{samples / (lines + bulk):>10,.0f}; ratio {lines / (lines + bulk):.3f}; histogram "
        f"{bulk / samples * 1e6:.3f} us/sample (one observe() per sample: {single / samples * 1e6:.3f})"
    )

    seconds, size = min(scrape(batches) for _ in range(args.repeats))
    print(
        f"scrape     {NODES * GPUS} GPUs: {seconds * 1e3:.1f} ms CPU, {size / 1e6:.2f} MB per scrape; "
        f"{seconds / 15 * 100:.2f}% of a core at a 15 s interval"
    )


if __name__ == "__main__":
    main()
