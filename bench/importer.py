"""Import benchmark: rows/s of ``hermeneut import`` into Kafka and CPU-us per row of the importer itself, next to the
raw Kafka producer and the pipeline's saturated drain measured in the same run.

    python -m bench.importer [--copies 32] [--backlog 200000] [--json out.json]

Input: the real nanoGPT PR #643 trace (tests/testdata, 6,240 rows of 8 GPUs at ~0.33 s), tiled ``--copies`` times as
that many nodes (a ``host`` column added; the readings and their times unchanged) into a CSV in a temporary folder,
read through a mapping by the ``table`` importer. On a fresh local Kafka and influxd:

1. Kafka ceiling: Kafka's ProducerPerformance with records the size of one import message (one node's 8 samples),
   acks=all, idempotence, lz4 (bench.pipeline's measurement), as samples/s;
2. parse only: the importer's blocks without Kafka (CSV, mapping, units, context): rows/s and CPU-us per row;
3. import: the whole import loop (duplicates, intervals, contexts delivered first, encoding, publishing and
   waiting for delivery) into the raw topic: rows/s and CPU-us per row of this process (librdkafka's threads
   included), and the ratio to the Kafka ceiling;
4. pipeline drain: bench.pipeline's saturation phase (a backlog of simulated samples drained by the processor and
   the sink into InfluxDB), the rate an import is stored at once published;
5. the processor's wait for its context mirror before each batch (``TopicMirror.catch_up`` over the context
   topic's partitions, what makes a context published just ahead of its samples label them): ms per batch.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.pipeline import bench_settings, kafka_ceiling, saturation
from pipeline import registry
from pipeline.codec import decode_record, encode_samples
from pipeline.config import Settings, load_settings
from pipeline.events import GpuContext
from pipeline.mirror import TopicMirror
from pipeline.publisher import Publisher
from pipeline.services import influxdb, kafka
from producers.importers.driver import ImportDriver
from producers.importers.rows import Intervals, node_batches

TRACE = Path(__file__).resolve().parents[1] / "tests" / "testdata" / "nanogpt-pr643-h100x8-nvsmi-timeseries"
MAPPING = """[time]
column = "timestamp"
[gpu]
node_column = "host"
index_column = "gpu_index"
model = "NVIDIA H100 80GB HBM3"
[fields]
temperature_gpu_celsius = "temperature_C"
utilization_gpu_percent = "utilization_gpu_percent"
power_watts = "power_W"
[context]
application = "llm-pretraining"
job = "nanogpt-pr643"
"""


def tiled(folder: Path, copies: int) -> tuple[Path, Path, int]:
    """The trace ``copies`` times over, each copy a node of its own; returns the CSV, the mapping and the rows."""
    with (TRACE / "gpu_metrics_f4f827dd.csv").open(newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    path = folder / "tiled.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*header, "host"])
        for copy in range(copies):
            out.writerows([*row, f"g150-{copy:03d}"] for row in body)
    mapping = folder / "mapping.toml"
    mapping.write_text(MAPPING)
    return path, mapping, copies * len(body)


def parse_only(settings: Settings, path: Path, mapping: Path) -> dict[str, Any]:
    """The importer's blocks and the node messages they become, encoded, without Kafka."""
    importer = registry.create("importer", "table", settings, paths=(path,), mapping=mapping)
    importer.open()
    wall, cpu = time.perf_counter(), time.process_time()
    rows = 0
    intervals = Intervals()
    for block in importer.blocks():
        rows += len(block.rows)
        for batch in node_batches(block.rows, settings.cluster, intervals.per_row(block.rows)):
            encode_samples(batch)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"rows": rows, "rows_per_s": rows / wall, "cpu_us_per_row": cpu / rows * 1e6}


def import_run(settings: Settings, path: Path, mapping: Path) -> dict[str, Any]:
    """The whole import loop into Kafka, every message delivered."""
    importer = registry.create("importer", "table", settings, paths=(path,), mapping=mapping)
    importer.open()
    publisher = Publisher(settings.kafka.client_config())
    wall, cpu = time.perf_counter(), time.process_time()
    report = ImportDriver(importer, publisher, settings.topics, settings.cluster, "bench").run()
    undelivered = publisher.close(120)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "rows": report.rows_read,
        "messages": report.messages,
        "undelivered": undelivered,
        "rows_per_s": report.rows_read / wall,
        "cpu_us_per_row": cpu / report.rows_read * 1e6,
    }


