"""The health fold: states, remedies and reasons from the findings firing now and from when each GPU last reported."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from pipeline.events import Severity
from pipeline.health.fold import Assessment, FiringFinding, FleetHealth, assess
from pipeline.health.states import Health, Remedy
from pipeline.kinds import FAULTS, RULES
from pipeline.topology import NodeTopology

NOW = 1_800_000_000 * 10**9
S = 10**9


def firing(
    detector: str, severity: str, node: str = "node-1", gpu: str | None = "GPU-a", **evidence: float
) -> FiringFinding:
    labels = {"detector": detector, "severity": severity, "cluster": "c", "node": node}
    if gpu:
        labels["gpu"] = gpu
    return FiringFinding(labels, f"{detector} on {gpu or node}", NOW - 60 * S, evidence)


def during(f: FiringFinding, maintenance: str) -> FiringFinding:
    """The finding as the processor stamps it when its node's topology says it is in a maintenance window."""
    return dataclasses.replace(f, labels={**f.labels, "maintenance": maintenance})


def one(health: FleetHealth, gpu: str = "GPU-a") -> Assessment:
    (a,) = [a for a in health.gpus if a.gpu == gpu]
    return a


def test_a_gpu_fallen_off_the_bus_is_unhealthy_and_its_node_is_rebooted() -> None:
    h = assess([firing("fallen-off-bus", "critical")], [("c", "node-1", "GPU-a", NOW), ("c", "node-1", "GPU-b", NOW)])
    a = one(h)
    assert (a.state, a.remedy) == (Health.UNHEALTHY, Remedy.REBOOT_NODE)
    assert [r.detector for r in a.reasons] == ["fallen-off-bus"]
    assert one(h, "GPU-b").state is Health.HEALTHY
    (node,) = h.nodes
    assert (node.state, node.remedy, node.gpu) == (Health.UNHEALTHY, Remedy.REBOOT_NODE, None)
    assert h.counts() == {"healthy": 1, "degraded": 0, "unhealthy": 1, "unknown": 0, "maintenance": 0}


def test_info_findings_describe_and_never_degrade() -> None:
    h = assess(
        [firing("idle-capacity", "info"), firing("pcie-link-narrow", "info"), firing("thermal-throttling", "info")]
    )
    a = one(h)
    assert (a.state, a.remedy, a.reasons) == (Health.HEALTHY, Remedy.NONE, ())


def test_the_worst_finding_decides_and_its_remedy_is_the_strongest_of_that_state() -> None:
    h = assess([
        firing("thermal-throttling", "warning"),
        firing("ecc-uncorrectable", "critical"),
        firing("memory-leak", "warning"),
    ])  # fmt: skip
    a = one(h)
    assert (a.state, a.remedy) == (Health.UNHEALTHY, Remedy.RESET_GPU)
    assert a.reasons[0].detector == "ecc-uncorrectable"  # worst first
    assert {r.state for r in a.reasons[1:]} == {Health.DEGRADED}
    degraded = one(assess([firing("memory-leak", "warning"), firing("straggler", "warning")]))
    assert (degraded.state, degraded.remedy) == (Health.DEGRADED, Remedy.DRAIN)


def test_an_application_xid_restarts_the_job_and_a_reboot_xid_reboots_the_node() -> None:
    app = one(assess([firing("xid", "warning", xid=13.0)]))
    assert (app.state, app.remedy) == (Health.DEGRADED, Remedy.RESTART_JOB)
    reboot = one(assess([firing("xid", "critical", xid=154.0)]))
    assert (reboot.state, reboot.remedy) == (Health.UNHEALTHY, Remedy.REBOOT_NODE)
    firmware = one(assess([firing("xid", "critical", xid=119.0)]))
    assert (firmware.state, firmware.remedy) == (Health.UNHEALTHY, Remedy.RESET_GPU)
    storm = one(assess([firing("xid-storm", "critical", last_xid=43.0)]))  # 13, 43, 45 in a storm: the application's
    assert (storm.state, storm.remedy) == (Health.DEGRADED, Remedy.RESTART_JOB)
    gsp = one(assess([firing("xid-storm", "critical", last_xid=119.0)]))  # GSP timeouts over and over: the GPU's
    assert (gsp.state, gsp.remedy) == (Health.UNHEALTHY, Remedy.RESET_GPU)


def test_a_silent_gpu_is_unknown_and_so_is_its_node_but_evidence_of_a_fault_wins() -> None:
    fleet = [
        ("c", "node-1", "GPU-a", NOW - 600 * S),
        ("c", "node-1", "GPU-b", NOW - 5 * S),
        ("c", "node-2", "GPU-c", None),
    ]
    h = assess([firing("nvlink-down", "critical", node="node-2", gpu="GPU-c")], fleet, NOW)
    assert one(h, "GPU-a").state is Health.UNKNOWN
    assert one(h, "GPU-b").state is Health.HEALTHY
    assert one(h, "GPU-c").state is Health.UNHEALTHY
    states = {n.node: n.state for n in h.nodes}
    assert states == {"node-1": Health.UNKNOWN, "node-2": Health.UNHEALTHY}


