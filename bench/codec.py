"""Micro-benchmark behind two wire choices: the codec (MessagePack) and the message granularity (one node round).

A. Codec. Simulated samples (``Fleet(125, 8, seed=1)``: 1,000 GPUs per round, several rounds), encoded one
   message per node round, as the producers do. For MessagePack (``pipeline.codec``: the column-wise form the
   producers send, its readings a float64 buffer, and the row-wise form others may), orjson and stdlib json
   (with the row-wise structure: JSON has no binary buffers) it measures encode and decode cost (µs per GPU
   sample, best of N per 1,000-sample chunk with ``time.perf_counter``), bytes per sample, and LZ4-frame size per
   sample (per message, and per round of messages compressed together, which is closer to what a Kafka lz4
   record batch sees). MessagePack decode is shown both as a bare ``unpackb`` (like for like with
   ``orjson.loads``) and as ``decode_raw``, which adds the project's envelope and sample validation. It also
   checks what matters beyond speed: NaN and int64.

B. Granularity. One message per GPU sample vs one per node round (8 samples): encode/decode CPU per sample, and
   real Kafka throughput on a local broker (``pipeline.services.kafka``) with 6-partition topics: encode +
   produce + flush through ``pipeline.publisher.Publisher`` (idempotent, acks=all, lz4, linger.ms=20, keyed by
   node), then consume with a fresh group and decode every message with ``decode_raw``; plus the bytes the
   broker stored per sample.

C. Interpreted batches, the processor -> sink hop: the same fleet with its workload context, interpreted with
   learned baselines, a batch per round and raw partition (live, each GPU has one row in a message, as here; a
   drained backlog packs several rounds into one). ``encode_interpreted`` and ``decode_interpreted`` per row, next
   to bare ``msgpack.packb`` / ``unpackb`` of the same maps (what the codec adds over MessagePack itself: the
   column buffers, the checks, the objects).

Run: ``python -m bench.codec [--quick] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import orjson
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from pipeline.codec import (
    decode_interpreted,
    decode_raw,
    decode_samples,
    encode_interpreted,
    encode_samples,
    sample_columns,
    sample_rows,
)
from pipeline.config import Settings, ValidationSettings
from pipeline.events import GpuSample, SampleBatch
from pipeline.publisher import Publisher
from pipeline.services import kafka
from processors.normalize import RawMessage, process_raw
from producers.simulator.fleet import Fleet

NODES, GPUS_PER_NODE, SEED = 125, 8, 1
T0_NS = 1_763_790_000_123_456_789  # a realistic UTC epoch-ns timestamp with non-zero low digits
ROUND_NS = 1_000_000_000
Conf = dict[str, str]  # librdkafka settings, as KafkaSettings.client_config() gives them
KAFKA_VERSION = "4.1.1"
PARTITIONS = 6


@dataclass(frozen=True)
class Plan:
    rounds: int  # fleet rounds for parts A and C (1,000 samples each)
    repeats: int  # best-of-N repeats for CPU timings
    kafka_samples: int  # samples per Kafka pass and granularity
    kafka_passes: int  # measured passes (after one warm-up pass)
    warmup_samples: int
    learn_rounds: int  # history rounds the baselines of part C learn from


FULL = Plan(rounds=5, repeats=15, kafka_samples=200_000, kafka_passes=3, warmup_samples=20_000, learn_rounds=300)
QUICK = Plan(rounds=2, repeats=5, kafka_samples=40_000, kafka_passes=1, warmup_samples=8_000, learn_rounds=60)


def progress(msg: str) -> None:
    print(f"[bench.codec] {msg}", flush=True)


def lz4_compressor() -> tuple[str, Callable[[bytes], bytes]]:
    """``lz4.frame.compress`` when the lz4 package is there, else cramjam's LZ4 frame (what aiokafka uses)."""
    try:
        import lz4.frame  # type: ignore[import-not-found]

        return "lz4.frame", lz4.frame.compress
    except ImportError:
        import cramjam

        return "cramjam.lz4 (LZ4 frame)", lambda data: bytes(cramjam.lz4.compress(data))


