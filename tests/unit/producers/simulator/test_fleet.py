"""The simulated fleet: reproducible, valid for the processor, realistic hardware, jobs, phases and topology."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import numpy as np
import pytest

from pipeline.catalogue import lookup
from pipeline.codec import decode_record, encode_record, encode_samples
from pipeline.config import ValidationSettings
from pipeline.events import APPLICATIONS, METRIC_INDEX, PHASES, GpuContext, SampleBatch
from pipeline.topology import NodeTopology
from processors.normalize import RawMessage, process_raw
from producers.simulator import MIXES, MODELS, NODE_KINDS, FaultPlan, Fleet

T0 = 1_790_000_000_000_000_000


def test_same_seed_same_fleet_and_readings() -> None:
    a, b = Fleet(4, 8, seed=42), Fleet(4, 8, seed=42)
    assert a.uuids == b.uuids
    assert a.tick(10**18) == b.tick(10**18)
    assert Fleet(4, 8, seed=43).uuids != a.uuids


def test_same_seed_same_everything_with_faults_and_extras() -> None:
    plan = FaultPlan(rate_scale=3e4, mix="balanced", min_duration_s=30, max_duration_s=120)
    a, b = (Fleet(6, 8, seed=7, faults=plan, extras=True) for _ in range(2))
    for r in range(240):
        ra, rb = a.round(T0 + r * 10**9), b.round(T0 + r * 10**9)
        assert ra == rb
    assert a.injector.active or a.injector.skipped  # the plan did something to compare


def test_one_batch_per_node_with_its_gpus() -> None:
    batches = Fleet(3, 4, cluster="c", seed=1).tick(10**18)
    assert [b.node for b in batches] == ["node-0000", "node-0001", "node-0002"]
    assert all([s.gpu_index for s in b.samples] == [0, 1, 2, 3] for b in batches)
    assert len({s.gpu_uuid for b in batches for s in b.samples}) == 12
    assert all(s.ts_ns == 10**18 for b in batches for s in b.samples)


def test_unsupported_fields_are_absent_not_zero() -> None:
    fleet = Fleet(40, 2, seed=3)
    for batch in fleet.tick(10**18):
        for sample in batch.samples:
            assert set(sample.metrics) <= set(METRIC_INDEX)
            model = MODELS[sample.gpu_model]
            assert ("nvlink_tx_bytes_per_second" in sample.metrics) == model.nvlink
            # DCGM profiling only on data-centre GPUs, memory temperature only on HBM, ECC only where it exists
            assert ("sm_active_percent" in sample.metrics) == model.profiling
            assert ("temperature_memory_celsius" in sample.metrics) == model.hbm
            assert ("ecc_uncorrected_total" in sample.metrics) == bool(model.ecc)
            assert ("row_remap_pending" in sample.metrics) == (model.ecc == "remap")
            assert ("retired_pages_pending" in sample.metrics) == (model.ecc == "retire")
            assert ("fan_speed_percent" in sample.metrics) == bool(model.fan)


def test_limits_come_from_the_catalogue() -> None:
    for batch in Fleet(len(NODE_KINDS), 8, seed=4).tick(10**18):
        for sample in batch.samples:
            spec = lookup(sample.gpu_model)
            assert spec is not None
            m = sample.metrics
            assert m["memory_total_bytes"] == spec.memory_bytes
            assert m["sm_clock_max_mhz"] == spec.sm_clock_max_mhz
            assert m["temperature_slowdown_celsius"] == spec.slowdown_celsius
            assert m["pcie_link_width_max"] == spec.pcie_width_max
            assert m["power_default_limit_watts"] == spec.power_default_watts
            assert spec.power_min_watts is not None
            assert spec.power_min_watts <= m["power_limit_watts"] <= m["power_default_limit_watts"]


def test_default_mix_has_nvlink_pcie_and_older_nodes() -> None:
    kinds = Counter(k.name for k in Fleet(100, 8, seed=0).kinds)
    assert sum(kinds.values()) == 100
    assert kinds == {k: round(100 * w) for k, w in MIXES["default"]}
    fabrics = {NODE_KINDS[k].fabric for k in kinds}
    assert fabrics == {"nvswitch", "cube-mesh", "pcie", "workstation"}
    # the DGX-1 cube mesh only exists with 8 GPUs: other sizes get the other kinds
    assert all(k.fabric != "cube-mesh" for k in Fleet(100, 4, seed=0).kinds)


def test_unknown_mix_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fleet mix"):
        Fleet(2, 8, mix="moon")


def test_energy_accumulates_power_over_time() -> None:
    fleet = Fleet(1, 1, seed=0)
    first = fleet.tick(10**18)[0].samples[0]
    second = fleet.tick(10**18 + 2 * 10**9)[0].samples[0]
    gained = second.metrics["energy_joules"] - first.metrics["energy_joules"]
    assert gained == pytest.approx(second.metrics["power_watts"] * 2, abs=0.011)  # power is reported to 0.01 W


def test_empty_fleet_is_refused() -> None:
    with pytest.raises(ValueError):
        Fleet(0, 8)


def _history(fleet: Fleet, seconds: int, step_s: int = 1) -> dict[str, list[tuple[int, dict[str, float], str, str]]]:
    """Per GPU: (round, metrics, true application, true phase)."""
    out: dict[str, list[tuple[int, dict[str, float], str, str]]] = defaultdict(list)
    for r in range(0, seconds, step_s):
        batches = fleet.tick(T0 + r * 10**9)
        apps, phases = fleet.applications(), fleet.phases()
        index = {u: i for i, u in enumerate(fleet.uuids)}
        for b in batches:
            for s in b.samples:
                out[s.gpu_uuid].append((r, s.metrics, apps[index[s.gpu_uuid]], phases[index[s.gpu_uuid]]))
    return out


@pytest.fixture(scope="module")
def healthy() -> tuple[Fleet, dict[str, list[tuple[int, dict[str, float], str, str]]]]:
    fleet = Fleet(24, 8, seed=11, extras=True)
    return fleet, _history(fleet, 1800, 2)


def test_everything_emitted_is_valid_for_the_processor() -> None:
    """Ten simulated minutes with every fault class and all extras: not one dead letter."""
    plan = FaultPlan(rate_scale=2e5, mix="balanced", min_duration_s=60, max_duration_s=240)
    fleet = Fleet(16, 8, seed=5, faults=plan, extras=True)
    now = time.time_ns()
    start = now - 700 * 10**9
    samples = events = nics = 0
    seen: set[str] = set()
    for r in range(600):
        sim = fleet.round(start + r * 10**9)
        seen |= {g.fault for g in sim.ground_truth}
        messages = [RawMessage(b.kafka_key, encode_samples(b), f"raw/0/{r}", i % 3) for i, b in enumerate(sim.batches)]
        out = process_raw(messages, now, ValidationSettings())
        assert out.dead == [], out.dead[0].headers
        samples += out.samples_ok
        events += sum(len(b.gpu_events) for _, b in out.forward)
        nics += sum(len(b.nics) for _, b in out.forward)
    assert seen == set(plan.classes)  # every class happened, so every signature went through validation
    assert samples > 600 * 120 and events > 0 and nics > 0


def test_healthy_gpus_show_no_fault_signature(healthy: tuple[Fleet, dict]) -> None:  # type: ignore[type-arg]
    _, history = healthy
    for rows in history.values():
        limits = {m["power_limit_watts"] for _, m, _, _ in rows}
        for _r, m, app, _phase in rows:
            assert int(m["throttle_reasons_mask"]) & 0x60 == 0  # no thermal slowdown
            assert m["temperature_gpu_celsius"] < m["temperature_slowdown_celsius"] - 3
            assert m["pcie_link_width"] == m["pcie_link_width_max"]
            if m["utilization_gpu_percent"] > 0 and app != "idle":
                assert m["pcie_link_gen"] == m["pcie_link_gen_max"]
            assert m.get("ecc_uncorrected_total", 0) == 0
            assert m.get("row_remap_pending", 0) == 0
            assert m.get("nvlink_links_active", 0) == m.get("nvlink_links_max", 0)
            assert m["pcie_replay_total"] <= 2
            assert m["pcie_aer_correctable_total"] <= 2 and m["pcie_aer_uncorrectable_total"] == 0
        # an operator's cap is a state; only a miner's job start changes the limit (to a lower state)
        assert len(limits) <= 3


def test_idle_gpus_look_like_the_real_idle_captures(healthy: tuple[Fleet, dict]) -> None:  # type: ignore[type-arg]
    _, history = healthy
    idle = [
        m for rows in history.values() for _, m, app, _ in rows if app == "idle" and m["utilization_gpu_percent"] == 0
    ]
    assert len(idle) > 1000
    for m in idle:
        assert m["pcie_link_gen"] == 1  # link power saving at idle, width unchanged
        assert int(m["throttle_reasons_mask"]) & 0x1  # GpuIdle
        assert m["sm_clock_mhz"] <= 345
    gddr = [m for m in idle if "temperature_memory_celsius" not in m and m["process_count"] == 0]
    assert gddr and all(m["performance_state"] == 8 and m["memory_clock_mhz"] == 405 for m in gddr)


def test_phases_happen_and_look_alarming_but_normal(healthy: tuple[Fleet, dict]) -> None:  # type: ignore[type-arg]
    _, history = healthy
    by_phase: dict[str, list[dict[str, float]]] = defaultdict(list)
    for rows in history.values():
        for _, m, app, phase in rows:
            if app in ("llm-pretraining", "llm-finetuning", "bert-training", "resnet-training"):
                by_phase[phase].append(m)
    assert {"compute", "data-loading", "checkpoint", "eval"} <= set(by_phase)
    median = {p: {k: float(np.median([m[k] for m in ms])) for k in ("power_watts", "pcie_tx_bytes_per_second")}
              for p, ms in by_phase.items()}  # fmt: skip
    # a checkpoint: power collapses and the weights stream to the host
    assert median["checkpoint"]["power_watts"] < 0.5 * median["compute"]["power_watts"]
    assert median["checkpoint"]["pcie_tx_bytes_per_second"] > 5 * median["compute"]["pcie_tx_bytes_per_second"]
    assert median["eval"]["power_watts"] < median["compute"]["power_watts"]


def test_temperature_lags_power(healthy: tuple[Fleet, dict]) -> None:  # type: ignore[type-arg]
    """After a job starts, power jumps at once but temperature takes tens of seconds (first-order lag)."""
    _, history = healthy
    lags = []
    for rows in history.values():
        for i in range(1, len(rows) - 60):
            before, after = rows[i - 1][1], rows[i][1]
            sustained = all(m["power_watts"] > 0.6 * m["power_limit_watts"] for _, m, _, _ in rows[i : i + 60])
            if before["power_watts"] < 0.2 * before["power_limit_watts"] and sustained:
                settled = rows[i + 59][1]["temperature_gpu_celsius"]
                step = after["temperature_gpu_celsius"] - before["temperature_gpu_celsius"]
                lags.append(step / max(settled - before["temperature_gpu_celsius"], 1))
    assert lags, "no power step found"
    assert float(np.median(lags)) < 0.25  # after one 2 s round, less than a quarter of the way there


def test_gpus_are_not_identical(healthy: tuple[Fleet, dict]) -> None:  # type: ignore[type-arg]
    """Peers of one job on one model differ persistently (silicon lottery, position in the airflow)."""
    fleet, history = healthy
    job_temps: dict[str, list[float]] = defaultdict(list)
    for g, uuid in enumerate(fleet.uuids):
        job = fleet.scheduler.job_of(g)
        if job is not None and job.app == "llm-pretraining":
            job_temps[job.job_id].append(
                float(np.mean([m["temperature_gpu_celsius"] for _, m, _, _ in history[uuid][-100:]]))
            )
    spreads = [max(t) - min(t) for t in job_temps.values() if len(t) >= 8]
    assert spreads and min(spreads) >= 3


def test_applications_have_their_own_signatures(healthy: tuple[Fleet, dict]) -> None:  # type: ignore[type-arg]
    _, history = healthy
    by_app: dict[str, list[dict[str, float]]] = defaultdict(list)
    for rows in history.values():
        for _, m, app, phase in rows:
            if phase == "compute":
                by_app[app].append(m)
    gib = 2**30
    hashing = by_app["hashing"]
    assert hashing and np.median([m["utilization_gpu_percent"] for m in hashing]) == 100
    assert all(m["memory_used_bytes"] < 6 * gib and m["pcie_rx_bytes_per_second"] < 2e6 for m in hashing)
    assert np.median([m["utilization_memory_percent"] for m in hashing]) >= 90
    assert all(int(m["throttle_reasons_mask"]) & 0x2 for m in hashing)  # locked application clocks
    serving = by_app["llm-serving"]
    assert serving and np.median([m["memory_used_bytes"] / m["memory_total_bytes"] for m in serving]) > 0.5
    assert np.std([m["utilization_gpu_percent"] for m in serving]) > 5  # load follows requests
    sd = [m["utilization_gpu_percent"] for m in by_app["stable-diffusion-inference"]]
    assert sd and 0.1 < np.mean(np.array(sd) > 80) < 0.9  # bursts of requests between idle gaps
    rendering = [m for m in by_app["rendering"] if "tensor_active_percent" in m]
    if rendering:
        assert np.median([m["tensor_active_percent"] for m in rendering]) < 10  # the SMs and RT cores, not tensor
    pretraining = by_app["llm-pretraining"]
    assert np.median([m["nvlink_tx_bytes_per_second"] for m in pretraining]) > 1e10


def test_contexts_cover_every_gpu_then_only_changes() -> None:
    fleet = Fleet(16, 8, seed=2)
    first = fleet.round(T0)
    assert [c.gpu_uuid for c in first.contexts] == fleet.uuids
    apps = {c.workload.application for c in first.contexts if c.workload}
    assert apps <= set(APPLICATIONS) and "llm-pretraining" in apps
    changes: list[GpuContext] = []
    for r in range(1, 1200):
        sim = fleet.round(T0 + r * 10**9)
        changes += sim.contexts
        assert all(c.ts_ns == sim.ts_ns for c in sim.contexts)
    assert changes, "no job started or ended in 20 minutes"
    for ctx in changes:
        assert decode_record(GpuContext, encode_record(ctx)) == ctx
        g = fleet.uuids.index(ctx.gpu_uuid)
        if ctx.workload is not None:
            w = ctx.workload
            assert w.source == "simulator" and w.confidence == 1.0 and w.job_id and w.user and w.tenant
            assert w.model and w.framework and w.job_gpus and w.job_gpus >= 1
            assert ctx.node == fleet.nodes[g // 8]
    # the current state agrees with the last change of each GPU
    last = {c.gpu_uuid: c.workload for c in changes}
    now = {c.gpu_uuid: c.workload for c in fleet.contexts(T0)}
    assert all(now[u] == w for u, w in last.items())


def test_multi_node_pretraining_spans_whole_nodes() -> None:
    fleet = Fleet(32, 8, seed=3)
    fleet.round(T0)
    jobs = {j.job_id: j for j in fleet.scheduler.jobs.values() if j.app == "llm-pretraining"}
    assert jobs
    for job in jobs.values():
        assert 16 <= len(job.gpus) <= 64 and len(job.gpus) % 8 == 0
        assert len({g // 8 for g in job.gpus}) == len(job.gpus) // 8


def test_topology_describes_each_node_kind() -> None:
    fleet = Fleet(len(NODE_KINDS), 8, seed=1, mix="default")
    topologies = fleet.topologies(T0)
    assert [t.node for t in topologies] == fleet.nodes
    for kind, topo in zip(fleet.kinds, topologies, strict=True):
        assert decode_record(NodeTopology, encode_record(topo)) == topo
        assert [g.uuid for g in topo.gpus] == fleet.uuids[fleet.nodes.index(topo.node) * 8 :][:8]
        assert len({g.pci_bus_id for g in topo.gpus}) == 8
        pairs = [link for link in topo.links if link.b.startswith("GPU-")]
        assert len(pairs) == 28  # every pair of GPUs once
        kinds = Counter(link.kind for link in pairs)
        if kind.fabric == "nvswitch":
            links = MODELS[kind.model].spec.nvlink_links
            assert kinds == {f"NV{links}": 28} and topo.nvswitches == kind.nvswitches
        elif kind.fabric == "cube-mesh":
            assert kinds == {"NV1": 8, "NV2": 8, "SYS": 12}
            assert all(g.nvlink_links == 6 for g in topo.gpus)
        elif kind.fabric == "pcie":
            assert set(kinds) == {"PIX", "NODE", "SYS"}
        else:
            assert set(kinds) == {"PHB"}
        assert len(topo.nics) == kind.nic_count
        for nic in topo.nics:
            assert nic.name.startswith("mlx5_") and nic.rate_gbps == kind.nic_rate_gbps
            paths = [link.kind for link in topo.links if link.b == nic.name]
            assert len(paths) == 8 and set(paths) <= {"PIX", "PXB", "NODE", "SYS"}
        if kind.fabric == "nvswitch" and kind.model.startswith("NVIDIA H"):
            assert {n.rate_gbps for n in topo.nics} == {400} and {n.link_layer for n in topo.nics} == {"InfiniBand"}


def test_extras_links_processes_and_nics() -> None:
    fleet = Fleet(len(NODE_KINDS), 8, seed=6, extras=True)
    fleet.tick(T0)
    batches = fleet.tick(T0 + 10**9)
    for kind, batch in zip(fleet.kinds, batches, strict=True):
        assert len(batch.nics) == kind.nic_count
        for nic in batch.nics:
            assert nic.metrics["port_state_active"] == 1 and nic.metrics["rate_gbps"] == kind.nic_rate_gbps
        for s in batch.samples:
            assert s.processes is not None and len(s.processes) == s.metrics["process_count"]
            if MODELS[s.gpu_model].nvlink:
                assert s.links is not None and len(s.links) == s.metrics["nvlink_links_max"]
                assert all(link.active and link.remote_pci_bus_id for link in s.links)
            else:
                assert s.links is None
    names = {p.name for b in batches for s in b.samples for p in s.processes or ()}
    assert {"python", "/usr/lib/xorg/Xorg"} <= names
    assert Fleet(2, 8, seed=6).tick(T0)[0].samples[0].processes is None  # extras are off by default


def test_fleet_phases_and_applications_use_the_vocabularies() -> None:
    fleet = Fleet(8, 8, seed=9)
    for r in range(300):
        fleet.tick(T0 + r * 10**9)
        assert set(fleet.phases()) <= set(PHASES)
        assert set(fleet.applications()) <= set(APPLICATIONS)


def test_a_lost_gpu_leaves_its_node_batch_with_the_others() -> None:
    from producers.simulator import Injection

    fleet = Fleet(2, 4, seed=1, faults=FaultPlan(rate_scale=0, injections=(Injection("fallen-off-bus", 2, 10, 0, 1),)))
    batches: list[list[SampleBatch]] = [fleet.tick(T0 + r * 10**9) for r in range(15)]
    counts = [len(b[0].samples) for b in batches]
    assert counts == [4, 4] + [3] * 10 + [4, 4, 4]
