"""The fault injector: each class shows its physical signature where the ground truth says, and only there;
rates and repair times are those of the StepFun trace (and Llama 3's table for a class the trace lacks)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pytest

from pipeline.codec import decode_record, encode_record
from pipeline.events import EventKind, FaultRecord, GpuEvent, GpuSample
from pipeline.kinds import FAULTS
from producers.simulator import FaultPlan, Fleet, Injection
from producers.simulator.plan import (
    OTHER_CLASSES,
    REPAIR_QUANTILES,
    TRACE_CLASSES,
    TRACE_DAYS,
    trace_rate_per_node_s,
)
from tests import TESTDATA

TRACE = TESTDATA / "stepfun-infinitehbd-fault-trace"
T0 = 1_790_000_000_000_000_000
START_S, DURATION_S, ROUNDS = 60, 300, 480
GPN = 8


@dataclass
class Run:
    fleet: Fleet
    records: list[FaultRecord]
    #: ground truth that is not a fault: benign XIDs
    benign: list[FaultRecord] = field(default_factory=list)
    samples: dict[str, list[GpuSample]] = field(default_factory=lambda: defaultdict(list))
    events: dict[str, list[GpuEvent]] = field(default_factory=lambda: defaultdict(list))

    def record(self, fault: str) -> FaultRecord:
        (record,) = [r for r in self.records if r.fault == fault]
        return record

    def series(self, uuid: str, name: str, lo_s: float, hi_s: float) -> np.ndarray:
        return np.array(
            [s.metrics[name] for s in self.samples[uuid] if lo_s <= (s.ts_ns - T0) / 1e9 < hi_s and name in s.metrics]
        )

    def gpu_of(self, record: FaultRecord) -> int:
        assert record.gpu_uuid is not None
        return self.fleet.uuids.index(record.gpu_uuid)


@pytest.fixture(scope="module")
def run() -> Run:
    """One fleet, every fault class injected at START_S for DURATION_S on a target the injector picks."""
    plan = FaultPlan(rate_scale=0, injections=tuple(Injection(f, START_S, DURATION_S) for f in FAULTS))
    fleet = Fleet(24, GPN, seed=5, faults=plan, extras=True)
    out = Run(fleet, [])
    for r in range(ROUNDS):
        sim = fleet.round(T0 + r * 10**9)
        out.records += [r for r in sim.ground_truth if r.fault in FAULTS]
        out.benign += [r for r in sim.ground_truth if r.fault not in FAULTS]
        for batch in sim.batches:
            for s in batch.samples:
                out.samples[s.gpu_uuid].append(s)
            for e in batch.events:
                out.events[e.gpu_uuid].append(e)
    return out


def test_every_class_is_injected_once_with_exact_times(run: Run) -> None:
    assert sorted(r.fault for r in run.records) == sorted(FAULTS)
    for r in run.records:
        assert r.cluster == "sim" and r.node in run.fleet.nodes
        assert r.start_ns == T0 + START_S * 10**9 and r.end_ns == r.start_ns + DURATION_S * 10**9
        assert r.detail
        assert (r.gpu_uuid is None) == (r.fault == "power-capping")  # a power supply feeds the whole node
        assert decode_record(FaultRecord, encode_record(r)) == r
        assert r.kafka_key == f"sim/{r.node}".encode()
    # faults do not meet: no two on one node's GPU, none on the GPUs of another fault's job
    gpus = [r.gpu_uuid for r in run.records if r.gpu_uuid]
    assert len(gpus) == len(set(gpus))


def test_thermal_throttling(run: Run) -> None:
    r = run.record("thermal-throttling")
    uuid = r.gpu_uuid
    assert uuid is not None
    slowdown = run.series(uuid, "temperature_slowdown_celsius", 0, 1)[0]
    before = (0, START_S)
    during = (START_S + 120, START_S + DURATION_S)  # the temperature needs a couple of minutes to get there
    temp = run.series(uuid, "temperature_gpu_celsius", *during)
    mask = run.series(uuid, "throttle_reasons_mask", *during).astype(int)
    assert temp.max() >= slowdown - 1 and np.median(temp) >= slowdown - 6
    assert (mask & 0x20).mean() > 0.5 and (mask & 0x40).any()  # SW thermal while held, HW at the threshold
    assert np.median(run.series(uuid, "sm_clock_mhz", *during)) < 0.9 * np.median(
        run.series(uuid, "sm_clock_mhz", *before)
    )
    assert np.median(run.series(uuid, "power_watts", *during)) < 0.9 * np.median(
        run.series(uuid, "power_watts", *before)
    )
    assert np.median(run.series(uuid, "utilization_gpu_percent", *during)) >= 80  # the job keeps running
    # nothing of it before the fault, and the temperature starts climbing only once it began
    assert not (run.series(uuid, "throttle_reasons_mask", *before).astype(int) & 0x60).any()
    assert run.series(uuid, "temperature_gpu_celsius", *before).max() < slowdown - 5


def test_power_capping_lowers_every_limit_of_the_node(run: Run) -> None:
    r = run.record("power-capping")
    node = run.fleet.nodes.index(r.node)
    during = (START_S, START_S + DURATION_S)
    capped_busy = 0
    uuids = run.fleet.uuids[node * GPN : (node + 1) * GPN]
    in_force = max(run.series(uuid, "power_limit_watts", 0, START_S).max() for uuid in uuids)
    for uuid in uuids:
        default = run.series(uuid, "power_default_limit_watts", *during)
        limit = run.series(uuid, "power_limit_watts", *during)
        assert (limit <= 0.7 * in_force + 1).all() and (limit >= 0.5 * in_force - 1).all()
        assert run.series(uuid, "power_limit_watts", START_S + DURATION_S, ROUNDS)[0] > limit[0]  # restored
        power = run.series(uuid, "power_watts", *during)
        assert (power <= 1.1 * limit).all()
        mask = run.series(uuid, "throttle_reasons_mask", *during).astype(int)
        if np.median(run.series(uuid, "power_watts", 0, START_S)) > 0.75 * default[0]:
            capped_busy += 1
            assert (mask & 0x4).mean() > 0.5  # SW power cap
            before = np.median(run.series(uuid, "sm_clock_mhz", 0, START_S))
            assert np.median(run.series(uuid, "sm_clock_mhz", *during)) < 0.95 * before
    assert capped_busy >= 1


def test_power_capping_lowers_a_node_whose_operator_limits_are_under_the_default_by_its_magnitude() -> None:
    """A pool its operator capped at 74 % of the default (seed 41113 of the offline evaluation: 296 of 400 W) and a
    supply failure of magnitude 0.72: as a share of the default (288 W) it lowered the limits by 2.7 %, under any
    detector's threshold, and at 0.84 on a miners' node (209 of 250 W, limits 165-198 W, seed 45557) not at all;
    ground truth with no signature. The cap is a share of the node's highest limit in force."""
    plan = FaultPlan(rate_scale=0, injections=(Injection("power-capping", START_S, DURATION_S),))
    fleet = Fleet(8, GPN, seed=5, faults=plan)
    fleet._base_limit = np.round(fleet._default_w * 0.74)  # the pool's own limit, for good
    fleet._operator_limit = fleet._base_limit.copy()  # not the same array: a job's own limit must not move the pool's
    before: dict[str, list[float]] = defaultdict(list)
    during: dict[str, list[float]] = defaultdict(list)
    records: list[FaultRecord] = []
    for r in range(START_S + 120):
        sim = fleet.round(T0 + r * 10**9)
        records += sim.ground_truth
        for batch in sim.batches:
            for s in batch.samples:
                (before if r < START_S else during)[s.gpu_uuid].append(s.metrics["power_limit_watts"])
    (record,) = records
    node = fleet.nodes.index(record.node)
    for uuid in fleet.uuids[node * GPN : (node + 1) * GPN]:
        assert max(during[uuid][1:]) <= 0.7 * max(before[uuid]) + 1  # the default draw: 50-70 %
    assert "of the" in record.detail and "W in force" in record.detail


