"""The CPU-only benchmarks run at a tiny size and print their ratios: they must not rot between the runs whose
numbers the README quotes (nothing here asserts a speed; the Kafka/InfluxDB/browser benchmarks run by hand)."""

from __future__ import annotations

import math
import re
import sys
import time

import pytest

from bench import codec, collector, context, detectors, fields, kafka_clients, metrics, pipeline, repeats, simulator
from producers.simulator import Fleet
from sinks.influxdb.lines import INFO_REFRESH_NS


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], main: object, *argv: str) -> str:
    monkeypatch.setattr(sys, "argv", ["bench", *argv])
    main()  # type: ignore[operator]
    return capsys.readouterr().out


def test_detectors_metrics_and_context_benchmarks_report_ratios(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run(monkeypatch, capsys, detectors.main, "--rounds", "3", "--repeats", "1")
    assert re.search(r"^live .* \d+\.\d\d ", out, re.M) and re.search(r"^replay .* \d+\.\d\d ", out, re.M)
    out = _run(monkeypatch, capsys, metrics.main, "--rounds", "2", "--repeats", "1")
    assert re.search(r"^processor .* ratio \d\.\d{3}; metrics -?\d+\.\d\d us/sample$", out, re.M), out
    assert re.search(r"^scrape +1024 GPUs: [\d.]+ ms CPU", out, re.M), out
    out = _run(monkeypatch, capsys, context.main, "--quick")
    assert "x one regex search" in out and "0.0175x" in out  # the simulated day is seeded: same records


def test_collector_and_simulator_benchmarks_run(capsys: pytest.CaptureFixture[str]) -> None:
    collector.main(["--rounds", "2"])
    out = capsys.readouterr().out
    assert "8 GPUs x 18 NVLinks (HGX-like)" in out and "bare NVML calls" in out
    simulator.main(["--quick"])
    assert "10,000" in capsys.readouterr().out


def test_codec_granularity_compares_the_same_samples() -> None:
    rounds = [Fleet(2, 8, seed=1).tick(1_763_790_000_000_000_000)]
    per_gpu, node = codec.measure_granularity_cpu(rounds, 1)
    assert (per_gpu.samples_per_message, node.samples_per_message) == (1, 8)
    assert per_gpu.bytes_per_sample > node.bytes_per_sample > 0


def test_codec_interpreted_part_measures_what_the_processor_sends_the_sink() -> None:
    plan = codec.Plan(rounds=1, repeats=1, kafka_samples=0, kafka_passes=0, warmup_samples=0, learn_rounds=30)
    r = codec.measure_interpreted(plan)
    assert r.rows == codec.NODES * codec.GPUS_PER_NODE  # every sample of the round, interpreted
    assert r.messages >= 6  # one per partition of the raw topic
    assert 0 < r.workloads_per_row < 1  # the fleet's jobs span GPUs: a workload is shared by rows
    assert "decode_interpreted" in codec.interpreted_table(r)


def test_kafka_clients_benchmark_builds_its_corpus_and_marks_what_the_code_sends_with() -> None:
    """The messages the Kafka client benchmark sends (it runs by hand on a fresh broker), and its "chosen" rows are
    the settings pipeline.publisher and processors.app use now (the docs quote those rows)."""
    raw, interpreted, samples = kafka_clients.messages(2, time.time_ns() - 10 * 10**9)  # recent: validated
    assert (len(raw), samples) == (250, 2000)
    assert 2 <= len(interpreted) <= 2 * kafka_clients.PARTITIONS
    assert all(value for _key, value, _part in raw + interpreted)
    marked = [(c.topic, c.name) for c in kafka_clients.CASES if kafka_clients.chosen(c)]
    assert marked == [("raw", "zstd"), ("interpreted", "zstd, batch 1 MiB")]


def test_repeats_counts_a_value_equal_to_its_gpus_previous_one_and_the_refresh() -> None:
    period = INFO_REFRESH_NS
    samples = [
        ("a", 0, {"power_watts": 100.0, "utilization_gpu_percent": 50.0}),
        ("b", 0, {"power_watts": 100.0}),  # another GPU: its first value is a change
        ("a", 10**9, {"power_watts": 100.0}),  # unchanged; utilization not read this round
        ("a", 2 * 10**9, {"power_watts": 101.0, "utilization_gpu_percent": 50.0}),  # unchanged across the gap
        ("a", period, {"power_watts": 101.0, "memory_total_bytes": 1.0}),  # a new period: a refresh; a limit
    ]
    r = repeats.repeats(samples)
    assert r.samples == 5
    assert dict(r.carried) == {"power_watts": 5, "utilization_gpu_percent": 2}
    assert dict(r.unchanged) == {"power_watts": 2, "utilization_gpu_percent": 1}
    assert r.refreshes == 1
    assert r.written_now() == 7 / 5 and r.written_on_change() == (7 - 3 + 1) / 5


def test_repeats_benchmark_reads_the_real_captures(capsys: pytest.CaptureFixture[str]) -> None:
    repeats.main(["--rounds", "2"])
    out = capsys.readouterr().out
    now, on_change, samples = (line.split()[-3:] for line in out.splitlines()[-3:])
    assert samples == ["75", "2,120", "2,000"]  # the lent H100's 75 rounds, nanoGPT thinned to a second, 2 rounds
    assert float(on_change[0]) < float(now[0]) and float(on_change[1]) < float(now[1])


def _fields(line: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in fields._FIELD.finditer(fields._parts(line)[1])}


def test_on_change_leaves_out_only_what_filling_forward_restores() -> None:
    """The benchmark's on-change form of the sink's lines: each series' moving readings filled forward give back
    every line's values; other lines and fields are untouched; a new 10-minute period writes every reading again."""
    start = (time.time_ns() // INFO_REFRESH_NS - 1) * INFO_REFRESH_NS - 20 * 10**9  # refresh: round 20
    lines = pipeline.interpreted_lines(Fleet(2, 4, seed=5), 40, start, None)
    changed = fields.on_change(lines)
    assert len(changed) == len(lines)
    last: dict[str, dict[str, str]] = {}
    for before, after in zip(lines, changed, strict=True):
        series, _, ts = fields._parts(before)
        assert fields._parts(after)[::2] == (series, ts)
        if not series.startswith("gpu,"):
            assert after == before
            continue
        kept = _fields(after)
        assert {k: v for k, v in _fields(before).items() if k not in fields.MOVING}.items() <= kept.items()
        last[series] = {**last.get(series, {}), **kept}
        assert {k: last[series][k] for k in _fields(before)} == _fields(before)
    written = [sum(len(_fields(line)) for line in ls if line.startswith("gpu,")) for ls in (lines, changed)]
    assert written[1] < written[0]
    ms = INFO_REFRESH_NS // 10**6
    hand = [
        'gpu,cluster=c,gpu=g power_watts=1,verdict="unusual",explanation="a, b = c" 1',
        'gpu,cluster=c,gpu=g power_watts=1,verdict="unusual",explanation="a, b = c" 2',
        f'gpu,cluster=c,gpu=g power_watts=1,verdict="normal" {ms}',
    ]
    assert fields.on_change(hand) == [
        hand[0],
        'gpu,cluster=c,gpu=g verdict="unusual",explanation="a, b = c" 2',
        hand[2],
    ]


def test_the_telegraf_peer_gets_every_raw_reading_and_hermeneuts_lines_as_sent() -> None:
    """The peer's messages (it runs by hand with a Telegraf it builds): a point per GPU sample with every reading a
    field and nothing non-finite, a message per node and round; the stored lines regrouped as many per message; the
    configuration it runs Telegraf with reads that topic from its start into the benchmark's InfluxDB."""
    from bench import peer

    fleet = Fleet(2, 4, seed=5)
    batches = list(fleet.round(time.time_ns()).batches)
    messages, samples, fields_sent = peer.raw_messages(batches)
    assert (len(messages), samples) == (2, 8)
    lines = [line for m in messages for line in m.decode().splitlines()]
    first = batches[0].samples[0]
    assert lines[0].startswith(f"{peer.RAW},cluster={first.cluster},node={first.node},gpu={first.gpu_uuid},")
    finite = sum(1 for b in batches for s in b.samples for v in s.metrics.values() if math.isfinite(v))
    assert fields_sent == finite and all("nan" not in line and "inf" not in line for line in lines)
    assert [len(m.decode().splitlines()) for m in peer.line_messages([f"l{n}" for n in range(10)], 4)] == [4, 4, 2]

    class Influx:
        url, token, org, bucket = "http://127.0.0.1:1", "t0k", "o", "b"

    conf = peer.config("127.0.0.1:9092", "bench.telegraf.raw", "g", Influx(), 5000)  # type: ignore[arg-type]
    for want in ('topics = ["bench.telegraf.raw"]', 'offset = "oldest"', 'version = "4.0.0"', 'bucket = "b"',
                 "metric_batch_size = 5000", 'data_format = "influx"'):  # fmt: skip
        assert want in conf, want