def test_a_silence_says_where_to_look_the_gpu_or_its_node() -> None:
    fleet = [
        ("c", "node-1", "GPU-a", NOW - 600 * S),  # silent while GPU-b of its node reports: the GPU
        ("c", "node-1", "GPU-b", NOW - 5 * S),
        ("c", "node-2", "GPU-c", NOW - 900 * S),  # every GPU of node-2 silent: the node or its collector
        ("c", "node-2", "GPU-d", NOW - 300 * S),
    ]
    h = assess([], fleet, NOW)
    [gpu] = one(h, "GPU-a").reasons
    assert (gpu.detector, gpu.state, gpu.remedy) == ("gpu-silent", Health.UNKNOWN, Remedy.NONE)
    assert gpu.summary.startswith("no sample for 10m while its node reports")
    # what it was when it went quiet is said: a silent healthy fleet is not a list of bare unknowns
    assert gpu.summary.endswith("no finding was open on it when it was last heard from")
    for uuid in ("GPU-c", "GPU-d"):
        [node] = one(h, uuid).reasons
        assert node.detector == "node-silent" and node.summary.startswith("no sample from any GPU of its node for 5m")
    node_2 = next(n for n in h.nodes if n.node == "node-2")
    assert node_2.state is Health.UNKNOWN and [r.detector for r in node_2.reasons] == ["node-silent"]  # said once


def test_a_node_level_finding_makes_its_node_ill_not_its_gpus() -> None:
    h = assess([firing("xid", "critical", gpu=None, xid=79.0)], [("c", "node-1", "GPU-a", NOW)], NOW)
    assert one(h).state is Health.HEALTHY
    (node,) = h.nodes
    assert (node.state, node.remedy) == (Health.UNHEALTHY, Remedy.REBOOT_NODE)


def test_every_fault_class_has_a_rule_with_a_source() -> None:
    assert set(FAULTS) <= set(RULES)
    assert all(rule.source and rule.warning is not Health.HEALTHY for rule in RULES.values())


_KINDS = st.sampled_from([*RULES, "idle-capacity", "memory-collapse", "pcie-link-narrow"])
_FINDINGS = st.lists(
    st.tuples(_KINDS, st.sampled_from([s.value for s in Severity]), st.sampled_from(["n1", "n2"]),
              st.sampled_from(["G1", "G2", "G3", None])),
    max_size=12,
)  # fmt: skip


@given(_FINDINGS)
def test_properties_of_the_fold(found: list[tuple[str, str, str, str | None]]) -> None:
    h = assess([firing(k, s, node=n, gpu=g) for k, s, n, g in found])
    badness = {Health.HEALTHY: 0, Health.UNKNOWN: 1, Health.DEGRADED: 2, Health.UNHEALTHY: 3}
    for a in h.gpus:
        # healthy exactly when nothing at warning or critical with a rule fires on it
        ill = [f for f in found if f[3] == a.gpu and f[2] == a.node and f[0] in RULES and f[1] != "info"]
        assert (a.state is Health.HEALTHY) == (not ill)
        assert (a.remedy is Remedy.NONE) or a.reasons
    for n in h.nodes:
        assert all(badness[n.state] >= badness[a.state] for a in h.gpus if a.node == n.node)
    assert sum(h.counts().values()) == len(h.gpus)


def test_one_kind_on_a_third_of_a_cluster_at_once_is_a_fleet_incident_without_per_gpu_remedies() -> None:
    """The circuit breaker: 5 of 12 GPUs throttling at once (a cooling loop, a driver) is one incident naming what
    they share; they stay degraded but nobody is told to inspect 5 GPUs one by one. 2 of 12 are two GPUs."""
    fleet = [("c", f"node-{i // 4}", f"GPU-{i}", NOW) for i in range(12)]
    hot = [firing("thermal-throttling", "warning", node=f"node-{i // 4}", gpu=f"GPU-{i}") for i in range(5)]
    h = assess([*hot, firing("ecc-uncorrectable", "critical", node="node-2", gpu="GPU-11")], fleet, NOW)
    (incident,) = h.incidents
    assert (incident.detector, incident.gpus, incident.of_gpus) == ("thermal-throttling", 5, 12)
    throttled = [a for a in h.gpus if any(r.detector == "thermal-throttling" for r in a.reasons)]
    assert len(throttled) == 5 and {(a.state, a.remedy) for a in throttled} == {(Health.DEGRADED, Remedy.NONE)}
    assert one(h, "GPU-11").remedy is Remedy.RESET_GPU  # a different kind on one GPU: its own remedy
    few = assess(hot[:2], fleet, NOW)
    assert few.incidents == () and one(few, "GPU-0").remedy is Remedy.INSPECT
    assert assess(hot).incidents == ()  # without the fleet's membership there is no share to judge


