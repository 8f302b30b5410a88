from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np
import pytest

from pipeline.codec import (
    decode_interpreted,
    decode_raw,
    decode_record,
    decode_samples,
    encode_interpreted,
    encode_record,
    encode_samples,
    sample_columns,
    sample_rows,
)
from pipeline.errors import DecodeError
from pipeline.events import (
    Driver,
    EventKind,
    Finding,
    GpuContext,
    GpuEvent,
    GpuProcess,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    NicSample,
    NvLinkSample,
    SampleBatch,
    Severity,
    Verdict,
    Workload,
    metric_matrix,
)
from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink


def _sample(**metrics: float) -> GpuSample:
    return GpuSample("c", "n1", "GPU-1", 0, "NVIDIA H100 80GB HBM3", 1_700_000_000_123_456_789, dict(metrics))


def test_samples_round_trip_exactly() -> None:
    batch = SampleBatch("c", "n1", (_sample(power_watts=312.25, memory_used_bytes=2**40 - 1), _sample()))
    decoded, rejected = decode_samples(encode_samples(batch))
    assert rejected == []
    assert decoded == batch
    assert decoded.samples[0].metrics["memory_used_bytes"] == 2**40 - 1  # int64 stays exact


def test_interpreted_round_trip() -> None:
    event = InterpretedEvent(
        _sample(power_watts=100.0),
        {"power_ratio_of_limit": 0.5},
        Workload("llm-training", "job-7", "ana", "slurm", 1.0),
        0.3,
        Verdict.NORMAL,
        "llm-training/H100/compute",
        "ok",
    )
    batch = InterpretedBatch.from_events([event])
    assert decode_interpreted(encode_interpreted(batch)).events() == [event]


def test_interpreted_columns_are_matched_by_name() -> None:
    """A sender with other (older/newer) columns still decodes: known columns by name, unknown ones dropped."""
    batch = InterpretedBatch.from_events([InterpretedEvent(_sample(power_watts=7.0, fan_speed_percent=3.0))])
    raw = msgpack.unpackb(encode_interpreted(batch))
    names = raw["fields"]
    m = np.frombuffer(raw["m"], dtype="<f8").reshape(1, len(names))
    keep = [i for i, n in enumerate(names) if n != "fan_speed_percent"][::-1]
    raw["fields"] = [names[i] for i in keep] + ["a_future_field"]
    raw["m"] = np.append(m[:, keep], [[1.0]], axis=1).tobytes()
    (event,) = decode_interpreted(msgpack.packb(raw)).events()
    assert event.sample.metrics == {"power_watts": 7.0}


