from __future__ import annotations

import math
import time

import msgpack
import numpy as np
import pytest

from pipeline.codec import encode_samples, sample_columns, sample_rows
from pipeline.config import ValidationSettings
from pipeline.deadletter import headers_dict
from pipeline.events import METRIC_NAMES, EventKind, GpuEvent, GpuSample, NicSample, SampleBatch, relative_values
from processors.normalize import RawMessage, import_run_of, process_raw, validate
from producers.simulator import Fleet

NOW = 1_800_000_000_000_000_000
LIMITS = ValidationSettings()


def _msg(*samples: GpuSample) -> RawMessage:
    batch = SampleBatch("c", "n", samples)
    return RawMessage(batch.kafka_key, encode_samples(batch), "raw/0/42")


def _s(ts_ns: int = NOW, uuid: str = "GPU-a", **metrics: float) -> GpuSample:
    base = {"power_watts": 350.0, "power_limit_watts": 700.0, "memory_used_bytes": 40.0, "memory_total_bytes": 80.0}
    return GpuSample("c", "n", uuid, 0, "H100", ts_ns, base | metrics)


def test_simulated_fleet_is_entirely_valid() -> None:
    fleet = Fleet(10, 8, seed=2)
    now = time.time_ns()
    messages = [RawMessage(b.kafka_key, encode_samples(b), "t/0/0", i % 3) for i, b in enumerate(fleet.tick(now))]
    out = process_raw(messages, now, LIMITS)
    assert out.dead == []
    assert out.samples_ok == 80
    assert [p for p, _ in out.forward] == [0, 1, 2]  # one message per source partition


def test_events_keep_their_order_within_a_partition() -> None:
    fleet = Fleet(2, 2, seed=2)
    messages = [
        RawMessage(b.kafka_key, encode_samples(b), "t/0/0", 0) for r in range(3) for b in fleet.tick(NOW + r * 10**9)
    ]
    out = process_raw(messages, NOW + 3 * 10**9, LIMITS)
    ((partition, batch),) = out.forward
    assert partition == 0
    assert batch.ts_ns.tolist() == sorted(batch.ts_ns.tolist())
    assert [(e.sample.node, e.sample.gpu_index) for e in batch.events()][:4] == [
        ("node-0000", 0),
        ("node-0000", 1),
        ("node-0001", 0),
        ("node-0001", 1),
    ]


def test_relative_values_are_computed() -> None:
    out = process_raw([_msg(_s())], NOW, LIMITS)
    (event,) = out.forward[0][1].events()
    assert event.relative["power_ratio_of_limit"] == 0.5
    assert event.relative["memory_used_ratio"] == 0.5
    assert "sm_clock_ratio_of_max" not in event.relative  # no clock fields: no made-up ratio


def test_unit_aliases_become_canonical() -> None:
    sample = GpuSample("c", "n", "GPU-a", 0, "H100", NOW, {"memory_used_mib": 1024.0, "power_milliwatts": 250_000.0})
    out = process_raw([_msg(sample)], NOW, LIMITS)
    (event,) = out.forward[0][1].events()
    assert event.sample.metrics == {"memory_used_bytes": 2.0**30, "power_watts": 250.0}


@pytest.mark.parametrize(
    ("sample", "reason"),
    [
        (_s(ts_ns=NOW + 3600 * 10**9), "future_timestamp"),
        (_s(ts_ns=NOW - 30 * 86400 * 10**9), "ancient_timestamp"),
        (_s(temperature_gpu_celsius=-1.0), "negative"),
        (_s(utilization_gpu_percent=100.5), "out_of_range"),
        (_s(power_watts=float("inf")), "out_of_range"),
        (_s(pcie_link_gen=3.5), "not_integer"),
        (_s(power_watts=float("nan")), "nan"),
        (_s(memory_used_bytes=81.0), "inconsistent"),
        (_s(power_watts=1500.0), "inconsistent"),
    ],
)
def test_implausible_samples_are_dead_lettered_with_reason(sample: GpuSample, reason: str) -> None:
    good = _s(uuid="GPU-good")
    msg = _msg(good, sample)
    out = process_raw([msg], NOW, LIMITS)
    assert [d.reason for d in out.dead] == [reason]
    headers = dict(out.dead[0].headers)
    assert headers["hermeneut-gpu"] == b"GPU-a"
    assert headers["hermeneut-position"] == b"1"
    assert headers["hermeneut-source"] == b"raw/0/42"
    assert out.dead[0].value == msg.value  # the original bytes
    assert out.samples_ok == 1


