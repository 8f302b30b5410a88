"""Kafka client settings, chosen by measurement (issue 13): what each candidate costs in CPU per sample in the client
that produces, in the broker and in the client that consumes, and the bytes per sample the log holds, on the two
hot topics, each with the client libraries that really produce and consume it:

- **raw** (collectors, simulator -> processor): a confluent-kafka producer with pipeline.publisher.Publisher's
  settings (compression varied) -> an aiokafka consumer with faust's settings (the processor's: CRC checks and
  the fetch size varied);
- **interpreted** (processor -> sink): an aiokafka producer with the processor's faust settings (compression,
  linger and batch size varied) -> a confluent-kafka consumer with the sink's settings.

    python -m bench.kafka_clients [--rounds 200] [--repeats 3] [--json out.json]

The messages are real ones: a simulated 1,000-GPU fleet (125 nodes x 8 GPUs, with every extra) encoded as raw
node messages, and the same rounds interpreted by the processor's own code (process_raw and the interpretation
stages, with the fleet's workload context), one interpreted message per partition per round as a live processor
sends them. A fresh local Kafka; each (case, repeat) produces into a topic of its own, flushes, then reads it all
back from the start (after one uncounted warm-up run per topic). CPU is read per phase (bench.cpu.CpuMeter): the
producing or consuming client is this process (all its threads: librdkafka's, the event loop's), the broker from
/proc. Each figure is the median of the repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from tqdm import tqdm

from bench.cpu import CpuMeter, per_sample_us
from pipeline.codec import encode_interpreted, encode_samples
from pipeline.config import Settings
from pipeline.events import GpuContext, node_key
from pipeline.publisher import COMPRESSION, Publisher
from pipeline.services import kafka
from processors.app import (
    CLIENT_MAX_REQUEST_BYTES,
    PRODUCER_BATCH_BYTES,
    PRODUCER_COMPRESSION,
    PRODUCER_LINGER_MS,
    interpreter_from,
)
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet

#: partitions of each topic (the raw topic's default); the interpreted messages of a round are one per partition
PARTITIONS: Final = 6
Message = tuple[bytes, bytes, int]
#: how long reading a topic back may take before the case fails (a lost message must not hang the benchmark)
READ_S: Final = 300.0


@dataclass(frozen=True)
class Case:
    """One candidate: which topic's messages, the producer's settings over the path's own, the consumer's."""

    topic: str
    name: str
    producer: dict[str, Any] = field(default_factory=dict)
    consumer: dict[str, Any] = field(default_factory=dict)


_16K: Final = 16384  # faust's default producer batch
CASES: Final = (
    Case("raw", "lz4", {"compression.type": "lz4"}),
    Case("raw", "none", {"compression.type": "none"}),
    Case("raw", "zstd", {"compression.type": "zstd"}),
    Case("raw", "zstd, consumer without CRC checks", {"compression.type": "zstd"}, {"check_crcs": False}),
    Case("raw", "zstd, consumer fetch 4 MiB", {"compression.type": "zstd"}, {"max_partition_fetch_bytes": 4 * 2**20}),
    Case("interpreted", "none, batch 16 KiB", {"compression_type": None, "max_batch_size": _16K}),
    Case("interpreted", "lz4, batch 16 KiB", {"compression_type": "lz4", "max_batch_size": _16K}),
    Case("interpreted", "zstd, batch 16 KiB", {"compression_type": "zstd", "max_batch_size": _16K}),
    Case("interpreted", "none, batch 1 MiB", {"compression_type": None, "max_batch_size": 2**20}),
    Case("interpreted", "zstd, batch 1 MiB", {"compression_type": "zstd", "max_batch_size": 2**20}),
    Case(
        "interpreted",
        "zstd, batch 1 MiB, linger 50 ms",
        {"compression_type": "zstd", "max_batch_size": 2**20, "linger_ms": 50},
    ),
)


def chosen(case: Case) -> bool:
    """Whether the case is what the code sends with now (pipeline.publisher, processors.app)."""
    if case.topic == "raw":
        return case.producer == {"compression.type": COMPRESSION} and not case.consumer
    return case.producer == {"compression_type": PRODUCER_COMPRESSION, "max_batch_size": PRODUCER_BATCH_BYTES}


def messages(rounds: int, start_ns: int) -> tuple[list[Message], list[Message], int]:
    """The raw node messages and the interpreted messages of ``rounds`` rounds of the fleet, and the samples."""
    fleet = Fleet(125, 8, cluster="bench-clients", seed=5)
    contexts: dict[bytes, GpuContext] = {}
    topologies = {t.kafka_key: t for t in fleet.topologies(start_ns)}
    interpreter = interpreter_from(Settings(), contexts.get, lambda c, n: topologies.get(node_key(c, n)), lambda: None)
    raw: list[Message] = []
    interpreted: list[Message] = []
    samples = 0
    for r in tqdm(range(rounds), desc="messages", unit=" rounds", mininterval=2.0):
        ts = start_ns + r * 1_000_000_000
        sim = fleet.round(ts)
        contexts |= {c.kafka_key: c for c in sim.contexts}
        batch = [RawMessage(b.kafka_key, encode_samples(b), "bench", i % PARTITIONS) for i, b in enumerate(sim.batches)]
        raw += [(m.key, m.value, m.partition) for m in batch]
        out = process_raw(batch, time.time_ns(), Settings().validation)
        for part, b in out.forward:
            interpreted.append((f"partition-{part}".encode(), encode_interpreted(interpreter.apply(b, ts)[0]), part))
        samples += out.samples_ok
    return raw, interpreted, samples


def _log_bytes(k: kafka.KafkaProcess, topic: str) -> int:
    return sum(p.stat().st_size for p in (k.run_dir / "data").glob(f"{topic}-*/*.log"))


def produce_confluent(k: kafka.KafkaProcess, topic: str, msgs: list[Message], extra: dict[str, Any]) -> None:
    pub = Publisher({"bootstrap.servers": k.bootstrap_servers}, extra=extra)
    for key, value, _part in msgs:  # partitioned by key (the node), as collectors send them
        pub.publish(topic, key, value)
    if pub.close(120) != 0:
        raise RuntimeError(f"{topic}: messages not delivered")


async def produce_aiokafka(k: kafka.KafkaProcess, topic: str, msgs: list[Message], extra: dict[str, Any]) -> None:
    # the processor's faust settings (processors/app.py), compression and batch size as the case says
    conf: dict[str, Any] = {"acks": "all", "linger_ms": PRODUCER_LINGER_MS}
    producer = AIOKafkaProducer(
        bootstrap_servers=k.bootstrap_servers, max_request_size=CLIENT_MAX_REQUEST_BYTES, **(conf | extra)
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key, partition=part) for key, value, part in msgs]
        await producer.flush()
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def consume_aiokafka(k: kafka.KafkaProcess, topic: str, count: int, extra: dict[str, Any]) -> int:
    # faust's consumer (faust/transport/drivers/aiokafka.py): CRC checks on, 1 MiB per partition, 1.5 s max wait
    conf: dict[str, Any] = {"check_crcs": True, "max_partition_fetch_bytes": 2**20, "fetch_max_wait_ms": 1500}
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=k.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **(conf | extra),
    )
    await consumer.start()
    seen, deadline = 0, time.monotonic() + READ_S
    try:
        while seen < count and time.monotonic() < deadline:
            got = await consumer.getmany(timeout_ms=1000, max_records=500)
            seen += sum(len(v) for v in got.values())
    finally:
        await consumer.stop()
    return seen


def consume_confluent(k: kafka.KafkaProcess, topic: str, count: int, extra: dict[str, Any]) -> int:
    # the sink's consumer (sinks/runner.py): 50 ms max wait, up to 1,000 messages per call
    consumer = Consumer(
        {
            "bootstrap.servers": k.bootstrap_servers,
            "group.id": f"bench-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
            **extra,
        }
    )
    consumer.subscribe([topic])
    seen, deadline = 0, time.monotonic() + READ_S
    try:
        while seen < count and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(num_messages=1000, timeout=0.05) if m.error() is None)
    finally:
        consumer.close()
    return seen


def run_case(k: kafka.KafkaProcess, case: Case, topic: str, msgs: list[Message], samples: int) -> dict[str, float]:
    """Produce ``msgs`` into a new topic, then read them back: CPU-us per sample of each party, bytes per sample."""
    create_topic(k, topic)
    pids = {"client": (os.getpid(),), "broker": (k.pid,)}
    produced = CpuMeter(pids).start()
    if case.topic == "raw":
        produce_confluent(k, topic, msgs, case.producer)
    else:
        asyncio.run(produce_aiokafka(k, topic, msgs, case.producer))
    produced.stop()
    consumed = CpuMeter(pids).start()
    if case.topic == "raw":
        seen = asyncio.run(consume_aiokafka(k, topic, len(msgs), case.consumer))
    else:
        seen = consume_confluent(k, topic, len(msgs), case.consumer)
    consumed.stop()
    if seen != len(msgs):
        raise RuntimeError(f"{topic}: read {seen} of {len(msgs)} messages")
    out, back = per_sample_us(produced.spent, samples), per_sample_us(consumed.spent, samples)
    return {
        "producer_us": out["client"],
        "broker_us": out["broker"] + back["broker"],
        "consumer_us": back["client"],
        "sum_us": sum(out.values()) + sum(back.values()),
        "log_bytes_per_sample": _log_bytes(k, topic) / samples,
        "produce_s": produced.wall_s,
        "consume_s": consumed.wall_s,
        "load": consumed.load[0],
    }


def create_topic(k: kafka.KafkaProcess, topic: str) -> None:
    """A new topic, once the broker holds a log for every partition (a producer started earlier is refused as
    "not leader" and retries, which costs CPU)."""
    admin = AdminClient({"bootstrap.servers": k.bootstrap_servers})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    while len(list((k.run_dir / "data").glob(f"{topic}-*"))) < PARTITIONS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{topic}: the broker holds no log for some partitions after 30 s")
        time.sleep(0.05)


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def measure(
    k: kafka.KafkaProcess, corpus: dict[str, tuple[list[Message], int]], repeats: int, cases: Sequence[Case]
) -> list[dict[str, Any]]:
    """Every case ``repeats`` times, interleaved (case 1, 2, ..., then again), so load drifts touch all alike; after
    one uncounted run of each topic's first case (the broker's JIT warming up)."""
    for topic, (msgs, samples) in corpus.items():
        warm = next(c for c in cases if c.topic == topic)
        run_case(k, warm, f"bench-{topic}-warm-up", msgs, samples)
    runs: list[list[dict[str, float]]] = [[] for _ in cases]
    bar = tqdm(total=repeats * len(cases), desc="cases", unit=" runs")
    for r in range(repeats):
        for i, case in enumerate(cases):
            runs[i].append(run_case(k, case, f"bench-{case.topic}-{i}-{r}", *corpus[case.topic]))
            bar.update(1)
    bar.close()
    load = max(run["load"] for mine in runs for run in mine)
    return [
        {"topic": c.topic, "case": c.name + (" (chosen)" if chosen(c) else ""), **median_of(mine), "load": load}
        for c, mine in zip(cases, runs, strict=True)
    ]


def report(rows: list[dict[str, Any]], out: Callable[[str], None] = print) -> None:
    out("| topic | case | producer | broker | consumer | sum (CPU-us per sample) | log bytes per sample |")
    out("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        out(
            f"| {row['topic']} | {row['case']} | {row['producer_us']:.2f} | {row['broker_us']:.2f} | "
            f"{row['consumer_us']:.2f} | {row['sum_us']:.2f} | {row['log_bytes_per_sample']:.0f} |"
        )
    out(f"(load average up to {max(r['load'] for r in rows):.1f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200, help="rounds of the 1,000-GPU fleet (samples = 1,000 x)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case (the median is reported)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    base = Settings()
    raw, interpreted, samples = messages(args.rounds, time.time_ns() - args.rounds * 1_000_000_000)
    print(f"{samples} samples: {len(raw)} raw messages, {len(interpreted)} interpreted messages")
    with tempfile.TemporaryDirectory(prefix="hermeneut-bench-clients-") as tmp:
        k = kafka.start(base.services.cache_dir, base.kafka.version, Path(tmp) / "kafka", heap_mb=1024)
        try:
            rows = measure(k, {"raw": (raw, samples), "interpreted": (interpreted, samples)}, args.repeats, CASES)
        finally:
            k.stop()
    report(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