def test_a_shared_workload_travels_once_and_a_message_with_one_map_per_row_still_decodes() -> None:
    job = Workload("llm-training", "job-7", "ana", "slurm", 1.0, job_gpus=2)
    events = [
        InterpretedEvent(_sample(power_watts=1.0), workload=job),
        InterpretedEvent(_sample(power_watts=2.0)),
        InterpretedEvent(_sample(power_watts=3.0), workload=job),
    ]
    raw = msgpack.unpackb(encode_interpreted(InterpretedBatch.from_events(events)))
    assert [w["job_id"] for w in raw["wls"]] == ["job-7"] and raw["wl"] == [0, None, 0]
    assert decode_interpreted(msgpack.packb(raw)).events() == events
    # written before the table: the workload's map in every row
    raw["wl"] = [raw["wls"][0], None, raw["wls"][0]]
    del raw["wls"]
    assert decode_interpreted(msgpack.packb(raw)).events() == events
    raw["wl"] = [0, None, 0]  # positions into a table that is not there
    with pytest.raises(DecodeError, match="position in 'wls'"):
        decode_interpreted(msgpack.packb(raw))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "malformed"),
        (b"\xc1", "malformed"),
        (msgpack.packb("a string"), "malformed"),
        (msgpack.packb({"cluster": "c", "node": "n", "samples": []}), "malformed"),
        (msgpack.packb({"v": 2, "cluster": "c", "node": "n", "samples": []}), "unknown_schema_version"),
        (msgpack.packb({"v": 1, "cluster": "", "node": "n", "samples": []}), "wrong_type"),
        (msgpack.packb({"v": 1, "cluster": "c", "node": "n", "samples": {}}), "wrong_type"),
    ],
)
def test_broken_envelopes_raise(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode_samples(payload)
    assert info.value.reason == reason


def test_truncated_message_is_malformed() -> None:
    payload = encode_samples(SampleBatch("c", "n1", (_sample(power_watts=1.0),)))
    for cut in (1, len(payload) // 2, len(payload) - 1):
        with pytest.raises(DecodeError, match="malformed"):
            decode_samples(payload[:cut])


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: s["m"].update(power_watts="310"), "wrong_type"),
        (lambda s: s["m"].update(power_watts=True), "wrong_type"),
        (lambda s: s["m"].update(made_up_field=1.0), "unknown_field"),
        (lambda s: s.update(ts_ns=1.5), "wrong_type"),
        (lambda s: s.update(uuid=None), "wrong_type"),
        (lambda s: s.update(index=-1), "wrong_type"),
        (lambda s: s.update(m=[1, 2]), "wrong_type"),
    ],
)
def test_one_bad_sample_does_not_cost_the_others(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    batch = SampleBatch("c", "n1", (_sample(power_watts=1.0), _sample(power_watts=2.0)))
    raw = sample_rows(batch)
    mutate(raw["samples"][1])
    decoded, rejected = decode_samples(msgpack.packb(raw))
    assert [s.metrics["power_watts"] for s in decoded.samples] == [1.0]
    assert [(r.reason, r.position) for r in rejected] == [(reason, 1)]


def _columns(*samples: GpuSample) -> dict[str, Any]:
    return sample_columns(SampleBatch("c", "n1", samples))


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda c: c["ts_ns"].__setitem__(1, 1.5), "wrong_type"),
        (lambda c: c["ts_ns"].__setitem__(1, 2**63 + 1), "out_of_range"),
        (lambda c: c["uuid"].__setitem__(1, None), "wrong_type"),
        (lambda c: c["uuid"].__setitem__(1, ""), "wrong_type"),
        (lambda c: c["index"].__setitem__(1, -1), "wrong_type"),
        (lambda c: c["index"].__setitem__(1, True), "wrong_type"),
        (lambda c: c["model"].__setitem__(1, 7), "wrong_type"),
        (lambda c: c.update(links=[None, [[0, "yes", None, None, None, None, None, None]], None]), "wrong_type"),
        (lambda c: c.update(procs=[None, [[-1, "python", None, "compute"]], None]), "negative"),
    ],
)
def test_one_bad_column_value_costs_only_its_sample(mutate, reason: str) -> None:  # type: ignore[no-untyped-def]
    raw = _columns(_sample(power_watts=1.0), _sample(power_watts=2.0), _sample(power_watts=3.0))
    mutate(raw)
    decoded, rejected = decode_samples(msgpack.packb(raw))
    assert [s.metrics["power_watts"] for s in decoded.samples] == [1.0, 3.0]
    assert [(r.reason, r.position) for r in rejected] == [(reason, 1)]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (["power_watts", "made_up_field"], "unknown_field"),
        (["power_watts", "power_watts"], "duplicate_field"),
        (["power_watts", "power_milliwatts"], "duplicate_field"),
    ],
)
def test_bad_field_names_cost_every_sample_of_the_message_not_its_extras(fields: list[str], reason: str) -> None:
    batch = _extras_batch()
    raw = sample_columns(SampleBatch("c", "n1", (batch.samples[0], batch.samples[0]), batch.events, batch.nics))
    raw["fields"], raw["m"] = fields, np.ones(4).tobytes()
    decoded, rejected = decode_samples(msgpack.packb(raw))
    assert decoded.samples == () and (decoded.events, decoded.nics) == (batch.events, batch.nics)
    assert [(r.reason, r.position, r.gpu_uuid) for r in rejected] == [(reason, 0, "GPU-1"), (reason, 1, "GPU-1")]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["model"].pop(),
        lambda c: c.update(m=c["m"][:-8]),
        lambda c: c.update(m=[[1.0], [2.0]]),
        lambda c: c.update(unsent=b"\x00"),
        lambda c: c.update(procs=[None]),
        lambda c: c.update(fields="power_watts"),
        lambda c: c.update(samples=[]),
    ],
    ids=["short-column", "short-buffer", "m-lists", "short-unsent", "short-procs", "fields-string", "both-forms"],
)
def test_columns_that_do_not_line_up_break_the_envelope(mutate: Any) -> None:
    raw = _columns(_sample(power_watts=1.0), _sample(power_watts=2.0))
    mutate(raw)
    with pytest.raises(DecodeError) as info:
        decode_samples(msgpack.packb(raw))
    assert info.value.reason in {"malformed", "wrong_type"}


