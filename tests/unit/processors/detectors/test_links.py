"""The GPU's links: NVLink down (from the topology, from per-link samples, from the GPU's own link count) with the
peers whose traffic now crosses PCIe, and a PCIe link trained narrow while busy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pipeline.config import DetectorSettings
from pipeline.events import GpuSample, InterpretedEvent, NvLinkSample, Severity
from pipeline.topology import NodeTopology, TopologyGpu, TopologyLink
from processors.detectors.stage import Detectors
from producers.nvml.collector import NvmlCollector
from producers.nvml.replay import ReplayNvml
from tests.fakes.nvml import load_capture
from tests.fakes.readings import busy_h100
from tests.unit.processors.detectors.driver import (
    MODEL,
    T0,
    S,
    batch_of,
    kinds,
    pretraining,
    run,
    starts,
)


def test_nvlink_down_names_the_peers_and_the_pcie_path() -> None:
    topo = NodeTopology(
        "c1", "node-1", T0,
        tuple(TopologyGpu(f"GPU-{i}", i, MODEL, f"0000:{i:02x}:00.0", numa_node=i // 2, nvlink_links=18)
              for i in range(4)),
        tuple(TopologyLink(f"GPU-{a}", f"GPU-{b}", "NV18", 18) for a in range(4) for b in range(a + 1, 4)),
    )  # fmt: skip

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 1 and t >= 200:
            return m | {"nvlink_links_active": 0.0, "nvlink_tx_bytes_per_second": 0.0,
                        "nvlink_rx_bytes_per_second": 0.0, "pcie_tx_bytes_per_second": 24e9,
                        "pcie_rx_bytes_per_second": 24e9, "nvlink_crc_errors_total": 480.0,
                        "nvlink_recovery_errors_total": 12.0}  # fmt: skip
        return m

    det = Detectors(DetectorSettings(), lambda cluster, node: topo if node == "node-1" else None)
    _det, found, batches = run(400, shape, gpus=4, detectors=det)
    assert kinds(found) == {("nvlink-down", "GPU-1")}
    first = starts(found)[0]
    assert first.ts_ns <= T0 + 210 * S
    assert first.evidence["links_active"] == 0 and first.evidence["links_expected"] == 18
    assert first.evidence["pcie_bytes_per_second"] == 48e9
    assert "GPU 0 (NODE), GPU 2 (SYS), GPU 3 (SYS) now crosses PCIe" in first.summary
    # one finding for the job, not four unusual GPUs: it names the job's GPUs waiting, and their rows name it
    assert first.summary.startswith(
        "GPU 1 (NVIDIA H100 80GB HBM3) on node-1, job job-7 (llm-pretraining), which the 3 "
        "other GPUs of its job wait on: NVLink down"
    )
    assert first.evidence["job_gpus_waiting"] == 3
    late = [(u, text) for b in batches for u, ts, text in zip(b.gpu_uuid, b.ts_ns, b.explanation, strict=True)
            if ts >= first.ts_ns]  # fmt: skip
    for peer in ("GPU-0", "GPU-2", "GPU-3"):
        assert all("GPU 1 (" in text and "NVLink down" in text for u, text in late if u == peer), peer


def test_a_gpu_alone_in_its_job_holds_nobody_back() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"nvlink_links_active": 12.0} if gpu == 0 and t >= 100 else m

    _det, found, batches = run(200, shape, gpus=2, job=lambda _t, g: replace(pretraining(_t, g), job_id=f"job-{g}"))
    [first] = starts(found, "nvlink-down")
    assert "wait on" not in first.summary and "job_gpus_waiting" not in first.evidence
    assert not any("NVLink down" in text for b in batches for u, text in zip(b.gpu_uuid, b.explanation, strict=True)
                   if u == "GPU-1")  # fmt: skip


def test_nvlink_from_per_link_samples_when_totals_are_missing() -> None:
    det = Detectors(DetectorSettings())
    rng = np.random.default_rng(0)
    found = []
    for t in range(60):
        events = []
        for gpu in range(2):
            m = busy_h100(rng)
            del m["nvlink_links_active"], m["nvlink_links_max"]
            links = tuple(NvLinkSample(k, not (gpu == 1 and t >= 20 and k < 4)) for k in range(18))
            sample = GpuSample("c1", "node-1", f"GPU-{gpu}", gpu, MODEL, T0 + t * S, m, links=links)
            events.append(InterpretedEvent(sample, workload=pretraining(t, gpu)))
        found += det.apply(batch_of(events, ()), T0)[1]
    assert kinds(found) == {("nvlink-down", "GPU-1")}
    assert starts(found)[0].evidence["links_active"] == 14


def test_nvlink_without_topology_uses_the_samples_own_link_count() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        return m | {"nvlink_links_active": 12.0} if gpu == 0 and t >= 100 else m

    _det, found, _ = run(200, shape, gpus=2)
    assert kinds(found) == {("nvlink-down", "GPU-0")}
    assert starts(found)[0].evidence["links_expected"] == 18


def test_pcie_link_trained_narrow_while_busy() -> None:
    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu == 4 and t >= 100:
            return m | {"pcie_link_width": 8.0, "pcie_link_gen": 4.0, "pcie_replay_total": 10.0 + (t - 100) * 5}
        return m

    _det, found, _ = run(400, shape)
    # 300 replays a minute as well (DCGM's limit is 8 a minute): the degraded link's own symptom, one finding
    assert kinds(found) == {("pcie-link-degraded", "GPU-4")}
    first = starts(found, "pcie-link-degraded")[0]
    assert first.evidence["pcie_width"] == 8 and first.evidence["bandwidth_share"] == pytest.approx(0.25)
    assert "Gen4 x8 of Gen5 x16" in first.summary and "replay counter" in first.summary


def test_replays_on_a_link_at_full_width_are_a_storm_and_one_that_came_first_stays() -> None:
    """The same replays on a GPU whose link stays at Gen5 x16 are a storm (GPU 4); on GPU 5 the storm starts a
    minute before the link trains down, and stays open beside the link's finding."""

    def shape(t: int, gpu: int, m: dict[str, float]) -> dict[str, float]:
        if gpu in (4, 5) and t >= 100:
            m = m | {"pcie_replay_total": 10.0 + (t - 100) * 5}
        if gpu == 5 and t >= 250:
            m = m | {"pcie_link_width": 8.0, "pcie_link_gen": 4.0}
        return m

    _det, found, _ = run(400, shape)
    assert kinds(found) == {
        ("pcie-replay-storm", "GPU-4"),
        ("pcie-replay-storm", "GPU-5"),
        ("pcie-link-degraded", "GPU-5"),
    }


