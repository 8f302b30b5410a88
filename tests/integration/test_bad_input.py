"""Bad input on real servers: every bad event lands in the dead-letter topic with its reason, every good one
in InfluxDB, and nothing crashes."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from hermeneut.stages import start_stage
from pipeline.codec import encode_interpreted, encode_record, encode_samples, sample_columns, sample_rows
from pipeline.config import Settings
from pipeline.deadletter import headers_dict
from pipeline.events import METRIC_INDEX, GpuContext, GpuSample, InterpretedBatch, SampleBatch, Workload
from pipeline.publisher import Publisher
from pipeline.services.stages import Stage, wait_for
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet
from sinks.influxdb.write import InfluxWriter

from .harness import consume_all, publish, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration


def _with(sample: GpuSample, **changes: object) -> GpuSample:
    metrics = dict(sample.metrics)
    for k, v in changes.items():
        if k != "ts_ns":
            metrics[k] = v  # type: ignore[assignment]
    ts = changes.get("ts_ns", sample.ts_ns)
    return dataclasses.replace(sample, metrics=metrics, ts_ns=ts)  # type: ignore[arg-type]


def test_bad_events_are_dead_lettered_and_good_ones_stored(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet(nodes=4, gpus_per_node=2, cluster=settings.cluster, seed=11)
    now_ms = time.time_ns() // 1_000_000
    rounds = [fleet.tick((now_ms - 10_000 + r * 1000) * 1_000_000) for r in range(3)]
    good = [b for r in rounds for b in r]
    template = good[0]
    s0 = template.samples[0]

    def one(sample: GpuSample) -> tuple[bytes, bytes]:
        batch = SampleBatch(sample.cluster, "bad-node", (sample,))
        return batch.kafka_key, encode_samples(batch)

    encoded_good = encode_samples(template)
    wrong_type = sample_rows(SampleBatch(s0.cluster, "bad-node", (s0,)))  # another producer's row-wise form
    wrong_type["samples"][0]["m"]["power_watts"] = "310 W"
    future_version = msgpack.unpackb(encoded_good)
    future_version["v"] = 99
    bad: list[tuple[tuple[bytes | None, bytes], str]] = [
        ((b"x", b"\x00\x01not msgpack at all"), "malformed"),
        ((b"x", encoded_good[: len(encoded_good) // 2]), "malformed"),
        ((b"x", msgpack.packb([1, 2, 3])), "malformed"),
        ((b"x", msgpack.packb(wrong_type)), "wrong_type"),
        ((template.kafka_key, msgpack.packb(future_version)), "unknown_schema_version"),
        (one(_with(s0, power_watts=float("nan"))), "nan"),
        (one(_with(s0, ts_ns=(now_ms + 86_400_000) * 1_000_000)), "future_timestamp"),
        (one(_with(s0, ts_ns=(now_ms - 400 * 86_400_000) * 1_000_000)), "ancient_timestamp"),
        (one(_with(s0, temperature_gpu_celsius=-5.0)), "negative"),
        (one(_with(s0, utilization_gpu_percent=250.0)), "out_of_range"),
        (one(_with(s0, power_watts=float("inf"))), "out_of_range"),
        (one(_with(s0, memory_used_bytes=s0.metrics["memory_total_bytes"] * 2)), "inconsistent"),
        (one(_with(s0, bogus_metric_celsius=1.0)), "unknown_field"),
    ]
    # one bad GPU inside an otherwise good node message: the other GPU must still be stored
    mixed = SampleBatch(
        settings.cluster,
        "mixed-node",
        (
            dataclasses.replace(s0, node="mixed-node", gpu_uuid="GPU-mixed-good"),
            dataclasses.replace(_with(s0, sm_clock_mhz=-1.0), node="mixed-node", gpu_uuid="GPU-mixed-bad"),
        ),
    )
    bad.append(((mixed.kafka_key, encode_samples(mixed)), "negative"))

    payloads = [(b.kafka_key, encode_samples(b)) for b in good[:4]]
    payloads += [p for p, _ in bad]
    payloads += [(b.kafka_key, encode_samples(b)) for b in good[4:]]

    with running_pipeline(settings, tmp_path) as (processor, sink):
        publish(settings, payloads)
        expected_good = sum(len(b.samples) for b in good) + 1
        wait_stored(sink, expected_good)
        letters = consume_all(settings, settings.topics.dead_letter, len(bad))
        assert processor.alive() and sink.alive()

    assert len(letters) == len(bad)
    by_value: dict[bytes, list[dict[str, str]]] = {}
    for letter in letters:
        by_value.setdefault(letter.value() or b"", []).append(headers_dict(letter.headers()))
    for (_key, value), reason in bad:
        headers = by_value[value].pop(0)
        assert headers["hermeneut-reason"].startswith(reason), (reason, headers)
        assert headers["hermeneut-detail"], headers
        assert headers["hermeneut-source"].startswith(settings.topics.raw)
    mixed_letter = [h for v, hs in by_value.items() for h in hs]
    assert not mixed_letter, f"unexpected extra dead letters: {mixed_letter}"

    rows = stored_points(settings)
    stored = {(r["gpu"], r["_time"]) for r in rows}
    assert len(rows) == expected_good
    assert {r["gpu"] for r in rows} == {s.gpu_uuid for b in good for s in b.samples} | {"GPU-mixed-good"}
    assert len(stored) == expected_good


Form = Callable[[SampleBatch], dict[str, Any]]


def _good_and(hostile: GpuSample, node: str, form: Form = sample_rows) -> dict[str, Any]:
    """A node message of one good sample (``GPU-<node>-good``) and ``hostile`` (both on ``node``)."""
    good = dataclasses.replace(hostile, node=node, gpu_uuid=f"GPU-{node}-good", gpu_model="H100")
    body = form(SampleBatch(hostile.cluster, node, (good, dataclasses.replace(hostile, node=node))))
    out: dict[str, Any] = msgpack.unpackb(msgpack.packb(body))
    return out


def _sink_stats_ok(stats: dict[str, Any]) -> None:
    assert stats.get("stalls", 0) == 0 and not stats.get("stalled"), stats


def _restart_sink(settings: Settings, sink: Stage, run_dir: Path) -> Stage:
    """Stop the sink stage mid-stream (it drains and commits what it stored) and start a new one."""
    _sink_stats_ok(sink.stats())
    assert sink.stop() == 0
    started = start_stage("sink", settings, run_dir)
    assert wait_for(lambda: bool(started.stats().get("assigned")), 90), "the restarted sink got no partitions"
    return started


def _stored_keys(settings: Settings, expected: int, timeout_s: float = 120) -> list[tuple[str, str]]:
    """(gpu, time) of every stored ``gpu`` point of the test's cluster, once ``expected`` are there (or timed out)."""
    wait_for(lambda: len(stored_points(settings)) >= expected, timeout_s, interval_s=1.0)
    time.sleep(2.0)  # anything extra would show up now
    return [(r["gpu"], r["_time"]) for r in stored_points(settings)]


