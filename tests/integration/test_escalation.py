"""Escalation, correlation and fleet incidents on scripted fleets, through the real pipeline: samples and XIDs
into Kafka, the processor's detectors, the sink's findings in InfluxDB, the alert manager's firing alerts, and
``hermeneut health`` folding them with the stored history (pipeline/escalation.py) and the fleet's membership.

The escalation fleet: two nodes, 10 minutes of data time at 1 s (XID episodes close after 10 s without a new XID,
so each scripted XID is an episode of its own):
- n1/G0: a GSP XID (119, reset the GPU) five times: RMA;
- n1/G1: XID 120 three times, each after the reset it asked for: hardware inspection;
- n1/G2: XID 31 (the application's, by the catalogue) in job-a, then in job-b, on no other GPU of either: the GPU's;
- n1/G4, n1/G5: XID 13 on both GPUs of job-c, still firing at the end: the application's, restart the job;
- n2: six remediations spread over three GPUs, none reaching a GPU's rule: a lemon node (and n1 too: eight);
- n1/G3, G6, G7 and n2/G11: nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from alerting.admin import AlertAdmin, make_receiver, make_subscription
from hermeneut.cli import cli
from pipeline.codec import encode_record
from pipeline.config import Settings, settings_env
from pipeline.events import EventKind, GpuContext, GpuEvent, GpuSample, SampleBatch, Workload
from pipeline.publisher import Publisher
from pipeline.services.stages import wait_for
from pipeline.topology import NodeTopology, TopologyGpu
from sinks.query.fleet import finding_episodes
from sinks.query.store import Store
from sinks.retention import backfill, setup
from tests.fakes.readings import H100, busy_h100
from tests.integration.alerting_parts import (
    HttpReceiver,
    start_manager,
    storing_history,
    tail,
    wait_history,
    with_alerts,
)

from .harness import consume_all, publish_batches, running_pipeline, wait_settled, wait_stored

pytestmark = pytest.mark.integration

S = 1_000_000_000
SECONDS = 600
NODES = {"n1": [f"G{i}" for i in range(8)], "n2": [f"G{i}" for i in range(8, 12)]}
XIDS = {
    "G0": [(t, 119) for t in (30, 90, 150, 210, 270)],
    "G1": [(t, 120) for t in (60, 180, 300)],
    "G2": [(100, 31), (400, 31)],
    "G4": [(590, 13), (595, 13)],
    "G5": [(590, 13), (595, 13)],
    "G8": [(40, 119), (340, 119)],
    "G9": [(120, 62), (420, 62)],
    "G10": [(500, 120), (560, 120)],
}
#: (GPU, from second, job or None): job-a on G2+G3 until 300 s, then job-b on G2+G6; job-c on G4+G5 throughout
JOBS = [("G2", 0, "job-a"), ("G3", 0, "job-a"), ("G4", 0, "job-c"), ("G5", 0, "job-c"),
        ("G2", 300, "job-b"), ("G6", 300, "job-b"), ("G3", 300, None)]  # fmt: skip


def escalated(
    settings: Settings, want: set[str], more_than: int = 0
) -> tuple[dict[str, tuple[str, str, set[str]]], int]:
    """The health topic as a compacting consumer sees it: (state, remedy, reasons) of the last record per key of
    this test's cluster, and how many records of it there were, once every key in ``want`` is there and there are
    more than ``more_than`` (the topic also carries what the shared InfluxDB's history says of other tests'
    clusters)."""
    out: dict[str, tuple[str, str, set[str]]] = {}
    seen = [0]

    def read() -> bool:
        seen[0] = 0
        for m in consume_all(settings, settings.topics.health, 10**6, timeout_s=3):
            key = (m.key() or b"").decode()
            if key.startswith(f"{settings.cluster}/"):
                r = json.loads(m.value() or b"{}")
                out[key] = (r["state"], r["remedy"], {x["detector"] for x in r["reasons"]})
                seen[0] += 1
        return want <= out.keys() and seen[0] > more_than

    assert wait_for(read, 45), (want, sorted(out), seen[0], more_than)
    return out, seen[0]


def node_of(gpu: str) -> str:
    return next(n for n, gpus in NODES.items() if gpu in gpus)


def test_escalation_and_correlation_rules_on_a_scripted_fleet(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = with_alerts(settings).model_copy(
        update={"detectors": settings.detectors.model_copy(update={"storm_window_s": 10.0})}
    )
    c, start = settings.cluster, time.time_ns() - (SECONDS + 5) * S
    pub = Publisher(settings.kafka.client_config())
    for gpu, at, job in JOBS:
        wl = Workload("llm-pretraining", job, source="static", confidence=1.0, job_gpus=2) if job else None
        ctx = GpuContext(c, node_of(gpu), gpu, start + at * S, wl)
        pub.publish(settings.topics.context, ctx.kafka_key, encode_record(ctx))
    assert pub.close(30) == 0

    rng = np.random.default_rng(5)
    batches, samples = [], 0
    for t in range(SECONDS):
        ts = start + t * S
        for node, gpus in NODES.items():
            rows = tuple(GpuSample(c, node, g, i, H100, ts, busy_h100(rng)) for i, g in enumerate(gpus))
            events = tuple(
                GpuEvent(c, node, g, gpus.index(g), ts, EventKind.XID, code, f"Xid {code}")
                for g in gpus for at, code in XIDS.get(g, ()) if at == t
            )  # fmt: skip
            samples += len(rows)
            batches.append(SampleBatch(c, node, rows, events))

    manager = start_manager(settings, tmp_path / "alerts")
    try:
        with running_pipeline(settings, tmp_path) as (_processor, sink):
            publish_batches(settings, batches)
            wait_stored(sink, samples, timeout_s=240)
            episodes = sum(len(x) for x in XIDS.values()) - 2  # G4's and G5's two XIDs are one episode each
            assert wait_for(lambda: sink.stats().get("findings_written", 0) >= episodes, 60), sink.stats()
            # every episode's points stored (the health view reads the history) and consumed by the manager
            written = wait_settled(sink, "findings_written")
        assert wait_for(lambda: manager.stats().get("findings", 0) >= written, 30), (manager.stats(), tail(manager))
        assert wait_for(lambda: manager.stats().get("alerts_firing", 0) >= 2, 30), (manager.stats(), tail(manager))

        for name, value in settings_env(settings).items():
            monkeypatch.setenv(name, value)
        shown: dict[str, Any] = {}

        def health_now() -> bool:
            result = CliRunner().invoke(cli, ["health", "--cluster", c, "--format", "json"])
            assert result.exit_code == 0, result.output
            shown.update(json.loads(result.output))
            return any(g["gpu"] == "G2" for g in shown["gpus"])

        # G2's reason comes from the stored history alone (its XIDs ended long ago); the fresh-clone CI of 246a6ef
        # read the history without it right after the counts settled. Asked again for up to 30 s; the checks below
        # say what is still missing
        wait_for(health_now, 30)
        # the lemon-node rule in shadow mode: worked out and listed, but n2 (a lemon and nothing else) stays healthy
        monkeypatch.setenv("HERMENEUT_HEALTH__SHADOW", "lemon-node")
        result = CliRunner().invoke(cli, ["health", "--cluster", c, "--format", "json"])
        assert result.exit_code == 0, result.output
        shadowed = json.loads(result.output)
        shadow_text = CliRunner().invoke(cli, ["health", "--cluster", c]).output
        monkeypatch.setenv("HERMENEUT_HEALTH__SHADOW", "")
        # the job summaries of the run now (InfluxDB's task writes them every 10 minutes, in the bucket storage
        # setup makes)
        setup(settings, tasks=False)
        assert backfill(settings, [(start, start + SECONDS * S)]).jobs_spans
        result = CliRunner().invoke(cli, ["reliability", "--cluster", c, "--by", "node", "--format", "json"])
        assert result.exit_code == 0, result.output
        figures = {r["group"]: r for r in json.loads(result.output)["rows"]}
        lemons = {x["node"] for x in json.loads(result.output)["lemon_nodes"]}
        jobs = {j["job"]: j for j in json.loads(result.output)["jobs"]}
        # the health topic says the same (the manager keeps the history from the findings it consumes) ...
        keys = {f"{c}/n1/G{i}" for i in (0, 1, 2, 4, 5)} | {f"{c}/n1/-", f"{c}/n2/-"}
        topic, records = escalated(settings, keys)
        # ... and so does a manager killed and started again (it reads the stored history back from InfluxDB)
        manager.proc.kill()
        manager.proc.wait()
        manager = start_manager(settings, tmp_path / "again")
        again, _ = escalated(settings, keys, records + len(keys) - 1)  # every key published again
    finally:
        assert manager.stop(30) == 0, tail(manager)
    for key in (f"{c}/n1/G0", f"{c}/n1/G1", f"{c}/n1/G2", f"{c}/n1/G4", f"{c}/n1/G5", f"{c}/n2/-"):
        listed = (a for a in (*shown["gpus"], *shown["nodes"]) if key == f"{c}/{a['node']}/{a['gpu'] or '-'}")
        shown_as = next(listed, None)
        assert shown_as is not None, (key, shown)
        assert topic[key][:2] == again[key][:2] == (shown_as["state"], shown_as["remedy"]), (key, topic, again)
        assert topic[key][2] == again[key][2], key
    # a node's record on the topic is the node itself (its GPUs have records of their own): n1 is a lemon
    assert topic[f"{c}/n1/-"] == again[f"{c}/n1/-"] == ("degraded", "hardware inspection", {"lemon-node"})

    gpus = {g["gpu"]: g for g in shown["gpus"]}
    nodes = {n["node"]: n for n in shown["nodes"]}

    def why(gpu: str) -> set[str]:
        return {r["detector"] for r in gpus[gpu]["reasons"]}

    assert (gpus["G0"]["state"], gpus["G0"]["remedy"]) == ("unhealthy", "RMA"), gpus["G0"]
    assert "repeated-fatal" in why("G0")
    assert (gpus["G1"]["state"], gpus["G1"]["remedy"]) == ("degraded", "hardware inspection"), gpus["G1"]
    assert why("G1") == {"recurring-fault"}
    assert (gpus["G2"]["state"], gpus["G2"]["remedy"]) == ("degraded", "hardware inspection"), gpus["G2"]
    assert why("G2") == {"xid-follows-gpu"}
    for gpu in ("G4", "G5"):
        assert (gpus[gpu]["state"], gpus[gpu]["remedy"]) == ("degraded", "restart job"), gpus[gpu]
        assert why(gpu) == {"xid", "xid-across-job"}
        assert any("on 2 GPUs of job job-c" in r["summary"] for r in gpus[gpu]["reasons"])
    assert not set(NODES["n2"]) & set(gpus), shown["gpus"]  # two episodes each: no rule of a GPU's own
    assert (nodes["n2"]["state"], nodes["n2"]["remedy"]) == ("degraded", "hardware inspection"), nodes["n2"]
    assert any(r["detector"] == "lemon-node" and "6 remediations" in r["summary"] for r in nodes["n2"]["reasons"])
    assert (nodes["n1"]["state"], nodes["n1"]["remedy"]) == ("unhealthy", "RMA"), nodes["n1"]
    assert any(r["detector"] == "lemon-node" for r in nodes["n1"]["reasons"])
    states = {"healthy": 7, "degraded": 4, "unhealthy": 1, "unknown": 0, "maintenance": 0}
    assert shown["gpus_by_state"] == states, shown
    assert shown["shadow"] == []
    # in shadow mode the lemon rule changes nothing: n2 is healthy, n1 keeps its GPUs' worst; both are listed
    assert {n["node"] for n in shadowed["nodes"]} == {"n1"}, shadowed["nodes"]
    assert not any(r["detector"] == "lemon-node" for r in shadowed["nodes"][0]["reasons"])
    assert {(s["node"], s["rule"], s["state"], s["remedy"]) for s in shadowed["shadow"]} == {
        ("n1", "lemon-node", "degraded", "hardware inspection"),
        ("n2", "lemon-node", "degraded", "hardware inspection"),
    }, shadowed["shadow"]
    assert "shadow rule lemon-node would make node n2 degraded, remedy hardware inspection" in shadow_text
    # reliability from the same history: incidents (GPUs made unhealthy: the fatal XIDs), the application's XIDs as
    # degradations, every incident repaired (its finding cleared) 10 s after its XID at the median, lemon nodes
    n1, n2 = figures[f"{c}/n1"], figures[f"{c}/n2"]
    assert (n1["gpus"], n1["incidents"], n1["degradations"], n1["open_incidents"]) == (8, 8, 4, 0), n1
    assert (n2["gpus"], n2["incidents"], n2["degradations"], n2["open_incidents"]) == (4, 6, 0, 0), n2
    assert n1["repair_median_min"] == n2["repair_median_min"] == round(10 / 60, 3), (n1, n2)
    assert n1["gpu_hours"] == pytest.approx(8 * (SECONDS - 1) / 3600, abs=0.01)
    assert n1["mtbi_hours"] == pytest.approx(n1["gpu_hours"] / 8, abs=0.001)
    assert lemons == {"n1", "n2"}
    # effective time per job: job-a and job-b each lost their XID 31's 10 s; job-c's XID 13 on both its GPUs fires
    # from 590 s to the end; GPU-hours from the job summaries (2 GPUs x 300 s, 2 x 600 s; job-b's G6, whose only
    # context names job-b from 300 s on, carries it from its first sample: 900 GPU-seconds)
    assert set(jobs) == {"job-a", "job-b", "job-c"}, jobs
    for job, gpu_hours in (("job-a", 600 / 3600), ("job-b", 900 / 3600), ("job-c", 1200 / 3600)):
        assert jobs[job]["gpu_hours"] == pytest.approx(gpu_hours, abs=0.005), jobs[job]
    for job in ("job-a", "job-b"):
        assert [c["detector"] for c in jobs[job]["causes"]] == ["xid"], jobs[job]
        assert jobs[job]["lost_hours"] == pytest.approx(10 / 3600, abs=0.001), jobs[job]
    assert [c["detector"] for c in jobs["job-c"]["causes"]] == ["xid"], jobs["job-c"]
    assert jobs["job-c"]["lost_hours"] > jobs["job-a"]["lost_hours"] and jobs["job-c"]["effective"] < 1, jobs


OLD, NEW = "570.133.20", "580.65.06"


def _failing_fleet(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    topologies: list[NodeTopology],
    failing: set[str],
    firing: int,
    settle: Callable[[], None] = lambda: None,
) -> tuple[dict[str, Any], str]:
    """Two H100s per node of ``topologies`` (published in order: a later one of a node replaces the earlier), 300 s
    of samples; every GPU of the ``failing`` nodes fails with a GSP timeout within three seconds. ``hermeneut
    health`` once the manager fires ``firing`` alerts: its JSON and its text (``settle`` runs before the manager
    stops)."""
    c, start = settings.cluster, topologies[0].ts_ns
    pub = Publisher(settings.kafka.client_config())
    for topo in topologies:
        pub.publish(settings.topics.topology, topo.kafka_key, encode_record(topo))
    assert pub.close(30) == 0
    nodes = sorted({t.node for t in topologies}, key=lambda n: int(n[1:]))
    rng = np.random.default_rng(9)
    batches, samples = [], 0
    for t in range(300):
        ts = start + t * S
        for node in nodes:
            rows = tuple(GpuSample(c, node, f"{node}-G{i}", i, H100, ts, busy_h100(rng)) for i in range(2))
            events = tuple(
                GpuEvent(c, node, f"{node}-G{i}", i, ts, EventKind.XID, 119, "GSP RPC timeout")
                for i in range(2) if node in failing and t == 200 + (i + int(node[1:])) % 3
            )  # fmt: skip
            samples += len(rows)
            batches.append(SampleBatch(c, node, rows, events))
    manager = start_manager(settings, tmp_path / "alerts")
    try:
        with running_pipeline(settings, tmp_path) as (_processor, sink):
            publish_batches(settings, batches)
            wait_stored(sink, samples, timeout_s=240)
            written = wait_settled(sink, "findings_written")
        assert wait_for(lambda: manager.stats().get("findings", 0) >= written, 30), (manager.stats(), tail(manager))
        assert wait_for(lambda: manager.stats().get("alerts_firing", 0) >= firing, 30), (manager.stats(), tail(manager))
        for name, value in settings_env(settings).items():
            monkeypatch.setenv(name, value)
        result = CliRunner().invoke(cli, ["health", "--cluster", c, "--format", "json"])
        assert result.exit_code == 0, result.output
        text = CliRunner().invoke(cli, ["health", "--cluster", c]).output
        settle()
        return json.loads(result.output), text
    finally:
        assert manager.stop(30) == 0, tail(manager)


def _node(c: str, node: str, ts_ns: int, **facts: str) -> NodeTopology:
    gpus = tuple(TopologyGpu(f"{node}-G{i}", i, H100, f"0000:{i + 16:02x}:00.0") for i in range(2))
    return NodeTopology(c, node, ts_ns, gpus, **facts)


def test_a_driver_change_that_breaks_a_third_of_a_cluster_is_one_incident_with_no_per_gpu_advice(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten nodes of two H100s; four of them are upgraded to a new driver (their collectors publish the new
    topology) and then every GPU of those four fails with a GSP timeout within three seconds: 8 of 20 GPUs."""
    settings = with_alerts(settings)
    c, start = settings.cluster, time.time_ns() - 305 * S
    nodes = [f"n{i}" for i in range(10)]
    upgraded = set(nodes[:4])
    topologies = [_node(c, n, start, driver_version=OLD) for n in nodes]
    topologies += [_node(c, n, start, driver_version=NEW) for n in sorted(upgraded)]  # the upgrade replaces the old
    shown, text = _failing_fleet(settings, tmp_path, monkeypatch, topologies, upgraded, 8)

    [incident] = shown["incidents"]
    assert (incident["detector"], incident["gpus"], incident["of_gpus"]) == ("xid", 8, 20), incident
    assert incident["shared"]["driver_version"] == NEW, incident
    assert f"fleet incident: xid on 8 of 20 GPUs of {c} at once (shared: driver_version={NEW}" in text, text
    states = {"healthy": 12, "degraded": 0, "unhealthy": 8, "unknown": 0, "maintenance": 0}
    assert shown["gpus_by_state"] == states, shown
    assert {g["node"] for g in shown["gpus"]} == upgraded
    assert {g["remedy"] for g in shown["gpus"]} == {"none"}  # nobody resets 8 GPUs one by one
    assert {n["remedy"] for n in shown["nodes"]} == {"none"}, shown["nodes"]