def test_a_field_not_sent_is_marked_unsent_and_a_nan_stays_a_value() -> None:
    raw = _columns(_sample(power_watts=1.0, sm_clock_mhz=math.nan), _sample(power_watts=2.0))
    assert raw["fields"] == ["power_watts", "sm_clock_mhz"] and raw["unsent"] == bytes([0, 0, 0, 1])
    decoded, rejected = decode_samples(msgpack.packb(raw))
    assert rejected == [] and decoded.samples[1].metrics == {"power_watts": 2.0}
    assert math.isnan(decoded.samples[0].metrics["sm_clock_mhz"])
    assert "unsent" not in _columns(_sample(power_watts=1.0), _sample(power_watts=2.0))
    # whatever a producer leaves in a cell it marks unsent is not a reading
    raw["m"] = np.array([[1.0, math.nan], [2.0, 7.0]]).tobytes()
    (raw_samples, _) = decode_raw(msgpack.packb(raw))
    assert decode_samples(msgpack.packb(raw))[0].samples[1].metrics == {"power_watts": 2.0}
    assert np.isnan(raw_samples.groups[0].values[1, 1])


def test_both_forms_decode_to_the_same_samples() -> None:
    batch = _extras_batch()
    two = SampleBatch("c", "n1", (batch.samples[0], _sample(memory_used_mib=1024.0)), batch.events, batch.nics)
    rows, columns = (decode_samples(msgpack.packb(body)) for body in (sample_rows(two), sample_columns(two)))
    assert rows == columns == (two, [])


def test_unit_aliases_are_accepted_names() -> None:
    decoded, rejected = decode_samples(encode_samples(SampleBatch("c", "n", (_sample(memory_used_mib=1024.0),))))
    assert not rejected and decoded.samples[0].metrics == {"memory_used_mib": 1024.0}


def test_metric_matrix_shape_and_absent_fields() -> None:
    m = metric_matrix([_sample(power_watts=5.0)])
    assert m.shape[0] == 1 and math.isnan(m[0, 0])
    assert metric_matrix([]).shape[0] == 0


def _extras_batch() -> SampleBatch:
    sample = GpuSample(
        "c",
        "n1",
        "GPU-1",
        0,
        "NVIDIA H100 80GB HBM3",
        1_700_000_000_000_000_000,
        {"power_watts": 100.0},
        links=(NvLinkSample(0, True, 1.5e9, 2.5e9, 3, 0, None, "00000000:07:00.0"), NvLinkSample(1, False)),
        processes=(GpuProcess(4242, "python", 2**33), GpuProcess(7, "Xorg", None, "graphics")),
    )
    event = GpuEvent("c", "n1", "GPU-1", 0, 1_700_000_000_000_000_001, EventKind.XID, 79, "fallen off the bus")
    nic = NicSample("c", "n1", "mlx5_0", 1, 1_700_000_000_000_000_000, {"rx_bytes_per_second": 1e9, "rate_gbps": 400})
    return SampleBatch("c", "n1", (sample,), (event,), (nic,))


def test_node_extras_round_trip() -> None:
    batch = _extras_batch()
    decoded, rejected = decode_samples(encode_samples(batch))
    assert rejected == []
    assert decoded == batch


def test_extras_pass_through_the_interpreted_encoding() -> None:
    raw = _extras_batch()
    event = InterpretedEvent(
        raw.samples[0], phase="compute", drivers=(Driver("power_ratio_of_limit", 0.1, 0.8, 0.7, 0.9),)
    )
    batch = InterpretedBatch.from_events([event], raw.events, raw.nics)
    decoded = decode_interpreted(encode_interpreted(batch))
    assert decoded.events() == [event]
    assert decoded.gpu_events == raw.events and decoded.nics == raw.nics


@pytest.mark.parametrize(
    ("form", "change", "part", "reason"),
    [
        (sample_rows, lambda d: d["events"][0].__setitem__(3, "meltdown"), "event", "unknown_field"),
        (sample_columns, lambda d: d["events"][0].__setitem__(4, -1), "event", "wrong_type"),
        (sample_rows, lambda d: d["nics"][0][3].__setitem__("rx_bytes_per_second", "fast"), "nic", "wrong_type"),
        (sample_columns, lambda d: d["nics"][0][3].__setitem__("carrier_pigeons", 1), "nic", "unknown_field"),
        (sample_rows, lambda d: d["samples"][0]["links"][0].__setitem__(2, -5.0), "sample", "out_of_range"),
        (sample_rows, lambda d: d["samples"][0]["procs"][0].__setitem__(0, "4242"), "sample", "wrong_type"),
        (sample_columns, lambda d: d["links"][0][0].__setitem__(2, -5.0), "sample", "out_of_range"),
        (sample_columns, lambda d: d["procs"][0][0].__setitem__(0, "4242"), "sample", "wrong_type"),
    ],
)
def test_a_bad_extra_is_rejected_alone(form: Any, change: Any, part: str, reason: str) -> None:
    raw = form(_extras_batch())
    change(raw)
    decoded, rejected = decode_samples(msgpack.packb(raw))
    assert [(r.part, r.reason) for r in rejected] == [(part, reason)]
    # everything else of the node message survives
    assert len(decoded.samples) + len(decoded.events) + len(decoded.nics) == 2