def test_nvlink_down_moves_traffic_to_pcie(run: Run) -> None:
    r = run.record("nvlink-down")
    uuid = r.gpu_uuid
    assert uuid is not None
    before, during = (0, START_S), (START_S, START_S + DURATION_S)
    active = run.series(uuid, "nvlink_links_active", *during)
    assert (active < run.series(uuid, "nvlink_links_max", *during)).all()
    assert (run.series(uuid, "nvlink_tx_bytes_per_second", *during) == 0).all()
    assert np.median(run.series(uuid, "nvlink_tx_bytes_per_second", *before)) > 1e9
    pcie_before = np.median(run.series(uuid, "pcie_tx_bytes_per_second", *before))
    assert np.median(run.series(uuid, "pcie_tx_bytes_per_second", *during)) > 3 * pcie_before
    crc = run.series(uuid, "nvlink_crc_errors_total", START_S - 1, START_S + 1)
    assert crc[1] - crc[0] >= 100
    assert run.series(uuid, "nvlink_recovery_errors_total", *during)[0] > 0
    sample = next(s for s in run.samples[uuid] if s.ts_ns == r.start_ns)
    assert sample.links is not None
    assert sum(not link.active for link in sample.links) == sample.metrics["nvlink_links_max"] - active[0]
    after = run.series(uuid, "nvlink_links_active", START_S + DURATION_S, ROUNDS)
    assert (after == run.series(uuid, "nvlink_links_max", 0, 1)[0]).all()