def best_of(fn: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` runs of ``fn``, in seconds."""
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _call_each(fn: Callable[[Any], object], items: Sequence[Any]) -> None:
    for item in items:
        fn(item)


def per_sample_us(fn: Callable[[Any], object], items: Sequence[Any], samples: int, repeats: int) -> float:
    """``fn`` over all ``items``, in µs per GPU sample: the sum of best-of-``repeats`` times of ~1,000-sample chunks.

    Short chunks keep one preemption (the broker, other processes on a small machine) from spoiling a repeat.
    """
    size = max(1, len(items) * 1_000 // samples)
    chunks = [items[i : i + size] for i in range(0, len(items), size)]
    total = sum(best_of(partial(_call_each, fn, chunk), repeats) for chunk in chunks)
    return total / samples * 1e6


def fleet_rounds(rounds: int) -> list[list[SampleBatch]]:
    fleet = Fleet(NODES, GPUS_PER_NODE, seed=SEED)
    return [fleet.tick(T0_NS + r * ROUND_NS) for r in range(rounds)]


def per_gpu(batches: Sequence[SampleBatch]) -> list[SampleBatch]:
    """The same samples, one SampleBatch (one Kafka message) per GPU sample."""
    return [SampleBatch(b.cluster, b.node, (s,), schema_version=b.schema_version) for b in batches for s in b.samples]


def sample_count(batches: Sequence[SampleBatch]) -> int:
    return sum(len(b.samples) for b in batches)


# --- A. codec ---------------------------------------------------------------------------------------------------


def encode_orjson(batch: SampleBatch) -> bytes:
    return orjson.dumps(sample_rows(batch))


def encode_json(batch: SampleBatch) -> bytes:
    return json.dumps(sample_rows(batch), separators=(",", ":")).encode()


def encode_rows(batch: SampleBatch) -> bytes:
    """The row-wise form of the raw schema (what producers other than hermeneut's may send)."""
    out: bytes = msgpack.packb(sample_rows(batch), use_bin_type=True)
    return out


def unpack_only(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=True)


@dataclass(frozen=True)
class Codec:
    name: str
    encode: Callable[[SampleBatch], bytes]
    parse: Callable[[bytes], Any]
    shape: Callable[[SampleBatch], dict[str, Any]]  # the map it encodes
    validate: Callable[[bytes], Any] | None = None  # parse + the project's validation, where it exists


CODECS = (
    Codec("msgpack", encode_samples, unpack_only, sample_columns, decode_raw),
    Codec("msgpack rows", encode_rows, unpack_only, sample_rows, decode_raw),
    Codec("orjson", encode_orjson, orjson.loads, sample_rows),
    Codec("json", encode_json, json.loads, sample_rows),
)


@dataclass
class CodecResult:
    codec: str
    encode_us: float
    parse_us: float
    validate_us: float | None
    bytes_per_sample: float
    lz4_msg_bytes_per_sample: float
    lz4_round_bytes_per_sample: float


def check_same_structure(rounds: list[list[SampleBatch]]) -> None:
    """Every codec round-trips its structure; decode_samples gives back the very samples from both forms."""
    batch = rounds[0][0]
    for codec in CODECS:
        if codec.parse(codec.encode(batch)) != codec.shape(batch):
            raise AssertionError(f"{codec.name} does not round-trip the envelope")
        if codec.validate is None:
            continue
        decoded, rejected = decode_samples(codec.encode(batch))
        if rejected or decoded != batch:
            raise AssertionError(f"decode_samples changed the batch ({codec.name}): {rejected}")


def measure_codec(
    codec: Codec, rounds: list[list[SampleBatch]], repeats: int, lz4: Callable[[bytes], bytes]
) -> CodecResult:
    batches = [b for r in rounds for b in r]
    n = sample_count(batches)
    payloads = [codec.encode(b) for b in batches]
    per_round = [[codec.encode(b) for b in r] for r in rounds]
    return CodecResult(
        codec=codec.name,
        encode_us=per_sample_us(codec.encode, batches, n, repeats),
        parse_us=per_sample_us(codec.parse, payloads, n, repeats),
        validate_us=None if codec.validate is None else per_sample_us(codec.validate, payloads, n, repeats),
        bytes_per_sample=sum(map(len, payloads)) / n,
        lz4_msg_bytes_per_sample=sum(len(lz4(p)) for p in payloads) / n,
        lz4_round_bytes_per_sample=sum(len(lz4(b"".join(r))) for r in per_round) / n,
    )


def wire_facts() -> dict[str, Any]:
    """What each encoding does with a NaN reading and with int64 values (timestamps, 64-bit masks)."""
    nan_metrics = {"power_watts": float("nan")}
    sample = GpuSample("sim", "node-0000", "GPU-0", 0, "NVIDIA H100 80GB HBM3", T0_NS, nan_metrics)
    batch = SampleBatch("sim", "node-0000", (sample,))
    out = process_raw([RawMessage(batch.kafka_key, encode_samples(batch), "facts")], T0_NS, ValidationSettings())
    int64_max = 2**63 - 1
    return {
        "orjson_nan": orjson.dumps(nan_metrics).decode(),
        "json_nan": json.dumps(nan_metrics),
        "msgpack_nan_roundtrips": math.isnan(msgpack.unpackb(msgpack.packb(float("nan")))),
        "msgpack_nan_dead_letter": [d.reason for d in out.dead],
        "orjson_loads_of_NaN_json": _orjson_error(json.dumps(nan_metrics).encode()),  # RFC 8259 has no NaN
        "msgpack_int64_max_exact": msgpack.unpackb(msgpack.packb(int64_max)) == int64_max,
        "ts_ns": T0_NS,
        "ts_ns_above_2_pow_53": T0_NS > 2**53,
        "ts_ns_error_if_read_as_float64_ns": int(float(T0_NS)) - T0_NS,
    }


def _orjson_error(data: bytes) -> str:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return f"JSONDecodeError: {str(exc).split(':')[0]}"
    return "accepted"


# --- B. granularity -----------------------------------------------------------------------------------------------


@dataclass
class GranularityCpu:
    granularity: str
    samples_per_message: int
    encode_us: float
    decode_us: float
    bytes_per_sample: float


def measure_granularity_cpu(rounds: list[list[SampleBatch]], repeats: int) -> list[GranularityCpu]:
    node_batches = [b for r in rounds for b in r]
    out = []
    for name, batches in (("per-GPU", per_gpu(node_batches)), ("node batch", node_batches)):
        n = sample_count(batches)
        payloads = [encode_samples(b) for b in batches]
        out.append(
            GranularityCpu(
                granularity=name,
                samples_per_message=n // len(batches),
                encode_us=per_sample_us(encode_samples, batches, n, repeats),
                decode_us=per_sample_us(decode_raw, payloads, n, repeats),
                bytes_per_sample=sum(map(len, payloads)) / n,
            )
        )
    return out


@dataclass
class KafkaPass:
    granularity: str
    topic: str
    samples: int
    messages: int
    produce_s: float
    consume_s: float
    stored_bytes: int

    @property
    def produce_rate(self) -> float:
        return self.samples / self.produce_s

    @property
    def consume_rate(self) -> float:
        return self.samples / self.consume_s


@dataclass
class KafkaResult:
    broker: str
    samples: int
    passes: list[KafkaPass] = field(default_factory=list)

    def best(self, granularity: str) -> KafkaPass:
        mine = [p for p in self.passes if p.granularity == granularity]
        return KafkaPass(
            granularity,
            "best of " + ", ".join(p.topic for p in mine),
            mine[0].samples,
            mine[0].messages,
            min(p.produce_s for p in mine),
            min(p.consume_s for p in mine),
            min(p.stored_bytes for p in mine),
        )


def rdkafka(conf: Conf) -> dict[str, str | int | float | bool]:
    return {**conf}


def create_topic(admin: AdminClient, name: str) -> None:
    admin.create_topics([NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)])[name].result(timeout=30)


def produce(publisher: Publisher, topic: str, batches: Sequence[SampleBatch]) -> float:
    """Encode + produce + flush every batch; seconds. Fails unless every message was delivered."""
    stats = publisher.stats
    delivered, failed = stats.delivered, stats.failed
    start = time.perf_counter()
    for batch in batches:
        publisher.publish(topic, batch.kafka_key, encode_samples(batch))
    remaining = publisher.flush(60)
    elapsed = time.perf_counter() - start
    if remaining or stats.failed != failed or stats.delivered - delivered != len(batches):
        raise RuntimeError(f"{topic}: delivered {stats.delivered - delivered}/{len(batches)}, {remaining} in flight")
    return elapsed


def consume(conf: Conf, topic: str, expected_samples: int, timeout_s: float = 120) -> float:
    """Consume and decode until ``expected_samples`` came back; seconds from the first fetch that returned data."""
    consumer = Consumer(
        {
            **conf,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    samples, start, deadline = 0, None, time.monotonic() + timeout_s
    try:
        while samples < expected_samples:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{topic}: consumed {samples}/{expected_samples} samples in {timeout_s}s")
            called = time.perf_counter()
            # consume() waits for num_messages or the timeout: a short timeout keeps the last call from idling
            messages = consumer.consume(num_messages=1_000, timeout=0.02)
            if messages and start is None:
                start = called  # group join and assignment are not throughput
            for msg in messages:
                if msg.error() is not None:
                    raise RuntimeError(f"{topic}: {msg.error()}")
                raw, rejected = decode_raw(msg.value() or b"")
                if rejected:
                    raise RuntimeError(f"{topic}: rejected {rejected[0]}")
                samples += len(raw.uuid)
        assert start is not None
        return time.perf_counter() - start
    finally:
        consumer.close()


def stored_bytes(data_dir: Path, topic: str) -> int:
    """Bytes of the topic's log segments on the broker (record batches: compressed, with Kafka's overhead)."""
    return sum(f.stat().st_size for p in range(PARTITIONS) for f in (data_dir / f"{topic}-{p}").glob("*.log"))


@dataclass
class Broker:
    """A running local broker and the clients the passes share (one producer: its idempotence PID is warm)."""

    conf: Conf
    admin: AdminClient
    publisher: Publisher
    data_dir: Path


def kafka_pass(broker: Broker, name: str, granularity: str, batches: list[SampleBatch]) -> KafkaPass:
    topic = f"bench.{name}.{granularity.replace(' ', '-')}"
    create_topic(broker.admin, topic)
    n = sample_count(batches)
    produce_s = produce(broker.publisher, topic, batches)
    consume_s = consume(broker.conf, topic, n)
    stored = stored_bytes(broker.data_dir, topic)
    result = KafkaPass(granularity, topic, n, len(batches), produce_s, consume_s, stored)
    progress(
        f"kafka {name:<7} {granularity:<10}: produce {result.produce_rate:>9,.0f} samples/s, "
        f"consume+decode {result.consume_rate:>9,.0f} samples/s ({len(batches):,} messages)"
    )
    return result


def measure_kafka(plan: Plan) -> KafkaResult:
    progress(f"kafka: simulating {plan.kafka_samples:,} samples")
    node_batches = [b for r in fleet_rounds(math.ceil(plan.kafka_samples / (NODES * GPUS_PER_NODE))) for b in r]
    by_gpu = per_gpu(node_batches)
    measured = {"per-GPU": by_gpu, "node batch": node_batches}
    head = node_batches[: plan.warmup_samples // GPUS_PER_NODE]
    warmup = {"per-GPU": per_gpu(head), "node batch": head}
    settings = Settings()
    tmp = Path(tempfile.mkdtemp(prefix="hermeneut-bench-codec-"))
    proc: kafka.KafkaProcess | None = None
    broker: Broker | None = None
    try:
        progress(f"kafka: starting a local Kafka {KAFKA_VERSION} broker in {tmp}")
        proc = kafka.start(settings.services.cache_dir, KAFKA_VERSION, tmp / "kafka")
        conf: Conf = {"bootstrap.servers": proc.bootstrap_servers}
        # the Publisher's settings: idempotent, acks=all, lz4, linger.ms=20, batch.size 1 MB
        broker = Broker(conf, AdminClient(rdkafka(conf)), Publisher(conf, linger_ms=20), tmp / "kafka" / "data")
        result = KafkaResult(f"Kafka {KAFKA_VERSION} (local, 1 broker, {PARTITIONS} partitions)", len(by_gpu))
        for granularity, batches in warmup.items():
            kafka_pass(broker, "warmup", granularity, batches)
        order = list(measured)
        for i in range(plan.kafka_passes):
            for granularity in order if i % 2 == 0 else order[::-1]:
                result.passes.append(kafka_pass(broker, f"pass{i + 1}", granularity, measured[granularity]))
        return result
    finally:
        broker = None  # the clients hold reference cycles (delivery callbacks): free them before the broker goes
        gc.collect()
        if proc is not None:
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


# --- C. interpreted batches -------------------------------------------------------------------------------------


@dataclass
class InterpretedResult:
    rows: int
    messages: int
    workloads_per_row: float  # distinct workloads per message, over its rows: what the sink decodes per row
    encode_us: float
    packb_us: float
    decode_us: float
    unpackb_us: float


def measure_interpreted(plan: Plan) -> InterpretedResult:
    from bench.pipeline import interpreted_batches  # the pipeline benchmark's processor path, context and baselines
    from bench.scoring import fitted

    learned = fitted(Fleet(32, GPUS_PER_NODE, seed=5), plan.learn_rounds)
    fleet = Fleet(NODES, GPUS_PER_NODE, seed=SEED)
    batches = list(interpreted_batches(fleet, plan.rounds, time.time_ns() - 3600 * 10**9, learned, PARTITIONS))
    rows = sum(len(b.gpu_uuid) for b in batches)
    payloads = [encode_interpreted(b) for b in batches]
    maps = [msgpack.unpackb(p) for p in payloads]
    workloads = sum(len(set(b.workload) - {None}) for b in batches)
    return InterpretedResult(
        rows=rows,
        messages=len(batches),
        workloads_per_row=workloads / rows,
        encode_us=per_sample_us(encode_interpreted, batches, rows, plan.repeats),
        packb_us=per_sample_us(partial(msgpack.packb, use_bin_type=True), maps, rows, plan.repeats),
        decode_us=per_sample_us(decode_interpreted, payloads, rows, plan.repeats),
        unpackb_us=per_sample_us(msgpack.unpackb, payloads, rows, plan.repeats),
    )


def interpreted_table(r: InterpretedResult) -> str:
    rows = [
        [name, f"{ours:.2f}", f"{bare_name} {bare:.2f}", f"x{ours / bare:.1f}"]
        for name, ours, bare_name, bare in (
            ("encode_interpreted", r.encode_us, "packb", r.packb_us),
            ("decode_interpreted", r.decode_us, "unpackb", r.unpackb_us),
        )
    ]
    return table(["", "µs per row", "bare msgpack, same maps", "ratio"], rows)


# --- report -------------------------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join("-" * w for w in widths)
    fmt = [f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(headers, widths, strict=True))]
    body = [
        "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    return "\n".join(["  ".join(fmt), line, *body])


def codec_table(results: Sequence[CodecResult]) -> str:
    rows = [
        [
            r.codec,
            f"{r.encode_us:.2f}",
            f"{r.parse_us:.2f}",
            "-" if r.validate_us is None else f"{r.validate_us:.2f}",
            f"{r.bytes_per_sample:.0f}",
            f"{r.lz4_msg_bytes_per_sample:.0f}",
            f"{r.lz4_round_bytes_per_sample:.0f}",
        ]
        for r in results
    ]
    headers = ["codec", "encode µs", "parse µs", "decode_raw µs", "B/sample", "lz4/msg B", "lz4/round B"]
    return table(headers, rows)


def granularity_table(cpu: Sequence[GranularityCpu], kafka_result: KafkaResult) -> str:
    rows = []
    for c in cpu:
        k = kafka_result.best(c.granularity)
        rows.append(
            [
                c.granularity,
                str(c.samples_per_message),
                f"{c.encode_us:.2f}",
                f"{c.decode_us:.2f}",
                f"{c.bytes_per_sample:.0f}",
                f"{k.stored_bytes / k.samples:.0f}",
                f"{k.produce_rate:,.0f}",
                f"{k.consume_rate:,.0f}",
            ]
        )
    headers = [
        "granularity",
        "samples/msg",
        "encode µs",
        "decode µs",
        "B/sample",
        "stored B/sample",
        "produce samples/s",
        "consume samples/s",
    ]
    return table(headers, rows)


def facts_lines(facts: dict[str, Any]) -> list[str]:
    err_ns = facts["ts_ns_error_if_read_as_float64_ns"]
    return [
        f"   NaN reading: orjson -> {facts['orjson_nan']} (the NaN is gone); json -> {facts['json_nan']}",
        f"                (not JSON: orjson.loads says {facts['orjson_loads_of_NaN_json']});",
        f"                msgpack keeps NaN: {facts['msgpack_nan_roundtrips']}, the processor dead-letters it as "
        f"{facts['msgpack_nan_dead_letter']}",
        f"   int64:       msgpack 2**63-1 exact: {facts['msgpack_int64_max_exact']}; ts_ns {facts['ts_ns']} > 2**53: "
        f"{facts['ts_ns_above_2_pow_53']},",
        f"                a JSON reader that parses numbers as float64 gets it off by {err_ns} ns",
    ]


def choice_line(codecs: Sequence[CodecResult], facts: dict[str, Any], kafka_result: KafkaResult) -> str:
    """The decision rule: exactness first (a NaN reading must reach validation as NaN, not as a missing value, and
    ``ts_ns`` must survive any reader), then the price of it, measured here."""
    by = {r.codec: r for r in codecs}
    mp, oj = by["msgpack"], by["orjson"]
    extra_us = (mp.encode_us + mp.parse_us) - (oj.encode_us + oj.parse_us)
    price = (
        f"its price here: {extra_us:+.1f} us per sample against orjson (encode + parse), "
        f"{mp.lz4_round_bytes_per_sample / oj.lz4_round_bytes_per_sample:.2f}x its lz4 size"
    )
    exact = facts["msgpack_nan_roundtrips"] and facts["msgpack_int64_max_exact"]
    node, gpu = kafka_result.best("node batch"), kafka_result.best("per-GPU")
    produce_ratio, consume_ratio = node.produce_rate / gpu.produce_rate, node.consume_rate / gpu.consume_rate
    codec = (
        "MessagePack (it carries NaN and int64 exactly; JSON turns a NaN reading into null, a missing value that "
        "would pass validation)"
        if exact
        else "orjson (MessagePack did not round-trip NaN and int64 here)"
    )
    granularity = "one message per node round" if min(produce_ratio, consume_ratio) > 1 else "one message per GPU"
    return (
        f"Choice: {codec}; {price}. And {granularity} (node batch / per-GPU: {produce_ratio:.1f}x produce, "
        f"{consume_ratio:.1f}x consume throughput)."
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, repeats and Kafka samples")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    lz4_name, lz4 = lz4_compressor()

    progress(f"codec: simulating {plan.rounds} rounds of Fleet({NODES}, {GPUS_PER_NODE}, seed={SEED})")
    rounds = fleet_rounds(plan.rounds)
    check_same_structure(rounds)
    codecs = []
    for codec in CODECS:
        progress(f"codec: {codec.name} (best of {plan.repeats})")
        codecs.append(measure_codec(codec, rounds, plan.repeats, lz4))
    facts = wire_facts()
    progress("granularity: encode/decode CPU per-GPU vs node batch")
    cpu = measure_granularity_cpu(rounds, plan.repeats)
    kafka_result = measure_kafka(plan)
    progress(f"interpreted batches: learning baselines ({plan.learn_rounds} rounds), interpreting {plan.rounds} rounds")
    interpreted = measure_interpreted(plan)

    n = plan.rounds * NODES * GPUS_PER_NODE
    print()
    print(f"A. Codec: {n:,} simulated samples, one message per node round (8 samples),")
    print(f"   µs (best of {plan.repeats} per 1,000-sample chunk) and bytes per GPU sample;")
    print(f"   lz4 = {lz4_name}, per message and per round of 125 messages")
    print(codec_table(codecs))
    print("\n".join(facts_lines(facts)))
    print()
    print(f"B. Granularity: msgpack, {kafka_result.broker}; CPU columns on {n:,} samples,")
    print(f"   Kafka columns best of {plan.kafka_passes} pass(es) of {kafka_result.samples:,} samples after a warm-up;")
    print("   produce = encode + produce + flush (idempotent, acks=all, lz4, linger.ms=20);")
    print(f"   consume = fetch + decode_raw; {os.cpu_count()} CPUs shared by the broker and this process")
    print(granularity_table(cpu, kafka_result))
    print()
    print(f"C. Interpreted batches (processor -> sink): {interpreted.rows:,} rows in {interpreted.messages} messages,")
    print(f"   one per partition per round; {interpreted.workloads_per_row:.2f} distinct workloads per row;")
    print(f"   µs per row, best of {plan.repeats} per 1,000-row chunk")
    print(interpreted_table(interpreted))
    print()
    print(choice_line(codecs, facts, kafka_result))

    if args.json:
        payload = {
            "plan": asdict(plan),
            "lz4": lz4_name,
            "codec": [asdict(r) for r in codecs],
            "wire_facts": facts,
            "granularity_cpu": [asdict(c) for c in cpu],
            "kafka": {
                "broker": kafka_result.broker,
                "samples": kafka_result.samples,
                "passes": [
                    {**asdict(p), "produce_samples_per_s": p.produce_rate, "consume_samples_per_s": p.consume_rate}
                    for p in kafka_result.passes
                ],
            },
            "interpreted": asdict(interpreted),
            "choice": choice_line(codecs, facts, kafka_result),
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        progress(f"wrote {args.json}")


if __name__ == "__main__":
    main()