def test_records_round_trip_with_their_types() -> None:
    finding = Finding(
        "thermal-throttling",
        Severity.WARNING,
        True,
        "c",
        "n1",
        "GPU-1",
        "NVIDIA H100 80GB HBM3",
        10,
        5,
        "clocks held by HW slowdown at 89 C",
        "check cooling",
        {"temperature_gpu_celsius": 89.0},
        Workload("llm-pretraining", "job-1", job_gpus=16),
    )
    assert decode_record(Finding, encode_record(finding)) == finding
    topo = NodeTopology(
        "c",
        "n1",
        1,
        (TopologyGpu("GPU-1", 0, "H100", "0000:07:00.0", 0, "0-31", 18),),
        (TopologyLink("GPU-1", "GPU-2", "NV18", 18),),
    )
    assert decode_record(NodeTopology, encode_record(topo)) == topo


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda d: d["d"].__setitem__("severity", "apocalyptic"), "unknown_field"),
        (lambda d: d["d"].__setitem__("ts_ns", "yesterday"), "wrong_type"),
        (lambda d: d["d"].__delitem__("node"), "wrong_type"),
        (lambda d: d["d"]["workload"].__setitem__("confidence", True), "wrong_type"),
        (lambda d: d.__setitem__("type", "NodeTopology"), "wrong_type"),
    ],
)
def test_records_are_checked_against_their_type(edit: Any, reason: str) -> None:
    finding = Finding("x", Severity.INFO, False, "c", "n", None, "m", 1, 1, "s", workload=Workload("idle"))
    raw = msgpack.unpackb(encode_record(finding))
    edit(raw)
    with pytest.raises(DecodeError) as exc:
        decode_record(Finding, msgpack.packb(raw))
    assert exc.value.reason == reason


@pytest.mark.parametrize(
    ("record", "path", "value", "detail"),
    [
        ("Finding", ("severity",), "apocalyptic", "Finding.severity: 'apocalyptic' is not a known Severity"),
        ("Finding", ("workload", "confidence"), True, "Finding.workload.confidence must be float, got bool"),
        ("Finding", ("workload", "job_gpus"), 1.5, "Finding.workload.job_gpus must be int, got float"),
        ("Finding", ("evidence", "power_watts"), "hot", "Finding.evidence.power_watts must be float, got str"),
        ("Finding", ("node",), None, "Finding.node is missing"),
        ("NodeTopology", ("gpus", 0, "index"), "0", "NodeTopology.gpus[0].index must be int, got str"),
        ("NodeTopology", ("links",), {}, "NodeTopology.links must be a list"),
    ],
)
def test_a_refused_record_says_which_field_and_why(
    record: str, path: tuple[str | int, ...], value: Any, detail: str
) -> None:
    """The dead letter's detail names the field by its path in the record (each type's decoder is built once)."""
    records = {
        "Finding": Finding(
            "x",
            Severity.INFO,
            False,
            "c",
            "n",
            None,
            "m",
            1,
            1,
            "s",
            evidence={"power_watts": 1.0},
            workload=Workload("idle", job_gpus=2),
        ),
        "NodeTopology": NodeTopology(
            "c", "n1", 1, (TopologyGpu("GPU-1", 0, "H100", "0000:07:00.0", 0, "0-31", 18),), ()
        ),
    }
    raw = msgpack.unpackb(encode_record(records[record]))
    *inner, last = path
    target = raw["d"]
    for key in inner:
        target = target[key]
    if value is None:
        del target[last]
    else:
        target[last] = value
    with pytest.raises(DecodeError) as exc:
        decode_record(type(records[record]), msgpack.packb(raw))
    assert exc.value.detail == detail


def test_unknown_record_keys_are_ignored() -> None:
    ctx = GpuContext("c", "n", "GPU-1", 5, None)
    raw = msgpack.unpackb(encode_record(ctx))
    raw["d"]["added_in_a_later_version"] = 1
    assert decode_record(GpuContext, msgpack.packb(raw)) == ctx