def test_pcie_link_degraded_while_busy(run: Run) -> None:
    r = run.record("pcie-link-degraded")
    uuid = r.gpu_uuid
    assert uuid is not None
    during = (START_S, START_S + DURATION_S)
    busy = run.series(uuid, "utilization_gpu_percent", *during) > 0
    width = run.series(uuid, "pcie_link_width", *during)
    gen = run.series(uuid, "pcie_link_gen", *during)
    degraded = (width < run.series(uuid, "pcie_link_width_max", *during)) | (
        gen < run.series(uuid, "pcie_link_gen_max", *during)
    )
    assert degraded[busy].all() and busy.mean() > 0.8
    replay = run.series(uuid, "pcie_replay_total", *during)
    assert replay[-1] - replay[0] >= 100
    assert run.series(uuid, "pcie_replay_total", 0, START_S).max() == 0
    width_max = run.series(uuid, "pcie_link_width_max", 0, 1)[0]
    assert (run.series(uuid, "pcie_link_width", START_S + DURATION_S, ROUNDS) == width_max).all()  # retrained


def test_memory_leak_grows_to_the_top_then_restarts(run: Run) -> None:
    r = run.record("memory-leak")
    uuid = r.gpu_uuid
    assert uuid is not None
    total = run.series(uuid, "memory_total_bytes", 0, 1)[0]
    used = run.series(uuid, "memory_used_bytes", START_S, START_S + DURATION_S)
    assert (np.diff(used) >= 0).mean() > 0.95  # grows steadily
    assert used[-1] > 0.95 * total and used[-1] - used[0] > 0.2 * total
    # out of memory at the end: the process restarts, memory falls and ramps up again
    assert run.series(uuid, "memory_used_bytes", START_S + DURATION_S, START_S + DURATION_S + 2)[0] < 0.5 * used[-1]


def test_straggler_and_its_waiting_peers(run: Run) -> None:
    r = run.record("straggler")
    g = run.gpu_of(r)
    job = run.fleet.scheduler.job_of(g)
    assert job is not None and len(job.gpus) >= 2
    before, during = (0, START_S), (START_S, START_S + DURATION_S)
    uuid = run.fleet.uuids[g]
    peers = [run.fleet.uuids[p] for p in job.gpus if p != g]
    clock = np.median(run.series(uuid, "sm_clock_mhz", *during))
    peer_clock = np.median([np.median(run.series(p, "sm_clock_mhz", *during)) for p in peers])
    util = np.mean(run.series(uuid, "utilization_gpu_percent", *during))
    peer_util = np.mean([np.mean(run.series(p, "utilization_gpu_percent", *during)) for p in peers])
    assert clock < 0.85 * peer_clock or util < 0.85 * peer_util  # GPU-side (clock) or host-side (duty cycle)
    field_ = "sm_active_percent" if "sm_active_percent" in run.samples[peers[0]][0].metrics else "power_watts"
    for p in peers:
        assert np.median(run.series(p, field_, *during)) < 0.9 * np.median(run.series(p, field_, *before))
    # the waits come in periodic dips: the peers' activity varies more than before
    assert np.std(run.series(peers[0], field_, *during)) > np.std(run.series(peers[0], field_, *before))