def test_one_kind_on_three_nodes_of_one_rack_is_the_racks_incident() -> None:
    """A rack's cooling: thermal throttling on GPUs of 3 of its nodes at once, 12% of a 100-node cluster, is one
    incident naming the rack (and no per-GPU remedy for them); the same on 2 nodes of a rack, or on 3 nodes of 3
    racks, is per-GPU (independent faults are rare: three at once in one rack is not chance)."""
    fleet = [("c", f"node-{n}", f"GPU-{n}-{g}", NOW) for n in range(100) for g in range(4)]

    def hot(node: int, gpu: int, rack: str) -> FiringFinding:
        f = firing("thermal-throttling", "warning", node=f"node-{node}", gpu=f"GPU-{node}-{gpu}")
        return FiringFinding(f.labels | {"rack": rack, "switch": f"leaf-{node}"}, f.summary, f.since_ns, f.evidence)

    rack = [hot(n, g, "r7") for n in (40, 41, 42) for g in range(2)]
    h = assess([*rack, hot(90, 0, "r9")], fleet, NOW)
    (incident,) = h.incidents
    assert (incident.detector, incident.gpus, incident.of_gpus) == ("thermal-throttling", 6, 12)
    assert ("rack", "r7") in incident.shared and not any(k == "switch" for k, _ in incident.shared)
    assert {one(h, f"GPU-{n}-0").remedy for n in (40, 41, 42)} == {Remedy.NONE}
    assert one(h, "GPU-90-0").remedy is Remedy.INSPECT  # another rack: its own
    assert assess(rack[:4], fleet, NOW).incidents == ()  # 2 nodes of the rack
    spread = [hot(n, 0, f"r{n}") for n in (40, 50, 60)]
    assert assess(spread, fleet, NOW).incidents == ()
    # where the topologies say which nodes the rack holds (40-43), its incident counts all its GPUs
    racks = [NodeTopology("c", f"node-{n}", NOW, (), rack="r7" if 40 <= n < 44 else "r0") for n in range(100)]
    (incident,) = assess([*rack, hot(90, 0, "r9")], fleet, NOW, topologies=racks).incidents
    assert (incident.gpus, incident.of_gpus) == (6, 16)


def test_a_node_in_a_maintenance_window_is_maintenance_whatever_fires_and_however_silent() -> None:
    drained = "slurm IDLE+DRAIN: swap PSU 2"
    fleet = [("c", "node-1", "GPU-a", NOW), ("c", "node-1", "GPU-b", NOW - 600 * S), ("c", "node-2", "GPU-c", NOW)]
    in_window = during(firing("nvlink-down", "critical"), drained)
    h = assess([in_window], fleet, NOW, topologies=[NodeTopology("c", "node-1", NOW, (), maintenance=drained)])
    a, b = one(h), one(h, "GPU-b")
    assert (a.state, a.remedy) == (b.state, b.remedy) == (Health.MAINTENANCE, Remedy.NONE)
    # the finding is still a reason (kept, not paged); the silence of a node being worked on is no reason at all
    assert [r.detector for r in a.reasons] == ["maintenance", "nvlink-down"] and drained in a.reasons[0].summary
    assert [r.detector for r in b.reasons] == ["maintenance"]
    node1, node2 = h.nodes
    assert (node1.state, node1.remedy) == (Health.MAINTENANCE, Remedy.NONE) and node2.state is Health.HEALTHY
    # the topology need not be known: the finding's own label says so too
    assert one(assess([in_window], fleet, NOW)).state is Health.MAINTENANCE
    assert h.counts() == {"healthy": 1, "degraded": 0, "unhealthy": 0, "unknown": 0, "maintenance": 2}


def test_findings_of_a_maintenance_window_are_no_fleet_incident() -> None:
    fleet = [("c", f"node-{n}", f"GPU-{n}", NOW) for n in range(10)]
    work = [during(firing("xid", "critical", f"node-{n}", f"GPU-{n}"), "kubernetes cordoned") for n in range(4)]
    assert assess(work, fleet, NOW).incidents == ()
    assert len(assess([firing("xid", "critical", f"node-{n}", f"GPU-{n}") for n in range(4)], fleet, NOW).incidents)


def test_a_stale_ecc_error_of_a_silent_node_keeps_its_gpu_unhealthy_and_says_it_went_quiet() -> None:
    """The node stopped reporting an hour ago with an uncorrectable ECC error firing: the alert stays open (marked
    stale by the alert manager), so the GPU stays unhealthy with the remedy, not 'unknown' and never healthy."""
    quiet = NOW - 3600 * S
    ecc = dataclasses.replace(firing("ecc-uncorrectable", "critical"), stale_since_ns=quiet)
    h = assess([ecc], [("c", "node-1", "GPU-a", quiet), ("c", "node-1", "GPU-b", quiet)], NOW)
    a = one(h)
    assert (a.state, a.remedy) == (Health.UNHEALTHY, Remedy.RESET_GPU)
    assert [r.detector for r in a.reasons] == ["ecc-uncorrectable"]
    assert "stale: no word of it since 2027-01-15T07:00:00Z" in a.reasons[0].summary
    assert one(h, "GPU-b").state is Health.UNKNOWN  # nothing firing, silent: unknown, never healthy
