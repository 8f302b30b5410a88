"""Faults injected into raw samples reach the real processor's detectors and come out as explained findings in
InfluxDB (`finding` measurement), with the row's explanation on the interpreted stream.

One node of 8 H100s, 20 minutes of data time published as fast as Kafka takes it; each GPU carries one fault's
physical signature (the straggler needs the job context, which the Enricher stage provides: it is covered through
the stage in tests/unit/processors/detectors/).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pynvml
import pytest

from pipeline.codec import decode_interpreted, encode_record
from pipeline.config import Settings
from pipeline.events import EventKind, GpuContext, GpuEvent, GpuSample, SampleBatch, Workload
from pipeline.publisher import Publisher
from pipeline.services.stages import wait_for
from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink
from tests.fakes.readings import GIB, H100, busy_h100

from .harness import consume_all, publish_batches, running_pipeline, stored_points, wait_settled, wait_stored

pytestmark = pytest.mark.integration

S = 1_000_000_000
MODEL = H100
SECONDS = 1200
LOST_AT = 400


def reading(t: int, gpu: int, rng: np.random.Generator) -> dict[str, float] | None:
    # every GPU's PCIe AER counters (its own and its upstream port's) stand still, but GPU 4's below
    m = busy_h100(rng) | {"pcie_aer_correctable_total": 40.0, "pcie_aer_uncorrectable_total": 0.0}
    if gpu == 0 and t >= 60:  # thermal throttling
        m |= {"temperature_gpu_celsius": 89.0, "sm_clock_mhz": 1230.0, "power_watts": 480.0,
              "throttle_reasons_mask": float(pynvml.nvmlClocksThrottleReasonHwThermalSlowdown)}  # fmt: skip
    if gpu == 1 and t >= 120:  # power capping mid-job
        m |= {"power_limit_watts": 420.0, "power_watts": 415.0, "sm_clock_mhz": 1400.0,
              "throttle_reasons_mask": float(pynvml.nvmlClocksThrottleReasonSwPowerCap)}  # fmt: skip
    if gpu == 2 and t >= 60:  # NVLink down, traffic over PCIe, error counters jump
        m |= {"nvlink_links_active": 0.0, "nvlink_tx_bytes_per_second": 0.0, "nvlink_rx_bytes_per_second": 0.0,
              "pcie_tx_bytes_per_second": 24e9, "pcie_rx_bytes_per_second": 24e9, "nvlink_crc_errors_total": 480.0,
              "nvlink_recovery_errors_total": 12.0}  # fmt: skip
    if gpu == 3 and t >= 60:  # PCIe link trained at x8 while busy
        m |= {"pcie_link_width": 8.0, "pcie_replay_total": 10.0 + 3 * (t - 60)}
    if gpu == 4:  # memory leak: +2% of memory per minute
        m["memory_used_bytes"] = float(round(80 * GIB * min(0.99, 0.2 + t / 60 * 0.02 + rng.normal(0, 0.005))))
    if gpu == 4 and t >= 60:  # and a marginal PCIe link whose port counts 30 AER errors a minute, one nonfatal
        m |= {"pcie_aer_correctable_total": 40.0 + (t - 60) // 2, "pcie_aer_uncorrectable_total": float(t >= 600)}
    if gpu == 5 and t >= 100:  # uncorrectable ECC
        m |= {"ecc_uncorrected_total": 1.0, "row_remap_uncorrectable_total": 1.0, "row_remap_pending": 1.0}
    if gpu == 7 and t >= LOST_AT:  # fallen off the bus: no more samples
        return None
    return m


def events(t: int, ts: int, cluster: str) -> tuple[GpuEvent, ...]:
    out = []
    if t == 101:
        out.append(GpuEvent(cluster, "n1", "GPU-5", 5, ts, EventKind.XID, 48, "double-bit ECC error"))
    if 200 <= t < 330 and t % 15 == 0:  # XID storm: 8 XIDs in 105 s, 2 of them 45 (cleanups, not counted)
        code = (13, 31, 43, 45)[t // 15 % 4]
        out.append(GpuEvent(cluster, "n1", "GPU-6", 6, ts, EventKind.XID, code, "Graphics Exception"))
    if t == LOST_AT - 1:
        out.append(GpuEvent(cluster, "n1", "GPU-7", 7, ts, EventKind.XID, 79, "GPU has fallen off the bus"))
        out.append(GpuEvent(cluster, "n1", "GPU-7", 7, ts, EventKind.GPU_LOST, 0, ""))
    return tuple(out)


EXPECTED = {
    "thermal-throttling": ("GPU-0", "HW thermal slowdown at 89 C", "check cooling"),
    "power-capping": ("GPU-1", "power limit lowered to 420 W from 700 W", "restore it"),
    "nvlink-down": ("GPU-2", "0 of 18 links active", "NVSwitch"),
    "pcie-link-degraded": ("GPU-3", "Gen5 x8 of Gen5 x16", "reseat"),
    "memory-leak": ("GPU-4", "memory leak: memory used grows", "OOM"),
    "ecc-uncorrectable": ("GPU-5", "uncorrectable ECC error", "drain the GPU"),
    "xid-storm": ("GPU-6", "XID storm: 5 XIDs", "reset"),
    "fallen-off-bus": ("GPU-7", "fallen off the bus: XID 79", "reboot"),
    "pcie-aer-storm": ("GPU-4", "PCIe AER correctable errors (GPU and upstream port) at ", "reseat"),
}


def test_each_fault_is_detected_and_explained(settings: Settings, tmp_path: Path) -> None:
    cluster = settings.cluster
    start = time.time_ns() - (SECONDS + 5) * S
    topo = NodeTopology(
        cluster, "n1", start,
        tuple(TopologyGpu(f"GPU-{i}", i, MODEL, f"0000:{i + 16:02x}:00.0", numa_node=i // 4, nvlink_links=18)
              for i in range(8)),
        tuple(TopologyLink(f"GPU-{a}", f"GPU-{b}", "NV18", 18) for a in range(8) for b in range(a + 1, 8)),
        nvswitches=4,
    )  # fmt: skip
    pub = Publisher(settings.kafka.client_config())
    pub.publish(settings.topics.topology, topo.kafka_key, encode_record(topo))
    assert pub.close(30) == 0

    rng = np.random.default_rng(11)
    batches, samples = [], 0
    for t in range(SECONDS):
        ts = start + t * S
        gpus = []
        for gpu in range(8):
            metrics = reading(t, gpu, rng)
            if metrics is not None:
                gpus.append(GpuSample(cluster, "n1", f"GPU-{gpu}", gpu, MODEL, ts, metrics))
        samples += len(gpus)
        batches.append(SampleBatch(cluster, "n1", tuple(gpus), events(t, ts, cluster)))

    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches)
        wait_stored(sink, samples, timeout_s=240)
        assert wait_for(lambda: sink.stats().get("findings_written", 0) >= len(EXPECTED), 60), sink.stats()
        wait_settled(sink, "findings_written")  # no new finding stored for 3 s

    findings = stored_points(settings, "finding")
    for detector, (gpu, phrase, action) in EXPECTED.items():
        mine = [f for f in findings if f["detector"] == detector and f["active"] == 1.0]
        assert mine, f"no {detector} finding; got {sorted({f['detector'] for f in findings})}"
        assert {f["gpu"] for f in mine} == {gpu}, (detector, {f["gpu"] for f in mine})
        first = min(mine, key=lambda f: f["_time"])
        assert phrase in first["summary"], first["summary"]
        assert action in first["action"], first["action"]
        assert any(k.startswith("ev_") for k in first), first
    fault_classes = {f["detector"] for f in findings} - {"xid", "row-remap", "idle-capacity"}
    # GPU 3's narrow link also replays 3 times a second (DCGM's limit is 8 a minute): the degraded link's own
    # symptom, told by its finding (the replay counter), not a second alert
    assert fault_classes == set(EXPECTED)
    link = min((f for f in findings if f["detector"] == "pcie-link-degraded"), key=lambda f: f["_time"])
    assert "replay counter" in link["summary"] and link["ev_pcie_replay_total"] >= 10
    # the AER counters came through Kafka, the processor and the sink: the storm's evidence holds the counts
    aer = [f for f in findings if f["detector"] == "pcie-aer-storm"]
    assert max(f["ev_total"] for f in aer) >= 40 + 30 * 9 and max(f["ev_uncorrectable_total"] for f in aer) == 1
    assert max(f["ev_peak_per_s"] for f in aer) * 60 == pytest.approx(30, abs=1)  # a window may straddle its start
    nvlink = min((f for f in findings if f["detector"] == "nvlink-down"), key=lambda f: f["_time"])
    assert "traffic to GPU 0 (NODE)" in nvlink["summary"] and "GPU 4 (SYS)" in nvlink["summary"]

    # the rows of a GPU with an active finding carry its summary in their explanation
    messages = consume_all(settings, settings.topics.interpreted, 10**9, timeout_s=20)
    explained = [
        (uuid, text)
        for b in (decode_interpreted(m.value() or b"") for m in messages)
        for uuid, text in zip(b.gpu_uuid, b.explanation, strict=True)
        if text
    ]
    for gpu, phrase in (("GPU-0", "thermal throttling"), ("GPU-2", "NVLink down"), ("GPU-4", "memory leak")):
        assert any(uuid == gpu and phrase in text for uuid, text in explained), phrase
    assert all(uuid != "GPU-6" or "XID storm" in text or "XID" in text for uuid, text in explained)


def test_a_gpu_whose_nvlink_is_down_is_one_finding_for_its_job_not_eight_unusual_gpus(
    settings: Settings, tmp_path: Path
) -> None:
    """The NVLink case of ``make run`` on a scripted node: one job on all 8 H100s (a context source says so), GPU 4
    loses its NVLinks. One finding, on GPU 4, says the job's 7 other GPUs wait on it; their rows name it."""
    cluster, seconds = settings.cluster, 300
    start = time.time_ns() - (seconds + 5) * S
    pub = Publisher(settings.kafka.client_config())
    for i in range(8):
        ctx = GpuContext(cluster, "n1", f"GPU-{i}", start, Workload("llm-pretraining", "job-1", source="static",
                                                                     confidence=1.0, job_gpus=8))  # fmt: skip
        pub.publish(settings.topics.context, ctx.kafka_key, encode_record(ctx))
    assert pub.close(30) == 0
    rng = np.random.default_rng(4)
    batches = []
    for t in range(seconds):
        ts = start + t * S
        rows = []
        for gpu in range(8):
            m = busy_h100(rng)
            if gpu == 4 and t >= 60:
                m |= {"nvlink_links_active": 0.0, "nvlink_tx_bytes_per_second": 0.0,
                      "nvlink_rx_bytes_per_second": 0.0, "pcie_tx_bytes_per_second": 24e9,
                      "pcie_rx_bytes_per_second": 24e9}  # fmt: skip
            rows.append(GpuSample(cluster, "n1", f"GPU-{gpu}", gpu, MODEL, ts, m))
        batches.append(SampleBatch(cluster, "n1", tuple(rows)))

    with running_pipeline(settings, tmp_path) as (_processor, sink):
        publish_batches(settings, batches)
        wait_stored(sink, 8 * seconds, timeout_s=240)
        assert wait_for(lambda: sink.stats().get("findings_written", 0) >= 1, 60), sink.stats()

    found = [f for f in stored_points(settings, "finding") if f["active"] == 1.0]
    assert {f["detector"] for f in found} - {"idle-capacity"} == {"nvlink-down"}, found
    assert {f["gpu"] for f in found if f["detector"] == "nvlink-down"} == {"GPU-4"}
    first = min((f for f in found if f["detector"] == "nvlink-down"), key=lambda f: f["_time"])
    assert "job job-1 (llm-pretraining), which the 7 other GPUs of its job wait on: NVLink down" in first["summary"]
    assert first["ev_job_gpus_waiting"] == 7.0
    messages = consume_all(settings, settings.topics.interpreted, 10**9, timeout_s=20)
    explained = {
        uuid
        for b in (decode_interpreted(m.value() or b"") for m in messages)
        for uuid, text in zip(b.gpu_uuid, b.explanation, strict=True)
        if "GPU 4 (" in text and "NVLink down" in text
    }
    assert explained == {f"GPU-{i}" for i in range(8)}  # its own rows, and each peer's