def test_xid_storm(run: Run) -> None:
    r = run.record("xid-storm")
    uuid = r.gpu_uuid
    assert uuid is not None
    xids = [e for e in run.events[uuid] if e.kind == EventKind.XID]
    assert len(xids) >= 15  # every 3-15 s over 5 minutes
    assert {e.code for e in xids} <= {13, 31, 43, 45} and len({e.code for e in xids}) >= 3
    assert all(r.start_ns <= e.ts_ns < r.end_ns for e in xids)
    assert xids[0].ts_ns == r.start_ns
    assert all("Xid" in e.detail for e in xids)


def test_ecc_uncorrectable(run: Run) -> None:
    r = run.record("ecc-uncorrectable")
    uuid = r.gpu_uuid
    assert uuid is not None
    events = run.events[uuid]
    assert {e.ts_ns for e in events} == {r.start_ns}
    codes = {e.code for e in events if e.kind == EventKind.XID}
    assert 48 in codes and codes & {63, 64}
    assert any(e.kind == EventKind.ECC_DOUBLE_BIT for e in events)
    errors = run.series(uuid, "ecc_uncorrected_total", START_S - 1, START_S + 1)
    assert errors[0] == 0 and errors[1] >= 1
    m = next(s.metrics for s in run.samples[uuid] if s.ts_ns == r.start_ns)
    pending = m.get("row_remap_pending", 0) + m.get("row_remap_failure", 0) + m.get("retired_pages_pending", 0)
    assert pending == 1
    after = next(s.metrics for s in run.samples[uuid] if s.ts_ns == r.end_ns)
    assert after.get("row_remap_pending", 0) == 0 and after.get("retired_pages_pending", 0) == 0  # reset
    # the DBE killed the job: the GPU sits idle, drained, until the reset
    assert (run.series(uuid, "utilization_gpu_percent", START_S + 5, START_S + DURATION_S) == 0).all()


def test_row_remap_pending_until_the_reset_while_the_job_runs_on(run: Run) -> None:
    r = run.record("row-remap")
    uuid = r.gpu_uuid
    assert uuid is not None
    assert {(e.kind, e.code, e.ts_ns) for e in run.events[uuid]} <= {
        (EventKind.XID, 63, r.start_ns),
        (EventKind.ROW_REMAP, 1, r.start_ns),
    }
    assert (EventKind.XID, 63) in {(e.kind, e.code) for e in run.events[uuid]}
    m = next(s.metrics for s in run.samples[uuid] if s.ts_ns == r.start_ns)
    assert m.get("row_remap_pending", 0) + m.get("retired_pages_pending", 0) == 1
    assert m.get("ecc_uncorrected_total", 0) == 0  # correctable: no DBE
    after = next(s.metrics for s in run.samples[uuid] if s.ts_ns == r.end_ns)
    assert after.get("row_remap_pending", 0) == 0 and after.get("retired_pages_pending", 0) == 0  # reset
    before = run.series(uuid, "utilization_gpu_percent", START_S - 30, START_S)
    during = run.series(uuid, "utilization_gpu_percent", START_S + 5, START_S + 35)
    assert (during > 0).mean() >= (before > 0).mean()  # the job was not killed


def test_fallen_off_the_bus(run: Run) -> None:
    r = run.record("fallen-off-bus")
    uuid = r.gpu_uuid
    assert uuid is not None
    kinds = {(e.kind, e.code) for e in run.events[uuid]}
    assert kinds == {(EventKind.XID, 79), (EventKind.GPU_LOST, 0)}
    assert {e.ts_ns for e in run.events[uuid]} == {r.start_ns}
    times = [s.ts_ns for s in run.samples[uuid]]
    assert not [t for t in times if r.start_ns <= t < r.end_ns]  # not one sample while it is lost
    assert r.start_ns - 10**9 in times and r.end_ns in times  # exactly up to the start, back at the end
    node = run.fleet.nodes.index(r.node)
    for other in run.fleet.uuids[node * GPN : (node + 1) * GPN]:
        if other != uuid:
            assert r.start_ns + 10**9 in {s.ts_ns for s in run.samples[other]}  # the node keeps reporting