def test_broken_message_is_dead_lettered_whole_and_batch_continues() -> None:
    out = process_raw([RawMessage(b"k", b"\xff\xfe", "raw/1/7"), _msg(_s())], NOW, LIMITS)
    assert [d.reason for d in out.dead] == ["malformed"]
    assert out.samples_ok == 1


def test_validate_reports_first_failing_check_once_per_row() -> None:
    m = np.full((2, len(METRIC_NAMES)), np.nan)
    m[0, 0] = -1.0  # negative and out of range at once
    good, problems = validate(m, np.array([NOW, NOW + 10**15]), NOW, LIMITS)
    assert good.tolist() == [False, False]
    assert [p[1] for p in problems] == ["future_timestamp", "negative"]


def test_relative_values_handle_missing_and_zero() -> None:
    m = np.full((1, len(METRIC_NAMES)), np.nan)
    rel = relative_values(m)
    assert rel.shape == (1, 6) and np.isnan(rel).all()


def test_node_extras_are_validated_and_forwarded_with_their_partition() -> None:
    good_event = GpuEvent("c", "n", "GPU-a", 0, NOW, EventKind.XID, 48, "double bit ECC")
    late_event = GpuEvent("c", "n", "GPU-a", 0, NOW + 3600 * 10**9, EventKind.XID, 79, "")
    good_nic = NicSample("c", "n", "mlx5_0", 1, NOW, {"rx_bytes_per_second": 1e9, "port_state_active": 1})
    bad_nic = NicSample("c", "n", "mlx5_1", 1, NOW, {"rx_bytes_per_second": -1.0})
    batch = SampleBatch("c", "n", (_s(),), (late_event, good_event), (good_nic, bad_nic))
    msg = RawMessage(batch.kafka_key, encode_samples(batch), "raw/2/9", 2)
    out = process_raw([msg], NOW, LIMITS)
    assert sorted((d.reason, dict(d.headers)["hermeneut-part"]) for d in out.dead) == [
        ("future_timestamp", b"event"),
        ("out_of_range", b"nic"),
    ]
    ((partition, forwarded),) = out.forward
    assert partition == 2
    assert forwarded.gpu_events == (good_event,) and forwarded.nics == (good_nic,)
    assert out.samples_ok == 1


def test_a_message_with_only_events_still_forwards_them() -> None:
    event = GpuEvent("c", "n", "GPU-a", 0, NOW, EventKind.GPU_LOST, 0, "NVML: GPU is lost")
    batch = SampleBatch("c", "n", (), (event,))
    out = process_raw([RawMessage(batch.kafka_key, encode_samples(batch), "raw/0/1", 0)], NOW, LIMITS)
    assert out.dead == [] and [b.gpu_events for _, b in out.forward] == [(event,)]


def _raw(body: dict[str, object], offset: int) -> RawMessage:
    return RawMessage(b"c/n", msgpack.packb(body), f"raw/0/{offset}")


