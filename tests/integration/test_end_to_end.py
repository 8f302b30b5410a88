"""The whole path on real servers: simulated samples -> Kafka -> faust processor -> sink -> InfluxDB."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.codec import encode_record
from pipeline.config import Settings
from pipeline.events import (
    RELATIVE_FIELDS,
    EventKind,
    Finding,
    GpuEvent,
    GpuProcess,
    GpuSample,
    NicSample,
    NvLinkSample,
    SampleBatch,
    Severity,
)
from pipeline.publisher import Publisher
from pipeline.services.stages import wait_for
from producers.simulator import Fleet
from sinks.query import Scope, Store, TrendQuery, trend
from sinks.query.output import iso

from .harness import publish_batches, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration


def test_known_samples_are_stored_exactly(settings: Settings, tmp_path: Path) -> None:
    fleet = Fleet(nodes=3, gpus_per_node=4, cluster=settings.cluster, seed=7)
    start_ms = time.time_ns() // 1_000_000 - 60_000
    batches = [b for r in range(5) for b in fleet.tick((start_ms + r * 1000) * 1_000_000)]
    sent = {(s.gpu_uuid, s.ts_ns // 1_000_000): s for b in batches for s in b.samples}
    assert len(sent) == 60

    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches)
        stats = wait_stored(sink, 60)
    assert stats["dead_lettered"] == 0

    rows = sorted(stored_points(settings), key=lambda r: r["_time"])
    assert len(rows) == 60
    # limits go to gpu_info once per GPU (they do not change in these 5 s), states and counters to gpu when they
    # change (here: with each GPU's first sample), the moving readings every sample
    info = {r["gpu"]: r for r in stored_points(settings, "gpu_info")}
    assert len(info) == 12
    known: dict[str, dict[str, object]] = {}
    for point in rows:
        sample = sent.pop((point["gpu"], int(point["_time"].timestamp() * 1000)))
        filled = known.setdefault(point["gpu"], {})
        filled |= {k: v for k, v in point.items() if v is not None}
        row = info[point["gpu"]] | filled
        assert row["node"] == sample.node
        assert row["gpu_model"] == sample.gpu_model
        assert row["gpu_index"] == str(sample.gpu_index)
        assert row["verdict"] == "unscored"
        for name, value in sample.metrics.items():
            assert row[name] == pytest.approx(value, rel=0, abs=0), name
        stored_fields = {k for k in row if not k.startswith("_") and k not in ("cluster", "node", "gpu", "gpu_index")}
        assert "power_limit_watts" in info[row["gpu"]] and "power_watts" not in info[row["gpu"]]
        assert "nvlink_tx_bytes_per_second" in stored_fields or "NVLink" not in sample.gpu_model
        assert "power_watts" in point and not set(RELATIVE_FIELDS) & stored_fields
    assert not sent, "samples missing from InfluxDB"
    # relative values are not stored: the query layer divides each reading by the limit then in force
    samples = {(s.gpu_uuid, s.ts_ns // 10**9 * 10**9): s for b in batches for s in b.samples}
    span = {"start": iso(start_ms * 10**6 - 10**9), "stop": iso(start_ms * 10**6 + 6 * 10**9)}
    with Store.from_settings(settings) as store:
        result = trend(store, TrendQuery("power_ratio_of_limit", "gpu", "1s", None, "mean",
                                         Scope(cluster=settings.cluster), **span))  # fmt: skip
    assert result.backend == "flux" and len(result.rows) == 60
    for r in result.rows:
        s = samples[(r.group[0], r.time_ns)]
        assert r.value == pytest.approx(s.metrics["power_watts"] / s.metrics["power_limit_watts"], rel=1e-12)


def test_replay_is_idempotent(settings: Settings, tmp_path: Path) -> None:
    """The same samples delivered twice (at-least-once replay) leave exactly one point each."""
    fleet = Fleet(nodes=2, gpus_per_node=2, cluster=settings.cluster, seed=3)
    ts = (time.time_ns() // 1_000_000 - 5_000) * 1_000_000
    batches = fleet.tick(ts)
    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches + batches)
        wait_stored(sink, 8)
    rows = stored_points(settings)
    assert len(rows) == 4
    assert {r["gpu"] for r in rows} == {s.gpu_uuid for b in batches for s in b.samples}


def test_node_extras_and_findings_are_stored(settings: Settings, tmp_path: Path) -> None:
    ts = (time.time_ns() // 1_000_000 - 2_000) * 1_000_000
    sample = GpuSample(
        settings.cluster, "n1", "GPU-x", 0, "NVIDIA H100 80GB HBM3", ts, {"power_watts": 300.0},
        links=(NvLinkSample(0, True, 1e9, 1e9, 0, 0, 0), NvLinkSample(1, False, 0.0, 0.0, 12, 0, 1)),
        processes=(GpuProcess(4242, "python3", 2**30),),
    )  # fmt: skip
    xid = GpuEvent(settings.cluster, "n1", "GPU-x", 0, ts, EventKind.XID, 48, "double-bit ECC error")
    nic = NicSample(settings.cluster, "n1", "mlx5_0", 1, ts, {"rx_bytes_per_second": 2e9, "rate_gbps": 400.0})
    # on another GPU than the sample's: the processor's detectors report the XID 48 on GPU-x themselves
    finding = Finding(
        "ecc-uncorrectable", Severity.CRITICAL, True, settings.cluster, "n1", "GPU-y", "NVIDIA H100 80GB HBM3",
        ts, ts, "XID 48: double-bit ECC error", "drain the node and reset the GPU", {"xid": 48.0},
    )  # fmt: skip
    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, [SampleBatch(settings.cluster, "n1", (sample,), (xid,), (nic,))])
        pub = Publisher(settings.kafka.client_config())
        pub.publish(settings.topics.alerts, finding.dedup_key.encode(), encode_record(finding))
        assert pub.close(30) == 0
        wait_stored(sink, 1)
        assert wait_for(lambda: sink.stats().get("findings_written") == 2, 30)

    (event,) = stored_points(settings, "gpu_event")
    assert (event["kind"], event["code"], event["detail"]) == ("xid", "48", "double-bit ECC error")
    assert event["dedup_key"] == xid.dedup_key
    (port,) = stored_points(settings, "nic")
    assert (port["device"], port["rx_bytes_per_second"], port["rate_gbps"]) == ("mlx5_0", 2e9, 400.0)
    links = {r["link"]: r for r in stored_points(settings, "nvlink")}
    assert links["0"]["active"] == 1.0 and links["1"]["active"] == 0.0 and links["1"]["crc_errors_total"] == 12.0
    (procs,) = stored_points(settings, "gpu_process")
    assert procs["processes"] == "4242 python3 1024MiB" and procs["count"] == 1.0
    by_gpu = {f["gpu"]: f for f in stored_points(settings, "finding")}
    assert set(by_gpu) == {"GPU-x", "GPU-y"}
    assert by_gpu["GPU-x"]["detector"] == "ecc-uncorrectable" and "XID 48" in by_gpu["GPU-x"]["summary"]
    stored_finding = by_gpu["GPU-y"]
    assert stored_finding["summary"] == finding.summary and stored_finding["severity"] == "critical"
    assert stored_finding["ev_xid"] == 48.0 and stored_finding["active"] == 1.0