def test_hbm_thermal_heats_the_memory_to_its_maximum_while_the_die_stays_cool(run: Run) -> None:
    r = run.record("hbm-thermal")
    uuid = r.gpu_uuid
    assert uuid is not None
    before, held = (0, START_S), (START_S + 180, START_S + DURATION_S)
    top = run.series(uuid, "temperature_memory_max_celsius", *held)
    memory = run.series(uuid, "temperature_memory_celsius", *held)
    assert (top == 95).all() and np.median(memory) >= 93 and memory.max() <= 97  # held near its maximum
    assert run.series(uuid, "temperature_memory_celsius", *before).max() < 90
    die = run.series(uuid, "temperature_gpu_celsius", *held)
    assert (die < run.series(uuid, "temperature_slowdown_celsius", *held) - 5).all()
    masks = run.series(uuid, "throttle_reasons_mask", *held).astype(np.int64)
    assert (masks & 0x20).mean() > 0.5 and not (masks & 0x48).any()  # SW thermal, never HW
    assert run.series(uuid, "temperature_memory_celsius", START_S + DURATION_S + 100, ROUNDS).max() < 90  # cools


def test_power_brake_holds_the_clock_of_a_cool_gpu(run: Run) -> None:
    r = run.record("power-brake")
    uuid = r.gpu_uuid
    assert uuid is not None
    before, during = (0, START_S), (START_S + 5, START_S + DURATION_S)
    masks = run.series(uuid, "throttle_reasons_mask", *during).astype(np.int64)
    assert ((masks & 0x88) == 0x88).all() and not (masks & 0x40).any()  # HW slowdown + power brake, not thermal
    assert not (run.series(uuid, "throttle_reasons_mask", *before).astype(np.int64) & 0x88).any()
    clock, top = run.series(uuid, "sm_clock_mhz", *during), run.series(uuid, "sm_clock_max_mhz", *during)
    assert (run.series(uuid, "utilization_gpu_percent", *during) > 0).all()  # busy, yet its clock held low
    assert np.median(clock / top) < 0.65
    slowdown = run.series(uuid, "temperature_slowdown_celsius", *during)
    assert (run.series(uuid, "temperature_gpu_celsius", *during) < slowdown - 3).all()
    after = run.series(uuid, "throttle_reasons_mask", START_S + DURATION_S, ROUNDS).astype(np.int64)
    assert not (after & 0x88).any()


@pytest.mark.parametrize(
    ("fault", "counter", "limit_per_s"),
    [("nvlink-crc-storm", "nvlink_crc_errors_total", 100.0), ("pcie-replay-storm", "pcie_replay_total", 8 / 60),
     ("ecc-sbe-storm", "ecc_corrected_total", 10.0), ("pcie-aer-storm", "pcie_aer_correctable_total", 8 / 60)],
)  # fmt: skip
def test_error_storms_rise_above_dcgms_limit_only_while_they_last(
    run: Run, fault: str, counter: str, limit_per_s: float
) -> None:
    r = run.record(fault)
    uuid = r.gpu_uuid
    assert uuid is not None
    during = run.series(uuid, counter, START_S, START_S + DURATION_S)
    assert (during[-1] - during[0]) / (len(during) - 1) > 1.5 * limit_per_s
    for lo, hi in ((0, START_S), (START_S + DURATION_S + 1, ROUNDS)):
        quiet = run.series(uuid, counter, lo, hi)
        assert (quiet[-1] - quiet[0]) / len(quiet) < 0.1 * limit_per_s
    # the GPU works on: its link keeps its width, its NVLinks stay up
    width = run.series(uuid, "pcie_link_width", START_S, START_S + DURATION_S)
    assert (width == run.series(uuid, "pcie_link_width_max", START_S, START_S + DURATION_S)).all()
    links = run.series(uuid, "nvlink_links_active", START_S, START_S + DURATION_S)
    assert (links == run.series(uuid, "nvlink_links_max", START_S, START_S + DURATION_S)).all()