def test_hostile_identities_in_a_burst_of_good_samples_cost_only_themselves_across_a_sink_restart(
    settings: Settings, tmp_path: Path
) -> None:
    """Issue 37: a burst of 1,000 good samples with identities line protocol cannot carry among them stored 0 (the
    whole request refused, the whole batch dead-lettered). Now each hostile item is dead-lettered by the processor
    with its reason, in both wire forms, and every good sample is stored once, with a sink restart in the middle. A GPU
    whose context names an application line protocol cannot carry costs none of its samples: stored as "unknown"."""
    fleet = Fleet(nodes=10, gpus_per_node=4, cluster=settings.cluster, seed=37)
    now_ms = time.time_ns() // 1_000_000
    rounds = [fleet.tick((now_ms - 60_000 + r * 1000) * 1_000_000) for r in range(25)]
    s0 = rounds[0][0].samples[0]

    def hostile(node: str, form: Form = sample_rows, **identity: str) -> dict[str, Any]:
        return _good_and(dataclasses.replace(s0, **identity), node, form)  # type: ignore[arg-type]

    masked = hostile("h-masked", sample_columns, gpu_uuid="GPU-masked")
    unsent = np.zeros((2, len(masked["fields"])), dtype=np.uint8)
    unsent[1] = 1  # the second sample has no reading at all
    masked["unsent"] = unsent.tobytes()
    nic = hostile("h-nic", gpu_uuid="GPU-h-nic-second")
    nic["nics"] = [["mlx5_0", 1, s0.ts_ns, {"rx_bytes_per_second": 10**13}]]  # an int out of range (Python 3.11)
    whole_node = sample_rows(SampleBatch(s0.cluster, "\n", (s0,)))
    whole_cluster = sample_rows(SampleBatch("c\\", "h-cluster", (dataclasses.replace(s0, cluster="c\\"),)))
    # (payload, reason, how many of its items are bad, how many of its samples good)
    cases: list[tuple[dict[str, Any], str, int, int]] = [
        (hostile("h-bs-rows", gpu_uuid="GPU-bs\\"), "bad_identity", 1, 1),
        (hostile("h-bs-cols", sample_columns, gpu_uuid="GPU-bs-cols\\"), "bad_identity", 1, 1),
        (hostile("h-bs-break", gpu_uuid="GPU-a\\\n"), "bad_identity", 1, 1),  # a backslash once cleaned
        (hostile("h-breaks", gpu_uuid="\n\r\n"), "bad_identity", 1, 1),
        (hostile("h-model", gpu_uuid="GPU-h-model", gpu_model="\r\n"), "bad_identity", 1, 1),
        (hostile("h-model-bs", gpu_uuid="GPU-h-model-bs", gpu_model="H100\\"), "bad_identity", 1, 1),
        (hostile("h-long", gpu_uuid="G" * 70_000), "bad_identity", 1, 1),
        (whole_node, "bad_identity", 1, 0),
        (whole_cluster, "bad_identity", 1, 0),
        (masked, "no_reading", 1, 1),
        (nic, "out_of_range", 1, 2),  # the NIC reading; both GPUs' samples are good
    ]
    # a context whose application line protocol cannot carry, on a good GPU: its samples are stored, as "unknown"
    context = GpuContext(s0.cluster, s0.node, s0.gpu_uuid, s0.ts_ns - 10**9, Workload("llm-pretraining\\", "job-37"))
    pub = Publisher(settings.kafka.client_config())
    pub.publish(settings.topics.context, context.kafka_key, encode_record(context))
    assert pub.close(30) == 0 and pub.stats.delivered == 1
    payloads = [[(b.kafka_key, encode_samples(b)) for b in r] for r in rounds]
    for i, (body, _, _, _) in enumerate(cases):  # spread through the burst
        payloads[2 + 2 * i].append((b"hostile", msgpack.packb(body)))
    expected_good = sum(len(b.samples) for r in rounds for b in r) + sum(good for *_, good in cases)
    expected_bad = sum(bad for _, _, bad, _ in cases)

    with running_pipeline(settings, tmp_path) as (processor, first):
        for r in payloads[:12]:
            publish(settings, r)
        assert wait_for(lambda: first.stats().get("points_written", 0) >= 200, 60)
        sink = _restart_sink(settings, first, tmp_path / "second")
        try:
            for r in payloads[12:]:
                publish(settings, r)
            keys = _stored_keys(settings, expected_good)
            letters = consume_all(settings, settings.topics.dead_letter, expected_bad)
            _sink_stats_ok(sink.stats())
            assert processor.alive() and sink.alive() and processor.stats().get("stalls", 0) == 0
        finally:
            sink.stop()

    assert len(keys) == len(set(keys)) == expected_good  # every good sample stored, once
    reasons = sorted(headers_dict(m.headers())["hermeneut-reason"] for m in letters)
    assert reasons == sorted(reason for _, reason, bad, _ in cases for _ in range(bad))
    assert all(headers_dict(m.headers())["hermeneut-stage"] == "processor" for m in letters)
    stored_gpus = {gpu for gpu, _ in keys}
    assert {f"GPU-h-{n}-good" for n in ("bs-rows", "bs-cols", "bs-break", "breaks", "masked", "nic")} <= stored_gpus
    labelled = [r for r in stored_points(settings) if r["gpu"] == s0.gpu_uuid]
    assert len(labelled) == len(rounds) and {r.get("application") for r in labelled} == {"unknown"}


