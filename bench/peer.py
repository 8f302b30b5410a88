"""The peer in the same run (issue 42): Telegraf's ``kafka_consumer`` -> ``influxdb_v2``, the path a Telegraf ->
Kafka -> InfluxDB site runs, on the same broker and influxd as hermeneut's phases and the same fleet size.

- **raw**: every reading of every sample as a Telegraf user stores it: one point per GPU sample, each reading a
  field (what the fleet's GPUs report, limits included: what a dcgm-exporter or nvidia-smi input would carry);
- **stored lines**: hermeneut's own stored lines (the sink's line protocol for the same samples, interpreted
  against the learned baselines) carried by Telegraf instead of hermeneut's processor and sink: what moving the
  stored result costs without the judgement and its extra Kafka hop.

Each phase puts its lines in a topic of its own first (one message per node and round, as a collector publishes,
lz4 as hermeneut's producer), then starts Telegraf and meters broker, influxd and telegraf from /proc until
Telegraf's consumer group has committed every message (its kafka_consumer commits a message once the output has
written it) and influxd has written out its cache; the stored points are counted after. Telegraf is built from the
Go module proxy with only these plugins (``go install -tags custom,...``) and cached per version, as influxd is.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.cpu import CpuMeter, per_sample_us
from bench.fields import fields_in
from bench.pipeline import GPUS_PER_NODE, Learned, bench_settings, interpreted_lines, settled_influxd_s
from pipeline.config import Settings
from pipeline.events import SampleBatch
from pipeline.services import influxdb, kafka
from pipeline.services.stages import wait_for
from producers.simulator import Fleet
from sinks.influxdb.lines import tag
from sinks.query.store import flux_rows

VERSION: Final = "v1.37.2"
MODULE: Final = "github.com/influxdata/telegraf/cmd/telegraf"
#: the plugins the peer path needs and nothing else (Telegraf's custom builds: build tags name the plugins)
PLUGINS: Final = "custom,inputs.kafka_consumer,outputs.influxdb_v2,parsers.influx"
#: the measurement of the raw readings as Telegraf stores them
RAW: Final = "gpu_raw"


def telegraf_binary(cache_dir: Path, version: str = VERSION) -> Path:
    """Telegraf ``version`` with the peer's plugins, built once from the Go module proxy into the cache."""
    target = cache_dir / "telegraf" / version / "telegraf"
    if target.exists():
        return target
    if shutil.which("go") is None:
        raise RuntimeError("the Telegraf peer needs Go to build Telegraf (go install); none is on PATH")
    print(f"  building Telegraf {version} ({PLUGINS}) from the Go module proxy, once per version (~1 min)...")
    with tempfile.TemporaryDirectory() as gobin:
        subprocess.run(
            ["go", "install", "-tags", PLUGINS, f"{MODULE}@{version}"],
            check=True,
            env=os.environ | {"GOBIN": gobin},
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(Path(gobin) / "telegraf", target)
    return target


def _value(v: float) -> str | None:
    return None if not math.isfinite(v) else repr(float(v))


def raw_messages(batches: Iterable[SampleBatch]) -> tuple[list[bytes], int, int]:
    """One message per node batch of line protocol, a point per sample with every reading a field; the samples and
    fields in them."""
    messages, samples, fields = [], 0, 0
    for b in batches:
        lines = []
        for s in b.samples:
            values = [(k, _value(v)) for k, v in sorted(s.metrics.items())]
            body = ",".join(f"{k}={v}" for k, v in values if v is not None)
            if not body:
                continue
            lines.append(
                f"{RAW},cluster={tag(s.cluster)},node={tag(s.node)},gpu={tag(s.gpu_uuid)},"
                f"gpu_model={tag(s.gpu_model)},gpu_index={s.gpu_index} {body} {s.ts_ns}"
            )
            fields += body.count("=")
        samples += len(lines)
        messages.append("\n".join(lines).encode())
    return messages, samples, fields


def line_messages(lines: Sequence[str], per_message: int) -> list[bytes]:
    """Lines in messages of ``per_message`` each (a node's share of a round, as the raw path sends)."""
    step = max(1, per_message)
    return ["\n".join(lines[n : n + step]).encode() for n in range(0, len(lines), step)]


def config(bootstrap: str, topic: str, group: str, i: influxdb.InfluxProcess, batch_size: int) -> str:
    """A Telegraf configuration for the peer path: Kafka from the oldest offset into InfluxDB 2, Telegraf's defaults
    otherwise (gzip to InfluxDB, the influx parser), its batches as large as hermeneut's sink's."""
    return f"""[agent]
  interval = "10s"
  flush_interval = "1s"
  metric_batch_size = {batch_size}
  metric_buffer_limit = {max(100_000, 20 * batch_size)}
  omit_hostname = true

[[inputs.kafka_consumer]]
  brokers = ["{bootstrap}"]
  topics = ["{topic}"]
  consumer_group = "{group}"
  ## the broker's protocol (Kafka 4 refuses the requests of sarama's default, 2.1)
  version = "4.0.0"
  offset = "oldest"
  max_undelivered_messages = 5000
  data_format = "influx"

[[outputs.influxdb_v2]]
  urls = ["{i.url}"]
  token = "{i.token}"
  organization = "{i.org}"
  bucket = "{i.bucket}"
"""


def preload(bootstrap: str, topic: str, messages: Sequence[bytes], partitions: int) -> None:
    """A fresh topic holding ``messages``, spread over ``partitions`` as keyed messages are."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result()
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 20, "acks": "all"})
    for n, message in enumerate(messages):
        while True:
            try:
                producer.produce(topic, message, partition=n % partitions)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError(f"the {topic} preload did not finish")


def end_offsets(consumer: Consumer, topic: str) -> dict[int, int]:
    """Each partition's end offset of ``topic`` (fixed once its preload is written)."""
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}


