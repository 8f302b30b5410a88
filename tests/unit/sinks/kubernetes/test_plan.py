"""The Kubernetes hand-off's plan (sinks.kubernetes.plan): pure, from health records and what the cluster holds to
what to write. The writes themselves go to a real kube-apiserver in tests/integration/test_kubernetes_sync.py."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import DecodeError
from pipeline.health.states import Health, Remedy
from sinks.kubernetes.plan import (
    NO_EXECUTE,
    NO_SCHEDULE,
    NONE,
    Condition,
    DeviceRef,
    HealthRecord,
    Policy,
    devices_of,
    node_condition,
    parse_record,
    plan,
    rule_name,
    rule_of,
)

DRIVER = "gpu.nvidia.com"


def rec(node: str, gpu: str | None, state: Health, remedy: Remedy = Remedy.NONE, since: int = 0) -> HealthRecord:
    detector = "" if state is Health.HEALTHY else "xid"
    return HealthRecord("c1", node, gpu, state, remedy, detector, f"{gpu} {state.value}" if detector else "", since)


def fleet(nodes: int, gpus: int) -> dict[str, DeviceRef]:
    return {f"GPU-{n}-{g}": DeviceRef(DRIVER, f"n{n}", f"gpu-{g}", f"n{n}") for n in range(nodes) for g in range(gpus)}


def healthy(nodes: int, gpus: int) -> list[HealthRecord]:
    return [rec(f"n{n}", f"GPU-{n}-{g}", Health.HEALTHY) for n in range(nodes) for g in range(gpus)]


def test_parse_record_reads_the_health_topic_and_refuses_garbage() -> None:
    value = {
        "cluster": "c1",
        "node": "n0",
        "gpu": "GPU-0-1",
        "state": "unhealthy",
        "remedy": "reset GPU",
        "last_seen_ns": None,
        "reasons": [{"detector": "xid", "severity": "critical", "since_ns": 5, "summary": "XID 79: fell off the bus"}],
        "ts_ns": 9,
    }
    r = parse_record(json.dumps(value).encode())
    assert (r.node, r.gpu, r.state, r.remedy, r.detector, r.since_ns) == (
        "n0",
        "GPU-0-1",
        Health.UNHEALTHY,
        Remedy.RESET_GPU,
        "xid",
        5,
    )
    assert parse_record(json.dumps(value | {"gpu": "-"}).encode()).gpu is None  # the node's own key
    for bad in (
        b"not json",
        b"[]",
        json.dumps(value | {"state": "sick"}).encode(),
        json.dumps({"node": "n0"}).encode(),
    ):
        with pytest.raises(DecodeError):
            parse_record(bad)


def test_node_condition_is_true_only_when_every_gpu_is_healthy() -> None:
    assert node_condition(healthy(1, 4)) == Condition("True", "GPUsHealthy", "4 GPUs healthy")
    sick = [*healthy(1, 3), rec("n0", "GPU-0-3", Health.UNHEALTHY, Remedy.RESET_GPU)]
    c = node_condition(sick)
    assert (c.status, c.reason) == ("False", "GPUUnhealthy")
    assert c.message.startswith("1 of 4 GPUs unhealthy; GPU-0-3 unhealthy: GPU-0-3 unhealthy (remedy: reset GPU)")
    assert node_condition([*healthy(1, 3), rec("n0", "GPU-0-3", Health.DEGRADED)]).reason == "GPUDegraded"
    assert node_condition([rec("n0", None, Health.MAINTENANCE)]).status == "Unknown"


def test_a_long_message_is_cut_at_a_word_never_inside_one() -> None:
    many = [rec("n0", f"GPU-0-{g}-{'x' * 30}", Health.UNHEALTHY, Remedy.DRAIN) for g in range(60)]
    message = node_condition(many).message
    assert len(message) <= 1024 and message.endswith("…")
    assert message[:-1].rstrip().split(" ")[-1].startswith(("GPU-0-", "(remedy:", "drain)", "unhealthy"))


def test_devices_are_found_by_their_uuid_attribute_in_the_drivers_slices() -> None:
    slices = [
        {
            "spec": {
                "driver": DRIVER,
                "nodeName": "n0",
                "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}, "index": {"int": 0}}},
                    {"name": "gpu-1", "attributes": {"index": {"int": 1}}},  # no uuid: cannot be matched
                ],
            }
        },
        {
            "spec": {
                "driver": "gpu.amd.com",
                "pool": {"name": "n1"},
                "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-b"}}}],
            }
        },
    ]
    assert devices_of(slices, DRIVER) == {"GPU-a": DeviceRef(DRIVER, "n0", "gpu-0")}
    assert devices_of(slices, DRIVER)["GPU-a"].node == "n0"


def test_degraded_is_none_unhealthy_is_noschedule_and_noexecute_only_when_allowed() -> None:
    records = [*healthy(2, 8)]
    records[3] = rec("n0", "GPU-0-3", Health.DEGRADED)
    records[9] = rec("n1", "GPU-1-1", Health.UNHEALTHY, Remedy.RESET_GPU)
    nodes: dict[str, Condition | None] = {"n0": None, "n1": None}
    p = plan(records, nodes, fleet(2, 8), [], Policy())
    assert {(r.gpu, r.effect, r.value) for r in p.create} == {
        ("GPU-0-3", NONE, "degraded"),
        ("GPU-1-1", NO_SCHEDULE, "unhealthy"),
    }
    assert {n: c.status for n, c in p.conditions} == {"n0": "False", "n1": "False"}
    assert (p.update, p.delete, p.held) == ((), (), ())
    p = plan(records, nodes, fleet(2, 8), [], Policy(no_execute=True))
    assert {r.gpu: r.effect for r in p.create}["GPU-1-1"] == NO_EXECUTE


def test_the_plan_of_a_cluster_in_step_is_empty_and_recovery_deletes_the_rule() -> None:
    records = [*healthy(1, 4)]
    records[2] = rec("n0", "GPU-0-2", Health.UNHEALTHY, Remedy.RESET_GPU)
    first = plan(records, {"n0": None}, fleet(1, 4), [], Policy())
    # the topic holds only GPUs whose health changed: the node's GPUs are counted from its ResourceSlices
    alone = plan(records[2:3], {"n0": None}, fleet(1, 4), [], Policy())
    assert alone.conditions == first.conditions and dict(first.conditions)["n0"].message.startswith("1 of 4 GPUs")
    # the cluster as the first plan left it: read back through the objects it wrote
    rules = [rule_of(r.manifest("hermeneut.io/gpu-health")) for r in first.create]
    conditions = dict(first.conditions)
    again = plan(records, conditions, fleet(1, 4), [r for r in rules if r], Policy())
    assert again.writes == 0
    records[2] = rec("n0", "GPU-0-2", Health.HEALTHY)
    healed = plan(records, conditions, fleet(1, 4), [r for r in rules if r], Policy())
    assert healed.delete == (rule_name("n0", "GPU-0-2"),)
    assert healed.conditions == (("n0", Condition("True", "GPUsHealthy", "4 GPUs healthy")),)


def test_unknown_and_maintenance_leave_a_taint_as_it_is() -> None:
    records = [rec("n0", "GPU-0-0", Health.UNHEALTHY, Remedy.RESET_GPU)]
    rule = plan(records, {"n0": None}, fleet(1, 1), [], Policy()).create[0]
    for state in (Health.UNKNOWN, Health.MAINTENANCE):
        p = plan([rec("n0", "GPU-0-0", state)], {"n0": None}, fleet(1, 1), [rule], Policy())
        assert (p.create, p.update, p.delete) == ((), (), ())


def test_the_breaker_holds_strong_taints_beyond_its_share_and_keeps_those_already_there() -> None:
    devices = fleet(4, 8)  # 32 GPUs; 10 %: 3 may carry NoSchedule at once
    records = healthy(4, 8)
    sick = {f"GPU-{n}-0" for n in range(4)} | {"GPU-0-1", "GPU-1-1"}  # 6 at once: a bad driver roll-out
    records = [
        rec(r.node, r.gpu, Health.UNHEALTHY, Remedy.RESET_GPU, since=i) if r.gpu in sick else r
        for i, r in enumerate(records)
    ]
    p = plan(records, dict.fromkeys(("n0", "n1", "n2", "n3")), devices, [], Policy(max_tainted_share=0.1))
    strong = [r for r in p.create if r.effect == NO_SCHEDULE]
    assert len(strong) == 3 and len(p.held) == 3 and len(p.create) == 6
    assert all(h.wanted == NO_SCHEDULE and "3 of 32 GPUs" in h.why for h in p.held)
    assert {r.gpu for r in p.create if r.effect == NONE} == {h.gpu for h in p.held}
    # the longest unhealthy first (equal remedies)
    assert {r.gpu for r in strong} == {"GPU-0-0", "GPU-0-1", "GPU-1-0"}
    # a taint already there stays, even when a newer, stronger case arrives
    there = list(p.create)
    records = [rec(r.node, r.gpu, Health.UNHEALTHY, Remedy.RMA, since=-1) if r.gpu == "GPU-3-0" else r for r in records]
    again = plan(records, dict(p.conditions), devices, there, Policy(max_tainted_share=0.1))
    assert not [r for r in again.update if r.effect == NO_SCHEDULE]
    assert {h.gpu for h in again.held} == {h.gpu for h in p.held}


def test_one_sick_gpu_is_tainted_in_a_small_cluster_and_a_gpu_without_a_device_is_said() -> None:
    records = [rec("n0", "GPU-0-0", Health.UNHEALTHY, Remedy.RESET_GPU), rec("n0", "GPU-x", Health.UNHEALTHY)]
    p = plan(records, {"n0": None}, fleet(1, 2), [], Policy(max_tainted_share=0.1))
    assert [(r.gpu, r.effect) for r in p.create] == [("GPU-0-0", NO_SCHEDULE)]
    assert p.unplaced == (("n0", "GPU-x"),)


def test_nodes_the_cluster_lacks_are_named_and_only_our_rules_are_read() -> None:
    p = plan([rec("gone", "GPU-9", Health.UNHEALTHY)], {}, {}, [], Policy())
    assert p.absent_nodes == ("gone",) and p.conditions == ()
    assert rule_of({"metadata": {"name": "theirs", "labels": {"app": "x"}}, "spec": {}}) is None


def test_a_node_name_longer_than_a_label_is_in_step_after_its_first_round() -> None:
    node = "gpu-node-" + "a" * 70 + ".cluster.example"  # a label value holds 63 characters
    devices = {"GPU-0": DeviceRef(DRIVER, node, "gpu-0", node)}
    records = [rec(node, "GPU-0", Health.UNHEALTHY, Remedy.RESET_GPU)]
    first = plan(records, {node: None}, devices, [], Policy())
    found = [rule_of(r.manifest("hermeneut.io/gpu-health")) for r in first.create]
    assert found[0] is not None and len(found[0].node) == 63
    again = plan(records, dict(first.conditions), devices, [r for r in found if r], Policy())
    assert again.writes == 0


def test_rule_names_are_dns_subdomains() -> None:
    name = rule_name("Node_A.example", "GPU-ABC/1")
    assert name == "hermeneut-node-a.example-gpu-abc-1"
    assert len(rule_name("n" * 300, "GPU-1")) <= 253