def context_wait(settings: Settings, batches: int = 300) -> dict[str, Any]:
    """ms per ``catch_up`` of the context mirror, as the processor calls it before each batch."""
    mirror = TopicMirror(
        settings.kafka.client_config(), settings.topics.context, lambda v: decode_record(GpuContext, v)
    )
    mirror.start().wait_ready(60)
    mirror.catch_up()
    took = []
    for _ in range(batches):
        start = time.perf_counter()
        mirror.catch_up()
        took.append((time.perf_counter() - start) * 1000)
    mirror.stop()
    took.sort()
    return {"batches": batches, "median_ms": took[len(took) // 2], "p99_ms": took[int(len(took) * 0.99)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=32, help="times the 6,240-row trace is tiled (as nodes)")
    ap.add_argument("--backlog", type=int, default=200_000, help="samples for the pipeline's saturated drain")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-bench-import-"))
    path, mapping, rows = tiled(run_dir, args.copies)
    print(f"starting local Kafka {base.kafka.version} and InfluxDB {base.influxdb.version} in {run_dir}")
    k = kafka.start(base.services.cache_dir, base.kafka.version, run_dir / "kafka", heap_mb=1024)
    i = influxdb.start(base.services.cache_dir, base.influxdb.version, run_dir / "influxdb", "hermeneut", "telemetry")
    results: dict[str, Any] = {"kafka_version": k.version, "influxdb_version": i.version, "rows": rows}
    try:
        settings = bench_settings(base, k, i, "import")
        sample = next(iter(registry.create("importer", "table", settings, paths=(path,), mapping=mapping).blocks()))
        first = next(node_batches(sample.rows, settings.cluster, Intervals().per_row(sample.rows)))
        record = len(encode_samples(first))
        print(f"1/5 Kafka ceiling: ProducerPerformance, {rows // 8} records of {record} B (one import message)")
        results["kafka"] = kafka_ceiling(base, k, bench_settings(base, k, i, "perf"), rows // 8, record)
        print(f"2/5 parse only: {rows} rows through the table importer, encoded, no Kafka")
        results["parse"] = parse_only(settings, path, mapping)
        print(f"3/5 import: {rows} rows into Kafka, every message delivered")
        results["import"] = import_run(settings, path, mapping)
        print(f"4/5 pipeline drain: a backlog of {args.backlog} samples through the processor and sink")
        results["drain"] = saturation(bench_settings(base, k, i, "sat"), run_dir / "sat", args.backlog, k, i, 1, None)
        print("5/5 the processor's wait for its context mirror, per batch")
        results["context_wait"] = context_wait(settings)
    finally:
        k.stop()
        i.stop()
    kc, parsed, imp, drain = results["kafka"], results["parse"], results["import"], results["drain"]
    results["import_ratio_to_kafka"] = imp["rows_per_s"] / kc["producer_samples_per_s"]
    print()
    print(f"{'measure':52} {'rows/s':>10} {'CPU-us/row':>11}")
    print(f"{'Kafka ProducerPerformance (x8 samples/record)':52} {kc['producer_samples_per_s']:>10,.0f}")
    print(
        f"{'importer, parse + encode only (table, CSV)':52} {parsed['rows_per_s']:>10,.0f} "
        f"{parsed['cpu_us_per_row']:>11.1f}"
    )
    print(f"{'import into Kafka (delivered)':52} {imp['rows_per_s']:>10,.0f} {imp['cpu_us_per_row']:>11.1f}")
    print(f"{'  ratio to the Kafka producer':52} {results['import_ratio_to_kafka']:>10.2f}")
    print(f"{'pipeline saturated drain into InfluxDB':52} {drain['samples_per_s']:>10,.0f}")
    wait = results["context_wait"]
    print(f"context mirror catch-up before a batch: median {wait['median_ms']:.2f} ms, p99 {wait['p99_ms']:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