def committed_all(consumer: Consumer, topic: str, ends: Mapping[int, int]) -> bool:
    """Whether the group of ``consumer`` (which never joins it) has committed every message up to ``ends``."""
    committed = consumer.committed([TopicPartition(topic, p) for p in ends], timeout=10)
    return all(tp.offset >= ends[tp.partition] for tp in committed)


def drain(
    name: str,
    s: Settings,
    k: kafka.KafkaProcess,
    i: influxdb.InfluxProcess,
    messages: Sequence[bytes],
    samples: int,
    count_flux: str,
    run_dir: Path,
    telegraf: Path,
    settle: Callable[[CpuMeter], float],
) -> dict[str, Any]:
    """Telegraf moving ``messages`` (``samples`` GPU samples) from Kafka into influxd, metered (``settle``: influxd's
    CPU writing out its cache after, as hermeneut's phases count it); ``count_flux`` counts the points it stored."""
    topic, group = f"bench.telegraf.{name}", f"telegraf-bench-{name}"
    preload(k.bootstrap_servers, topic, messages, s.topics.partitions)
    conf = run_dir / f"telegraf-{name}.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(config(k.bootstrap_servers, topic, group, i, s.influxdb.batch_size))
    # one client asks for the group's offsets all along (a new one per poll would load the metered broker)
    watcher = Consumer({"bootstrap.servers": k.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    ends = end_offsets(watcher, topic)
    log = (run_dir / f"telegraf-{name}.log").open("w")
    proc = subprocess.Popen([str(telegraf), "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:
        meter = CpuMeter({"broker": (k.pid,), "influxd": (i.pid,), "telegraf": (proc.pid,)}).start()
        done = wait_for(lambda: committed_all(watcher, topic, ends), 120 + samples / 500, 0.5)
        meter.stop()
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        watcher.close()
    if not done:
        raise RuntimeError(f"Telegraf did not move the {name} topic (see {run_dir / f'telegraf-{name}.log'})")
    settle_s = settle(meter)
    meter.spent["influxd"] += settle_s
    [rows] = flux_rows(s, count_flux, timeout_s=120)
    stored = int(sum(r["_value"] for r in rows))
    us = per_sample_us(meter.spent, dict.fromkeys(meter.spent, samples))
    return {
        "samples": samples,
        "points_stored": stored,
        "messages": len(messages),
        "samples_per_s": samples / meter.wall_s,
        "us_per_sample": us,
        "central_us_per_sample": sum(us.values()),
        "load": meter.load,
    }


def phase(
    base: Settings,
    k: kafka.KafkaProcess,
    i: influxdb.InfluxProcess,
    run_dir: Path,
    gpus: int,
    rounds: int,
    learned: Learned | None,
) -> dict[str, Any]:
    """The Telegraf peer (bench.peer) on ``rounds`` of a ``gpus`` fleet (the live phase's seed): the raw readings,
    then hermeneut's stored lines of the same samples."""
    print(f"5/5 peer: Telegraf moving {rounds} rounds of {gpus} GPUs, the raw readings, then hermeneut's stored lines")
    telegraf = telegraf_binary(base.services.cache_dir)
    s = bench_settings(base, k, i, "peer")
    nodes = max(1, gpus // GPUS_PER_NODE)
    start_ns = time.time_ns() - rounds * 1_000_000_000

    def settle(meter: CpuMeter) -> float:
        return settled_influxd_s(i, meter)

    def count(measurement: str, cluster: str, field: str) -> str:
        return (
            f'from(bucket: "{i.bucket}") |> range(start: 0) |> filter(fn: (r) => r._measurement == "{measurement}" '
            f'and r.cluster == "{cluster}" and r._field == "{field}") |> group() |> count()'
        )

    raw = Fleet(nodes, GPUS_PER_NODE, cluster=f"{s.cluster}-raw", seed=4)
    batches = [b for r in range(rounds) for b in raw.round(start_ns + r * 1_000_000_000).batches]
    messages, samples, fields = raw_messages(batches)
    del batches
    out: dict[str, Any] = {"telegraf": VERSION, "gpus": nodes * GPUS_PER_NODE, "rounds": rounds}
    print(f"  raw: {samples:,} samples, {fields / samples:.1f} fields each")
    out["raw"] = drain(
        "raw", s, k, i, messages, samples, count(RAW, raw.cluster, "utilization_gpu_percent"), run_dir,
        telegraf, settle,
    ) | {"fields_per_sample": fields / samples}  # fmt: skip
    del messages
    judged = Fleet(nodes, GPUS_PER_NODE, cluster=f"{s.cluster}-lines", seed=4)
    lines = interpreted_lines(judged, rounds, start_ns, learned)
    fields = sum(fields_in(line) for line in lines)
    print(f"  hermeneut's stored lines: {len(lines):,} lines for {samples:,} samples")
    per_message = max(1, round(len(lines) * GPUS_PER_NODE / samples))
    out["stored_lines"] = drain(
        "lines", s, k, i, line_messages(lines, per_message), samples,
        count("gpu", judged.cluster, "utilization_gpu_percent"), run_dir, telegraf, settle,
    ) | {"fields_per_sample": fields / samples}  # fmt: skip
    return out


def report(results: dict[str, Any]) -> None:
    """The Telegraf peer's CPU per sample next to hermeneut's, and their ratios (hermeneut's live phase where it ran
    on the same fleet size, else its saturated drain)."""
    pr = results["peer"]
    print(f"Telegraf {pr['telegraf']} kafka_consumer -> influxdb_v2, {pr['rounds']} rounds of {pr['gpus']:,} GPUs:")
    for key, title in (("raw", "every raw reading"), ("stored_lines", "hermeneut's stored lines")):
        ph = pr[key]
        us = ph["us_per_sample"]
        print(
            f"  {title}: {ph['samples']:,} samples ({ph['points_stored']:,} stored), {ph['fields_per_sample']:.1f} "
            f"fields each, {ph['samples_per_s']:,.0f}/s, load {ph['load'][0]:.1f}; CPU-us per sample: broker "
            f"{us['broker']:.1f}, influxd {us['influxd']:.1f}, telegraf {us['telegraf']:.1f} = "
            f"{ph['central_us_per_sample']:.1f}"
        )
    lv = results.get("live")
    if not (lv and lv["gpus"] == pr["gpus"]) and results["saturation"][0].get("unmeasured"):
        print("  no figure of hermeneut's to compare with: the drain was not measured and no live run of this size")
        return
    ours, what = (
        (lv["central_us_per_sample"], f"live {lv['gpus']:,} GPUs")
        if lv and lv["gpus"] == pr["gpus"]
        else (results["saturation"][0]["central_us_per_sample"], "saturated drain")
    )
    raw, lines = pr["raw"]["central_us_per_sample"], pr["stored_lines"]["central_us_per_sample"]
    print(f"  hermeneut's interpreted path ({what}): {ours:.1f} CPU-us per sample, central")
    print(
        f"  ratio to Telegraf moving the raw readings {ours / raw:.2f}; "
        f"to Telegraf moving its stored lines {ours / lines:.2f}"
    )
    results["peer_ratios"] = {"against": what, "to_raw": ours / raw, "to_stored_lines": ours / lines}