def test_an_aer_storm_is_seen_at_the_link_partner_only(run: Run) -> None:
    """The errors are counted at the port above the GPU: its own replay counter does not move, and no uncorrectable
    error is injected."""
    r = run.record("pcie-aer-storm")
    uuid = r.gpu_uuid
    assert uuid is not None
    replay = run.series(uuid, "pcie_replay_total", START_S, START_S + DURATION_S)
    assert replay[-1] - replay[0] <= 1  # a marginal link's one replay a day at most
    assert (run.series(uuid, "pcie_aer_uncorrectable_total", 0, ROUNDS) == 0).all()


def test_no_signature_outside_the_faults(run: Run) -> None:
    """GPUs that never had a fault (and are not a faulted job's peers) stay clean of every signature."""
    touched = {r.gpu_uuid for r in run.records}
    for r in run.records:
        if r.gpu_uuid is None:
            node = run.fleet.nodes.index(r.node)
            touched |= set(run.fleet.uuids[node * GPN : (node + 1) * GPN])
        else:
            job = run.fleet.scheduler.job_of(run.gpu_of(r))
            touched |= {run.fleet.uuids[p] for p in job.gpus} if job else set()
    for uuid, samples in run.samples.items():
        if uuid in touched:
            continue
        for s in samples:
            m = s.metrics
            assert int(m["throttle_reasons_mask"]) & 0x60 == 0
            assert m.get("nvlink_links_active", 0) == m.get("nvlink_links_max", 0)
            assert m["pcie_link_width"] == m["pcie_link_width_max"]
            assert m.get("ecc_uncorrected_total", 0) == 0
        xids = [e for e in run.events[uuid] if e.kind == EventKind.XID]
        assert all(_benign_of(run, e) for e in xids)  # a stray user XID, a job's teardown


def _benign_of(run: Run, e: GpuEvent) -> FaultRecord | None:
    """The benign ground truth an XID belongs to: a single application XID at its time, or the first of a teardown's
    XID 45s, 6 s before it at most."""
    return next(
        (
            r
            for r in run.benign
            if r.gpu_uuid == e.gpu_uuid
            and r.fault == "xid"
            and (r.start_ns == e.ts_ns or (e.code == 45 and 0 <= e.ts_ns - r.start_ns <= 6 * 10**9))
        ),
        None,
    )


def test_a_job_torn_down_logs_xid_45_on_its_gpus_as_benign_ground_truth(run: Run) -> None:
    """XID 45 after a job's end (NVSentinel #1629: 12 on each GPU of a crashed job within 6 s): 1-12 per GPU within
    6 s, each burst recorded once as a benign XID, on GPUs whose job had just ended."""
    teardowns = [r for r in run.benign if "XID 45" in r.detail]
    assert teardowns, "no job of the run was torn down with XID 45"
    for r in teardowns:
        assert r.gpu_uuid is not None and r.start_ns == r.end_ns
        burst = [e for e in run.events[r.gpu_uuid] if e.code == 45 and 0 <= e.ts_ns - r.start_ns <= 6 * 10**9]
        assert 1 <= len(burst) <= 12 and burst[0].ts_ns == r.start_ns
        assert f"{len(burst)} XID 45" in r.detail
        after = [s for s in run.samples[r.gpu_uuid] if s.ts_ns >= r.start_ns][:1]
        assert after and after[0].metrics["utilization_gpu_percent"] < 5  # its job is gone


def test_random_faults_follow_the_plan() -> None:
    """A balanced plan sized for the run: every class happens, none on a GPU twice at once, truth is ordered."""
    hours = 1.0
    per_class = 6  # a Poisson count with mean 6 is 0 once in 400 runs (with mean 4, one of 14 classes often was)
    plan = FaultPlan.for_evaluation(nodes=16, seconds=hours * 3600, per_class=per_class)
    assert plan.mix == "balanced"
    expected = plan.expected(16, hours * 3600)
    assert all(v == pytest.approx(per_class) for v in expected.values())
    fleet = Fleet(16, 8, seed=1, faults=plan)
    records: list[FaultRecord] = []
    for r in range(0, int(hours * 3600), 2):
        records += fleet.round(T0 + r * 10**9).ground_truth
    counts = {f: sum(1 for r in records if r.fault == f) for f in FAULTS}
    assert all(c >= 1 for c in counts.values()), (counts, fleet.injector.skipped)
    expected_total = per_class * len(FAULTS)
    assert sum(counts.values()) + sum(fleet.injector.skipped.values()) == pytest.approx(expected_total, rel=0.35)
    for a in records:
        for b in records:
            if a is not b and a.gpu_uuid and a.gpu_uuid == b.gpu_uuid:
                assert a.end_ns <= b.start_ns or b.end_ns <= a.start_ns
        assert plan.min_duration_s * 1e9 <= a.end_ns - a.start_ns <= plan.max_duration_s * 1e9