@pytest.mark.parametrize(
    ("edit", "reason", "part"),
    [
        (lambda b: b["samples"][0].update(ts_ns=2**63 + 1), "out_of_range", "sample"),
        (lambda b: b["samples"][0].update(ts_ns=2**64 - 1), "out_of_range", "sample"),
        (lambda b: b.update(events=[["GPU-a", 0, NOW, {"xid": 1}, 79, ""]]), "unknown_field", "event"),
        (lambda b: b.update(events=[["GPU-a", 0, NOW, ["xid"], 79, ""]]), "unknown_field", "event"),
        (lambda b: b["samples"][0]["m"].update({b"power_watts": 1.0}), "unknown_field", "sample"),
        (lambda b: b["samples"][0]["m"].update(power_milliwatts=650_000.0), "duplicate_field", "sample"),
        (lambda b: b["samples"][0]["m"].update(memory_used_mib=1.0), "duplicate_field", "sample"),
    ],
    ids=["ts-2**63", "ts-2**64-1", "kind-map", "kind-list", "bytes-key", "watts+milliwatts", "bytes+mib"],
)
def test_issue_14_inputs_cost_only_their_item_in_the_middle_of_a_burst(edit: object, reason: str, part: str) -> None:
    """300 messages of two GPUs with one bad item in the middle: 1 dead letter, every other sample forwarded
    (these used to raise OverflowError / TypeError and lose the whole take, or let the alias win silently)."""
    good = sample_rows(SampleBatch("c", "n", (_s(uuid="GPU-a"), _s(uuid="GPU-b"))))
    bad = msgpack.unpackb(msgpack.packb(good))
    edit(bad)  # type: ignore[operator]
    messages = [_raw(bad if i == 150 else good, i) for i in range(300)]
    out = process_raw(messages, NOW, LIMITS)
    (letter,) = out.dead
    headers = headers_dict(letter.headers)
    assert (headers["hermeneut-reason"], headers["hermeneut-part"]) == (reason, part)
    assert headers["hermeneut-source"] == "raw/0/150"
    assert out.samples_ok == sum(len(b) for _, b in out.forward) == 600 - (part == "sample")


def test_a_column_wise_message_with_one_bad_sample_costs_only_it_in_a_burst() -> None:
    """The column-wise form keeps the promise of the row-wise one: a bad value costs its sample, with its
    position, and a NaN sent is told apart from a field not sent."""
    samples = (_s(uuid="GPU-a", memory_used_bytes=math.nan), _s(uuid="GPU-b"), _s(uuid="GPU-c", power_watts=math.nan))
    good = sample_columns(SampleBatch("c", "n", (_s(uuid="GPU-a"), _s(uuid="GPU-b"), _s(uuid="GPU-c"))))
    bad = msgpack.unpackb(msgpack.packb(good))
    bad["ts_ns"][1] = 2**63 + 1
    nan = sample_columns(SampleBatch("c", "n", samples))
    # GPU-a's memory_used_bytes not sent: NaN in the buffer, marked in 'unsent'
    unsent = np.zeros((3, len(nan["fields"])), dtype=np.uint8)
    unsent[0, nan["fields"].index("memory_used_bytes")] = 1
    nan["unsent"] = unsent.tobytes()
    messages = [_raw(bad if i == 150 else nan if i == 151 else good, i) for i in range(300)]
    out = process_raw(messages, NOW, LIMITS)
    letters = [headers_dict(d.headers) for d in out.dead]
    assert [(h["hermeneut-reason"], h["hermeneut-source"], h["hermeneut-position"]) for h in letters] == [
        ("out_of_range", "raw/0/150", "1"),
        ("nan", "raw/0/151", "2"),
    ]
    assert letters[1]["hermeneut-detail"] == "power_watts is NaN"
    assert out.samples_ok == sum(len(b) for _, b in out.forward) == 898
    ((_, batch),) = out.forward
    row = out.origins[0].rows.index((151, 0))
    assert np.isnan(batch.metrics[row, METRIC_NAMES.index("memory_used_bytes")])
    assert batch.metrics[row, METRIC_NAMES.index("power_watts")] == 350.0


def test_the_canonical_value_is_never_replaced_by_an_alias() -> None:
    body = sample_rows(SampleBatch("c", "n", (_s(power_watts=310.0),)))
    body["samples"][0]["m"]["power_milliwatts"] = 650_000.0
    out = process_raw([_raw(body, 0)], NOW, LIMITS)
    assert out.forward == [] and out.dead[0].reason == "duplicate_field"
    assert "power_watts" in headers_dict(out.dead[0].headers)["hermeneut-detail"]