def _interpreted(fleet: Fleet, ts_ns: int, now_ns: int, settings: Settings) -> list[InterpretedBatch]:
    """One round of the fleet as the processor forwards it, cut into batches of 4 rows (a node each)."""
    messages = [RawMessage(b.kafka_key, encode_samples(b), "raw/0/0") for b in fleet.tick(ts_ns)]
    forwarded = [b for _, b in process_raw(messages, now_ns, settings.validation_limits()).forward]
    return [b.take(np.arange(n, min(n + 4, len(b)))) for b in forwarded for n in range(0, len(b), 4)]


def _last_row(b: InterpretedBatch, uuid: str, **change: Any) -> InterpretedBatch:
    """``b`` with its last row's GPU named ``uuid``, and that row's ``metrics`` / ``ts_ns`` changed by a function or
    its application set."""
    out: dict[str, Any] = {"gpu_uuid": (*b.gpu_uuid[:-1], uuid)}
    for name, value in change.items():
        if name == "application":
            out["workload"] = (*b.workload[:-1], Workload(value, source="manual"))
        else:
            column = getattr(b, name).copy()
            column[-1] = value(column[-1])
            out[name] = column
    return dataclasses.replace(b, **out)


def test_hostile_rows_on_the_interpreted_topic_cost_only_themselves_and_a_422_is_split_not_retried(
    settings: Settings, tmp_path: Path
) -> None:
    """Issue 37, straight on the interpreted topic (other writers than our processor): ``power_watts=inf``, times 30
    days and 292 years ahead, identities line protocol cannot carry (in the GPU and in the application) are refused
    when prepared; a row older than the bucket's retention gets InfluxDB's 422 "partial write", which is permanent
    (it stalled the sink for as long as it ran): its request is split until the row stands alone, dead-lettered
    with InfluxDB's message. Every good row is stored once, with a sink restart in the middle, 0 stalls."""
    settings = settings.model_copy(
        update={
            "influxdb": settings.influxdb.model_copy(update={"bucket": f"ret-{settings.cluster}"}),
            "storage": settings.storage.model_copy(update={"raw_retention_days": 1.0}),
            "validation": settings.validation.model_copy(update={"max_age_s": 43_200.0}),
        }
    )
    writer = InfluxWriter.from_settings(settings.influxdb)
    writer.ensure_bucket(86_400)
    writer.close()
    now_ns = time.time_ns()
    fleet = Fleet(nodes=10, gpus_per_node=4, cluster=settings.cluster, seed=38)
    batches = [b for r in range(25) for b in _interpreted(fleet, now_ns - (60 - r) * 10**9, now_ns, settings)]
    spare = iter(_interpreted(Fleet(6, 4, settings.cluster, seed=39), now_ns - 30 * 10**9, now_ns, settings))
    day, power = 86_400 * 10**9, METRIC_INDEX["power_watts"]
    cases = [
        (_last_row(next(spare), "GPU-inf", metrics=lambda m: np.where(np.arange(len(m)) == power, np.inf, m)),
         "not_finite"),
        (_last_row(next(spare), "GPU-30-days-ahead", ts_ns=lambda t: t + 30 * day), "future_timestamp"),
        (_last_row(next(spare), "GPU-in-2262", ts_ns=lambda t: 2**63 - 1), "future_timestamp"),
        (_last_row(next(spare), "GPU-bs\\"), "bad_identity"),
        (_last_row(next(spare), "GPU-app", application="train\\"), "bad_identity"),
        (_last_row(next(spare), "GPU-old", ts_ns=lambda t: t - 3 * day), "influxdb_rejected"),
    ]  # fmt: skip
    expected_good = sum(len(b) for b in batches) + sum(len(b) - 1 for b, _ in cases)
    publisher = Publisher(settings.kafka.client_config())
    topic = settings.topics.interpreted

    def send(part: list[InterpretedBatch]) -> None:
        for b in part:
            publisher.publish(topic, b.node[0].encode(), encode_interpreted(b))
        assert publisher.flush(30) == 0

    half = len(batches) // 2
    sink = start_stage("sink", settings, tmp_path)  # the sink alone: nothing comes from the raw topic here
    try:
        assert wait_for(lambda: bool(sink.stats().get("assigned")), 90), "the sink got no partitions"
        send(batches[:half:2] + [b for b, _ in cases[:3]] + batches[1:half:2])
        assert wait_for(lambda: sink.stats().get("points_written", 0) >= 200, 60)
        sink = _restart_sink(settings, sink, tmp_path / "second")
        send(batches[half::2] + [b for b, _ in cases[3:]] + batches[half + 1 :: 2])
        keys = _stored_keys(settings, expected_good)
        letters = [headers_dict(m.headers()) for m in consume_all(settings, settings.topics.dead_letter, 7)]
        _sink_stats_ok(sink.stats())
        assert sink.alive()
        assert sink.stats().get("letters_not_resent", 0) >= 1  # the premise: the restart read a refused item again
    finally:
        sink.stop()
        publisher.close(10)

    assert len(keys) == len(set(keys)) == expected_good  # every good row stored, once
    assert not {gpu for gpu, _ in keys} & {b.gpu_uuid[-1] for b, _ in cases}
    # each refused item dead-lettered once, though the restarted sink read the first half again (its commit was
    # held at an open rollup minute) and refused the first three cases a second time
    items = Counter((h["hermeneut-source"], h.get("hermeneut-gpu"), h.get("hermeneut-part")) for h in letters)
    assert len(letters) == len(items) == 7, items
    by_gpu: dict[str, set[str]] = {}
    for h in letters:
        assert h["hermeneut-stage"] == "sink" and h["hermeneut-source"].startswith(topic), h
        by_gpu.setdefault(h.get("hermeneut-gpu", ""), set()).add(h["hermeneut-reason"])
    # the old row's gpu_info line is refused alone too (no GPU header: it is not a sample); nothing else is
    assert by_gpu.pop("", {"influxdb_rejected"}) == {"influxdb_rejected"}
    assert by_gpu == {b.gpu_uuid[-1]: {reason} for b, reason in cases}
    old = next(h for h in letters if h.get("hermeneut-gpu") == "GPU-old")
    assert "HTTP 422" in old["hermeneut-detail"] and "retention" in old["hermeneut-detail"], old