def test_plan_validation() -> None:
    with pytest.raises(ValueError, match="unknown fault class"):
        FaultPlan(classes=("gremlins",))
    with pytest.raises(ValueError, match="mix"):
        FaultPlan(mix="uniform")
    with pytest.raises(ValueError):
        FaultPlan(rate_scale=-1)
    assert FaultPlan(classes=("xid-storm",)).rate_per_node_s("straggler") == 0.0


def test_injection_on_an_ineligible_target_is_skipped() -> None:
    # node 0 of the default mix is an H100 node; a GeForce-only fault target would be node 11+, but ECC on a
    # GeForce card cannot happen: ask for it on the last node (a GTX 1080 Ti rig)
    fleet = Fleet(
        16, 8, seed=0, faults=FaultPlan(rate_scale=0, injections=(Injection("ecc-uncorrectable", 1, 60, 15, 0),))
    )
    assert fleet.kinds[15].name == "ws-1080ti"
    records = [rec for r in range(5) for rec in fleet.round(T0 + r * 10**9).ground_truth]
    assert records == [] and fleet.injector.skipped["ecc-uncorrectable"] == 1


def _trace_durations() -> dict[str, list[float]]:
    rows = list(csv.DictReader((TRACE / "fault_events.csv").open()))
    open_: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    out: dict[str, list[float]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (float(r["event_time"]), r["event_type"] != "fault_start")):
        key = (row["node_id"], row["Level"], row["Class"], row["Desc"])
        if row["event_type"] == "fault_start":
            open_[key].append(float(row["event_time"]))
            continue
        start = open_[key].pop(0)
        for fault, cls in TRACE_CLASSES.items():
            if any(
                lvl == row["Level"] and c in (None, row["Class"]) and d in (None, row["Desc"])
                for lvl, c, d in cls.sources
            ):
                out[fault].append((float(row["event_time"]) - start) * 24)
    return out


def test_trace_table_matches_the_trace() -> None:
    durations = _trace_durations()
    for fault, cls in TRACE_CLASSES.items():
        assert len(durations[fault]) == cls.count, fault
        assert np.quantile(durations[fault], REPAIR_QUANTILES) == pytest.approx(cls.repair_hours, abs=0.01), fault
    stats = json.loads((TRACE / "fault_statistics.json").read_text())
    gpu = stats["Hardware Failure"]["GPU"]
    assert TRACE_CLASSES["ecc-uncorrectable"].count == gpu["GPU DBE(Double Bit ECC) > Threshold"]
    assert TRACE_CLASSES["pcie-link-degraded"].count == gpu["GPU PCI link width low"]
    assert (
        pytest.approx(
            max(float(r["event_time"]) for r in csv.DictReader((TRACE / "fault_events.csv").open())), abs=0.01
        )
        == TRACE_DAYS
    )
    # about one GPU-relevant fault per 600 node-days in the trace: a real fleet almost never shows one
    total = sum(trace_rate_per_node_s(f) for f in TRACE_CLASSES) * 86_400
    assert 1e-3 < total < 3e-3


def test_classes_the_trace_does_not_separate() -> None:
    """Llama 3's HBM3 interruptions (72 on 2,048 servers in 54 days) set the SBE storm's rate, its thermal interface
    faults (6) the HBM slowdown's; classes no fleet
    publishes get the trace's mean; repair times are those of the nearest trace class."""
    assert set(TRACE_CLASSES) | set(OTHER_CLASSES) == set(FAULTS) and not set(TRACE_CLASSES) & set(OTHER_CLASSES)
    assert trace_rate_per_node_s("ecc-sbe-storm") * 86_400 == pytest.approx(72 / (2048 * 54))
    assert trace_rate_per_node_s("hbm-thermal") * 86_400 == pytest.approx(6 / (2048 * 54))
    mean = np.mean([trace_rate_per_node_s(f) for f in TRACE_CLASSES])
    assert trace_rate_per_node_s("power-brake") == pytest.approx(mean)
    assert trace_rate_per_node_s("pcie-aer-storm") == pytest.approx(mean)
    plan, rng = FaultPlan(), np.random.default_rng(0)
    median = {
        f: np.median([plan.draw_duration_s(f, rng) for _ in range(400)]) for f in ("xid-storm", "nvlink-crc-storm")
    }
    assert median["xid-storm"] < median["nvlink-crc-storm"]  # repaired as an NVLink is, not as an XID