def test_byte_counts_with_a_fraction_are_rounded_not_rejected() -> None:
    # a MiB column converted to bytes, or an anonymised trace: 40.5 bytes means 40 or 41 bytes, never a bad sample
    out = process_raw([_msg(_s(memory_used_bytes=40.5, memory_reserved_bytes=1.25))], NOW, LIMITS)
    assert out.dead == []
    (event,) = out.forward[0][1].events()
    assert event.sample.metrics["memory_used_bytes"] == 40.0
    assert event.sample.metrics["memory_reserved_bytes"] == 1.0


@pytest.mark.parametrize(
    ("sample", "detail"),
    [
        (_s(pcie_link_gen=3.5), "pcie_link_gen=3.5 is not a whole number"),
        (_s(utilization_gpu_percent=100.5), "utilization_gpu_percent=100.5 outside [0, 100]"),
        (_s(memory_used_bytes=2.0**41), "memory_used_bytes=2199023255552 outside [0, 1.09951e+12]"),
        (_s(memory_used_bytes=81.0), "memory_used_bytes=81 implausible against memory_total_bytes=80"),
        (_s(ts_ns=NOW - 30 * 86400 * 10**9), "2026-12-16T08:00:00.000Z is 4w2d old, beyond validation.max_age_s of 6d"),
    ],
)
def test_dead_letters_say_what_is_wrong_in_plain_numbers(sample: GpuSample, detail: str) -> None:
    (letter,) = process_raw([_msg(sample)], NOW, LIMITS).dead
    assert dict(letter.headers)["hermeneut-detail"].decode() == detail


def test_imported_history_is_judged_by_the_backfill_bound_and_its_dead_letters_name_the_import() -> None:
    limits = ValidationSettings(backfill_max_age_s=60 * 86400.0)
    month_old, year_old = _s(ts_ns=NOW - 30 * 86400 * 10**9), _s(ts_ns=NOW - 365 * 86400 * 10**9, uuid="GPU-b")
    batch = SampleBatch("c", "n", (month_old, year_old))
    imported = RawMessage(batch.kafka_key, encode_samples(batch), "raw/0/42", 0, import_run="run-1")
    out = process_raw([imported], NOW, limits)
    assert out.samples_ok == 1  # a month old: fine for an import
    (letter,) = out.dead
    headers = {k: v.decode() for k, v in letter.headers}
    assert headers["hermeneut-reason"] == "ancient_timestamp"
    bound = "beyond the backfill bound (validation.backfill_max_age_s) of 8w4d"
    assert headers["hermeneut-detail"].endswith(f"old, {bound}")
    assert headers["hermeneut-import"] == "run-1" and headers["hermeneut-gpu"] == "GPU-b"
    live = process_raw([RawMessage(batch.kafka_key, encode_samples(batch), "raw/0/43")], NOW, limits)
    assert live.samples_ok == 0 and [d.reason for d in live.dead] == ["ancient_timestamp"] * 2  # the live bound: 7 days


def test_the_import_header_is_read_from_either_header_shape() -> None:
    assert import_run_of([("content-type", b"x"), ("hermeneut-import", b"run-7")]) == "run-7"
    assert import_run_of({"hermeneut-import": b"run-8"}) == "run-8"
    assert import_run_of(None) is None and import_run_of([("hermeneut-import", b"")]) is None


def test_an_out_of_range_integer_nic_reading_costs_only_itself_on_python_3_11() -> None:
    """MessagePack keeps an integer an int, and Python 3.11's int has no ``is_integer``: the detail of an integer
    NIC reading out of range raised AttributeError and cost the whole take (``make fuzz`` hit it). Now the
    reading is ``out_of_range`` and every sample survives."""
    good = sample_rows(SampleBatch("c", "n", (_s(uuid="GPU-a"), _s(uuid="GPU-b"))))
    bad = msgpack.unpackb(msgpack.packb(good))
    bad["nics"] = [["mlx5_0", 1, NOW, {"rx_bytes_per_second": 10**13}], ["mlx5_1", 1, NOW, {"port_state_active": 1}]]
    out = process_raw([_raw(good, 0), _raw(bad, 1), _raw(good, 2)], NOW, LIMITS)
    (letter,) = out.dead
    headers = headers_dict(letter.headers)
    assert (headers["hermeneut-reason"], headers["hermeneut-part"]) == ("out_of_range", "nic")
    assert headers["hermeneut-detail"] == "rx_bytes_per_second=10000000000000 outside [0, 1e+12]"
    assert out.samples_ok == 6 and [n.device for _, b in out.forward for n in b.nics] == ["mlx5_1"]