def test_three_nodes_of_one_rack_failing_at_once_are_the_racks_incident(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sixteen nodes of two H100s in four racks of four (the collectors' config names rack and switch): three nodes
    of rack r1 fail at once, and one node of rack r2: 8 of 32 GPUs (25%, under the cluster's 30%). The rack's
    incident (6 of its 8 GPUs), no per-GPU remedy in r1, the usual one for r2's node."""
    settings = with_alerts(settings)
    c, start = settings.cluster, time.time_ns() - 305 * S
    nodes = [f"n{i}" for i in range(16)]
    topologies = [_node(c, n, start, rack=f"r{i // 4}", switch=f"leaf-{i // 4}") for i, n in enumerate(nodes)]
    shown, text = _failing_fleet(settings, tmp_path, monkeypatch, topologies, {"n4", "n5", "n6", "n9"}, 8)

    [incident] = shown["incidents"]
    # of the rack's 8 GPUs: its 4 nodes, by their topologies
    assert (incident["detector"], incident["gpus"], incident["of_gpus"]) == ("xid", 6, 8), incident
    assert (incident["shared"]["rack"], incident["shared"]["switch"]) == ("r1", "leaf-1"), incident
    assert "shared: rack=r1, switch=leaf-1" in text, text
    remedies = {g["node"]: g["remedy"] for g in shown["gpus"]}
    assert {remedies[n] for n in ("n4", "n5", "n6")} == {"none"}, shown["gpus"]
    assert remedies["n9"] == "reset GPU", shown["gpus"]


def test_a_drained_node_is_in_maintenance_its_faults_page_nobody_and_make_no_incident(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six nodes of two H100s; the Slurm drain of m1 (its collector's topology says so) is for a firmware update, and
    its GPUs throw GSP timeouts while it is worked on; m0's GPUs throw the same, in service. A webhook subscription
    takes every alert of these nodes: m0's page, m1's are held as maintenance; m1 is ``maintenance`` in ``hermeneut
    health``, m0 unhealthy; 2 of 12 GPUs failing in service is no fleet incident (4 of 12 would be, maintenance
    counted)."""
    settings = with_alerts(settings)
    c, start = settings.cluster, time.time_ns() - 305 * S
    drain = "slurm IDLE+DRAIN: firmware update [root@2026-11-25T09:00:00]"
    topologies = [_node(c, f"m{i}", start, maintenance=drain if i == 1 else "") for i in range(6)]
    receiver = HttpReceiver().start()
    admin = AlertAdmin(settings).start()
    sub = make_subscription("ops", "alice", ['node=~"m[0-5]"'], [make_receiver("webhook", receiver.url("/hook"))])
    admin.add(sub)
    told: list[str] = []

    def paged() -> bool:
        told[:] = sorted({a["labels"]["node"] for r in receiver.on("/hook") for a in r.json()["alerts"]})
        return bool(told)

    try:
        shown, text = _failing_fleet(settings, tmp_path, monkeypatch, topologies, {"m0", "m1"}, 4,
                                     settle=lambda: wait_for(paged, 30))  # fmt: skip
    finally:
        admin.remove_subscription(sub.id)
        admin.close()
        receiver.stop()

    states = {g["gpu"]: (g["state"], g["remedy"]) for g in shown["gpus"]}
    assert states == {"m0-G0": ("unhealthy", "reset GPU"), "m0-G1": ("unhealthy", "reset GPU"),
                      "m1-G0": ("maintenance", "none"), "m1-G1": ("maintenance", "none")}, shown["gpus"]  # fmt: skip
    m1 = next(g for g in shown["gpus"] if g["gpu"] == "m1-G0")
    assert [r["detector"] for r in m1["reasons"]] == ["maintenance", "xid"] and drain in m1["reasons"][0]["summary"]
    assert shown["gpus_by_state"]["maintenance"] == 2 and shown["nodes_by_state"]["maintenance"] == 1, shown
    assert shown["incidents"] == [], shown["incidents"]
    assert "node " + c + "/m1: maintenance, remedy: none" in text, text
    assert told == ["m0"], told  # the drained node paged nobody
    with storing_history(settings, tmp_path / "history"):  # the sink stores what the manager published
        rows = wait_history(settings, lambda r: any(x.outcome == "suppressed-maintenance" for x in r),
                            subscription=sub.id)  # fmt: skip
    held = {(r.outcome, r.dedup_key.split("/")[2]) for r in rows}
    assert ("suppressed-maintenance", "m1") in held and ("suppressed-maintenance", "m0") not in held, held
    # the stored findings say which began in the window: escalation and reliability leave those out
    with Store.from_settings(settings) as store:
        stored = finding_episodes(store, start, time.time_ns() + S, c)
    assert {(e.node, e.maintenance) for e in stored if e.detector == "xid"} == {("m0", False), ("m1", True)}, stored
    # reliability: m0's two incidents, each told to the webhook after its start; m1's none (the window's work)
    figures: dict[str, Any] = {}

    def reported() -> bool:
        result = CliRunner().invoke(cli, ["reliability", "--cluster", c, "--by", "node", "--format", "json"])
        assert result.exit_code == 0, result.output
        figures.update({r["group"]: r for r in json.loads(result.output)["rows"]})
        return figures.get(f"{c}/m0", {}).get("told") == 2

    assert wait_for(reported, 30), figures
    assert figures[f"{c}/m0"]["incidents"] == 2 and figures[f"{c}/m0"]["tell_median_s"] >= 0, figures
    assert (figures[f"{c}/m1"]["incidents"], figures[f"{c}/m1"]["told"]) == (0, 0), figures