def test_a_real_a10g_narrow_from_its_first_sample_replayed_idle_for_15_minutes_is_one_info_episode() -> None:
    """tests/testdata/nvidia-smi-xml/a10g.xml: a cloud A10G whose link is x8 of x16 in the capture, at 0% utilization
    with no job (how its VM is built). Replayed once a second for 15 minutes: one info episode (re-sent while open)
    with the lanes it has; no warning, nothing about "while busy" or reseating."""
    (captured,) = load_capture("a10g.xml")
    collector = NvmlCollector(ReplayNvml([captured]), "c1", "node-1")
    collector.open()
    (sample,), _ = collector.collect(T0)
    collector.close()
    assert (sample.metrics["pcie_link_width"], sample.metrics["pcie_link_width_max"]) == (8.0, 16.0)
    assert sample.metrics["utilization_gpu_percent"] == 0.0
    det, found = Detectors(DetectorSettings()), []
    for t in range(900):
        rows = [InterpretedEvent(replace(sample, ts_ns=T0 + t * S))]
        _batch, findings = det.apply(batch_of(rows, ()), T0 + t * S)
        found += findings + det.tick(T0 + t * S)
    assert {(f.detector, f.severity, f.active, f.since_ns) for f in found} == {
        ("pcie-link-narrow", Severity.INFO, True, T0)
    }
    assert "x8 of" in found[0].summary and "x16" in found[0].summary
    assert "while busy" not in found[0].summary and "reseat" not in found[0].action.lower()