@pytest.mark.parametrize(
    ("where", "value", "detail"),
    [
        ("uuid", "GPU-a\\", "uuid 'GPU-a\\\\' ends in a backslash"),
        ("uuid", "GPU-a\\\n", "uuid 'GPU-a\\\\\\n' ends in a backslash"),
        ("uuid", "\n\r\n", "uuid '\\n\\r\\n' is empty once its line breaks are removed"),
        ("uuid", "G" * 70_000, "uuid is 70000 bytes long, beyond the 256"),
        ("model", "\n", "model '\\n' is empty once its line breaks are removed"),
        ("model", "H100\\", "model 'H100\\\\' ends in a backslash"),
        ("node", "\n", "node '\\n' is empty once its line breaks are removed"),
        ("cluster", "c\\", "cluster 'c\\\\' ends in a backslash"),
    ],
    ids=[
        "uuid-backslash",
        "uuid-backslash-break",
        "uuid-breaks",
        "uuid-64k",
        "model-break",
        "model-backslash",
        "node-break",
        "cluster-backslash",
    ],
)
def test_an_identity_the_store_cannot_hold_costs_only_its_samples_in_a_burst(
    where: str, value: str, detail: str
) -> None:
    """Identities InfluxDB's line protocol cannot carry made it refuse whole requests (a burst of 1,000 good samples
    with 29 such stored 0): now each is dead-lettered at the processor with a reason, in both wire forms."""
    good = SampleBatch("c", "n", (_s(uuid="GPU-a"), _s(uuid="GPU-b")))
    for form in (sample_rows, sample_columns):
        body = msgpack.unpackb(msgpack.packb(form(good)))
        if where in ("cluster", "node"):
            body[where] = value
        elif form is sample_rows:
            body["samples"][1][where] = value
        else:
            body["uuid" if where == "uuid" else "model"][1] = value
        messages = [_raw(body if i == 50 else form(good), i) for i in range(100)]
        out = process_raw(messages, NOW, LIMITS)
        letters = [headers_dict(d.headers) for d in out.dead]
        whole = where in ("cluster", "node")
        assert [(h["hermeneut-reason"], h["hermeneut-source"]) for h in letters] == [("bad_identity", "raw/0/50")] * (
            2 if whole else 1
        ), form.__name__
        assert detail in letters[0]["hermeneut-detail"]
        assert out.samples_ok == sum(len(b) for _, b in out.forward) == 200 - (2 if whole else 1)


def test_a_sample_with_no_reading_at_all_is_refused() -> None:
    """Column-wise samples with every cell masked were stored as points of interpretation only."""
    body = sample_columns(SampleBatch("c", "n", (_s(uuid="GPU-a"), _s(uuid="GPU-b"))))
    unsent = np.zeros((2, len(body["fields"])), dtype=np.uint8)
    unsent[1] = 1
    body["unsent"] = unsent.tobytes()
    empty_row = sample_rows(SampleBatch("c", "n", (_s(uuid="GPU-c"),)))
    empty_row["samples"][0]["m"] = {}
    out = process_raw([_raw(body, 0), _raw(empty_row, 1)], NOW, LIMITS)
    letters = [headers_dict(d.headers) for d in out.dead]
    assert [(h["hermeneut-reason"], h["hermeneut-gpu"]) for h in letters] == [
        ("no_reading", "GPU-b"),
        ("no_reading", "GPU-c"),
    ]
    assert out.samples_ok == 1
