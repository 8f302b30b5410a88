"""The offline fleet evaluation (hermeneut/jobs/fleeteval.py, ``hermeneut evaluate --offline``) end to end on a small
fleet: day one without faults or baselines, learning from it, then faults by quota scored by the honest rules
(hermeneut/jobs/evaluation.py, tested on their own in test_evaluation.py). What a run must never do is lose a sample
without a reason, score a fault before learning, hide an injection it could not place, or miss a hard event that the
live processor finds at once."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from tqdm import tqdm

from hermeneut.jobs.fleeteval import LEARN_SEED, FleetPlan, Outcome, _learn_elsewhere, run, seed_line, write_findings
from pipeline.config import Settings
from pipeline.events import Severity
from pipeline.kinds import BY_NAME, FAULTS
from producers.simulator import Fleet

PLAN = FleetPlan(3, nodes=4, gpus=2, hours=3.0, interval_s=10.0, learn_hours=0.5, per_class=1)
#: hard events: found at the sample that shows them, whatever the fleet
HARD = ("ecc-uncorrectable", "fallen-off-bus", "xid-storm", "row-remap")


@pytest.fixture(scope="module")
def outcome() -> Outcome:
    return run(PLAN, progress=False)


def test_every_sample_is_interpreted_and_baselines_are_learned_from_day_one(outcome: Outcome) -> None:
    rounds = round((PLAN.learn_hours + PLAN.hours) * 3600 / PLAN.interval_s)
    assert outcome.dead_lettered == 0
    # a GPU fallen off the bus sends nothing while it is gone: every other sample of every round was interpreted
    gone = [t for t in outcome.truth if t.fault == "fallen-off-bus"]
    # gone from the round at its start to the last round before its end (which need not fall on a round)
    silent = sum(math.ceil((t.end_ns - t.start_ns) / 1e9 / PLAN.interval_s) for t in gone)
    assert gone and rounds * PLAN.nodes * PLAN.gpus - outcome.samples == silent
    assert outcome.baselines > 0
    assert outcome.day_one.healthy_gpu_days > 0 and outcome.after.healthy_gpu_days > 0


def test_faults_come_after_learning_and_each_class_is_placed_or_reported(outcome: Outcome) -> None:
    assert all(c.faults == 0 for c in outcome.day_one.classes if c.fault in FAULTS)
    placed = {c.fault: c.faults + c.excluded for c in outcome.after.classes if c.fault in FAULTS}
    for fault in FAULTS:
        assert placed[fault] + outcome.after.unplaced.get(fault, 0) == PLAN.per_class, fault
    assert 0 < sum(outcome.after.unplaced.values()) < len(FAULTS) / 2  # 8 GPUs cannot host every class, but most


def test_hard_events_are_found_at_once(outcome: Outcome) -> None:
    """Each hard fault's GPU takes its state within 5 s; its own finding comes at once, but a storm's, which needs
    ``storm_count`` XIDs (its first XID's ``xid`` finding is what gives the state at once)."""
    for fault in HARD:
        c = outcome.after.by_class(fault)
        assert c is not None and c.faults == PLAN.per_class, fault
        assert c.detected == c.faults, (fault, c)
        assert c.delay_median_s == 0.0 if fault != "xid-storm" else c.delay_median_s > 0.0, (fault, c)
    for h in outcome.after.health:
        assert h.in_time(5.0) == h.faults, h


def test_the_seed_line_names_its_own_paging_false_alarms(outcome: Outcome) -> None:
    pages = (Severity.CRITICAL, Severity.WARNING)
    paging = sum(n for (_, sev), n in outcome.after.false_alarms.items() if sev in pages)
    line = seed_line(outcome)
    assert line.startswith(f"seed 3: {outcome.samples:,} samples (0 dead-lettered)")
    assert f"after learning {paging} paging false alarm(s) in {outcome.after.healthy_gpu_days:.1f}" in line


def test_every_finding_and_fault_of_a_run_can_be_read_back_one_by_one(outcome: Outcome, tmp_path: Path) -> None:
    """``--findings DIR``: what the report counts, line by line, so a miss or a false alarm can be traced."""
    path = tmp_path / "seed-3.jsonl"
    assert write_findings(outcome, path) == len(outcome.truth) + len(outcome.findings) > 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    truth = [line["truth"] for line in lines if "truth" in line]
    found = [line["finding"] for line in lines if "finding" in line]
    assert [(t["fault"], t["start_ns"]) for t in truth] == [(t.fault, t.start_ns) for t in outcome.truth]
    assert [(f["detector"], f["ts_ns"], f["severity"]) for f in found] == [
        (f.detector, f.ts_ns, str(f.severity)) for f in outcome.findings
    ]


def test_every_finding_of_the_run_is_a_kind_of_the_table(outcome: Outcome) -> None:
    assert outcome.findings and {f.detector for f in outcome.findings} <= set(BY_NAME)


def test_baselines_learned_on_another_fleet_come_from_its_gpus_never_the_judged_ones() -> None:
    """``learn_seed`` (``--learn-from other``): the rows the baselines are fitted from are another seed's fleet's
    (its own GPUs, node kinds and jobs), in the judged fleet's cluster; none is a judged GPU's."""
    other = PLAN.seed + LEARN_SEED
    plan = dataclasses.replace(PLAN, learn_seed=other)
    learned = _learn_elsewhere(plan, other, "offline-3", Settings(), 60, tqdm(disable=True))
    judged = set(Fleet(plan.nodes, plan.gpus, "offline-3", plan.seed, mix="seeded").uuids)
    theirs = set(Fleet(plan.nodes, plan.gpus, "offline-3", other, mix="seeded").uuids)
    gpus = {g for chunks in learned.values() for c in chunks for g in c[2].tolist()}
    assert gpus and gpus <= theirs and not gpus & judged
    short = run(dataclasses.replace(plan, hours=0.2, learn_hours=0.2), progress=False)
    assert short.baselines > 0 and f"baselines learned on seed {other}'s fleet" in seed_line(short)
    # the judged fleet is the same either way: its classification counts the same rows, those after learning
    own = run(dataclasses.replace(PLAN, hours=0.2, learn_hours=0.2), progress=False)
    assert short.withheld_nodes and own.after.classification is not None and short.after.classification is not None
    assert short.after.classification.rows == own.after.classification.rows > 0