def test_durations_keep_the_trace_order() -> None:
    plan = FaultPlan()
    rng = np.random.default_rng(0)
    median = {f: np.median([plan.draw_duration_s(f, rng) for _ in range(400)]) for f in FAULTS}
    assert all(plan.min_duration_s <= v <= plan.max_duration_s for v in median.values())
    assert median["xid-storm"] < median["pcie-link-degraded"]
    assert median["pcie-aer-storm"] == pytest.approx(median["pcie-link-degraded"], rel=0.3)  # repaired as a PCIe link
    assert median["ecc-uncorrectable"] < median["fallen-off-bus"] <= median["power-capping"]


def test_an_xid_storm_keeps_its_rate_when_the_fleet_is_sampled_once_a_minute() -> None:
    """XIDs are kernel-log events, in real time: a storm of one every 3-15 s gives 4-20 a minute, each at its own
    moment, however seldom the GPUs are read. At 60 s rounds it had given one per round (seed 44556 at 60 s: storms
    "about every 25 s" made 6 XIDs in 5 minutes, two of them XID 45, and no storm)."""
    plan = FaultPlan(rate_scale=0, injections=(Injection("xid-storm", 120, 600),))
    fleet = Fleet(4, GPN, seed=5, faults=plan, extras=True)
    records, xids = [], []
    for r in range(16):
        sim = fleet.round(T0 + r * 60 * 10**9)
        records += [g for g in sim.ground_truth if g.fault == "xid-storm"]
        xids += [e for b in sim.batches for e in b.events if e.kind == EventKind.XID]
    (storm,) = records
    mine = [e for e in xids if e.gpu_uuid == storm.gpu_uuid]
    assert all(storm.start_ns <= e.ts_ns < storm.end_ns for e in mine)
    assert len(mine) >= 30  # 10 rounds of the storm: 40-200 expected, 10 when capped at one a round
    assert len({e.ts_ns for e in mine}) > 10 and [e.ts_ns for e in mine] == sorted(e.ts_ns for e in mine)


@pytest.mark.parametrize("interval", [1, 10, 60])
def test_a_degraded_hbm_is_held_near_its_maximum_at_any_sampling_interval(interval: int) -> None:
    """The driver's controller holds the memory at its max operating temperature, a few degrees either way; the
    fleet's physics must not depend on how often it is read (one 60 s step of the controller had swung a memory to
    158 C, which validation then dead-lettered: seed 33445 of the offline evaluation at 60 s)."""
    plan = FaultPlan(rate_scale=0, injections=(Injection("hbm-thermal", 120, 2400),))
    fleet = Fleet(4, GPN, seed=5, faults=plan, extras=True)
    records, temps = [], []
    for r in range(2700 // interval):
        sim = fleet.round(T0 + r * interval * 10**9)
        records += [g for g in sim.ground_truth if g.fault == "hbm-thermal"]
        temps += [
            (s.ts_ns, s.metrics["temperature_memory_celsius"], s.metrics["temperature_memory_max_celsius"])
            for b in sim.batches
            for s in b.samples
            if records and s.gpu_uuid == records[0].gpu_uuid
        ]
    (hbm,) = records
    held = [t - top for ts, t, top in temps if ts >= hbm.start_ns + 600 * 10**9]
    # at 1 s: at most 2 C over, median 3 C under (the controller's steps dip it further now and then); before the
    # controller was integrated in 1 s steps, 60 s rounds read up to 9 C over and a median of 14 C under
    assert held and max(held) <= 5 and np.median(held) >= -6, (min(held), max(held), np.median(held))
