"""Escalation and correlation over the finding history: each rule at its count and not below, inside its window
and not outside, and what the fold shows once its reasons join the state of now."""

from __future__ import annotations

import dataclasses

from pipeline.config import HealthSettings
from pipeline.escalation import Episode, History, escalate
from pipeline.health.fold import FiringFinding, assess
from pipeline.health.states import Health, Remedy

H = 3600 * 10**9
NOW = 1_800_000_000 * 10**9
RULES = HealthSettings()


def xid(
    gpu: str, code: int, hours_ago: float, job: str | None = None, node: str = "n1", open_: bool = False
) -> Episode:
    severity = "warning" if code in (13, 31, 43) else "critical"
    return Episode("c", node, gpu, "xid", severity, NOW - int(hours_ago * H), job, frozenset({code}), open_)


def reasons(esc_gpus: dict[tuple[str, str, str], list], gpu: str, node: str = "n1") -> list[str]:
    return [r.detector for r in esc_gpus.get(("c", node, gpu), [])]


def test_five_fatal_errors_in_a_day_ask_for_an_rma_and_four_do_not() -> None:
    four = [xid("G0", 119, h) for h in (1, 3, 5, 7)]
    assert "repeated-fatal" not in reasons(escalate(four, NOW, RULES).gpus, "G0")
    five = [*four, xid("G0", 79, 9)]
    esc = escalate(five, NOW, RULES)
    [rma] = [r for r in esc.gpus[("c", "n1", "G0")] if r.detector == "repeated-fatal"]
    assert (rma.state, rma.remedy) == (Health.UNHEALTHY, Remedy.RMA)
    assert "5 fatal errors" in rma.summary and "XID 119" in rma.summary
    # the fifth a day and more ago is outside the window
    assert "repeated-fatal" not in reasons(escalate([*four, xid("G0", 79, 25)], NOW, RULES).gpus, "G0")
    # warnings are not fatal
    warnings = [xid("G0", 13, h) for h in range(1, 8)]
    assert "repeated-fatal" not in reasons(escalate(warnings, NOW, RULES).gpus, "G0")


def test_a_fault_back_after_two_resets_asks_for_inspection() -> None:
    twice = [xid("G1", 120, 30), xid("G1", 120, 60)]
    assert "recurring-fault" not in reasons(escalate(twice, NOW, RULES).gpus, "G1")
    thrice = [*twice, xid("G1", 120, 100)]
    [r] = escalate(thrice, NOW, RULES).gpus[("c", "n1", "G1")]
    assert (r.detector, r.remedy) == ("recurring-fault", Remedy.INSPECT)
    assert "came back 2 times" in r.summary
    # a week and more ago does not count
    assert not escalate([*twice, xid("G1", 120, 24 * 7 + 1)], NOW, RULES).gpus.get(("c", "n1", "G1"))
    # the application's XIDs ask for a restart of the job, not a reset: their recurrence is not a failed reset
    assert not escalate([xid("G1", 13, h) for h in (1, 2, 3)], NOW, RULES).gpus.get(("c", "n1", "G1"))


def test_five_remediations_on_one_node_make_it_a_lemon() -> None:
    spread = [xid("G8", 119, 10), xid("G8", 119, 50), xid("G9", 120, 20), xid("G9", 62, 70)]
    assert not escalate(spread, NOW, RULES).nodes.get(("c", "n1"))
    esc = escalate([*spread, xid("G10", 119, 90)], NOW, RULES)
    [lemon] = esc.nodes[("c", "n1")]
    assert (lemon.detector, lemon.remedy) == ("lemon-node", Remedy.INSPECT)
    assert "5 remediations" in lemon.summary and "on 3 of its GPUs" in lemon.summary
    assert not esc.gpus  # no GPU of it reached a rule of its own
    # the same five spread over two nodes: no lemon
    other = [*spread, xid("G10", 119, 90, node="n2")]
    assert not escalate(other, NOW, RULES).nodes


def test_the_xids_of_a_maintenance_window_count_for_no_rule_even_after_it_ends() -> None:
    """A firmware update: five GSP timeouts while the node is drained; the last one still firing when the drain
    ends (its later points carry no maintenance) is the same episode, and still not counted."""
    in_window = [dataclasses.replace(xid("G0", 119, h, open_=True), maintenance=True) for h in (1, 2, 3, 4, 5)]
    history = History(RULES, in_window)
    assert len(history) == 5 and history.episodes() == []
    after = dataclasses.replace(in_window[0], maintenance=False, open=False, seen_ns=NOW)
    assert history.add(after) is False and history.episodes() == []
    assert not history.escalate(NOW).gpus
    # the same five in service ask for an RMA
    assert "repeated-fatal" in reasons(History(RULES, [xid("G0", 119, h) for h in range(1, 6)]).escalate(NOW).gpus,
                                       "G0")  # fmt: skip


def test_an_application_xid_that_follows_one_gpu_across_jobs_is_the_gpus() -> None:
    history = [xid("G2", 31, 10, job="job-a"), xid("G2", 31, 2, job="job-b")]
    [r] = escalate(history, NOW, RULES).gpus[("c", "n1", "G2")]
    assert (r.detector, r.remedy) == ("xid-follows-gpu", Remedy.INSPECT)
    assert "job-a, job-b" in r.summary
    # one job only: nothing to correlate
    assert not escalate([*history[:1], xid("G2", 31, 2, job="job-a")], NOW, RULES).gpus
    # a different code in the second job: not the same error
    assert not escalate([history[0], xid("G2", 13, 2, job="job-b")], NOW, RULES).gpus


def test_an_application_xid_on_several_gpus_of_one_job_is_the_applications() -> None:
    history = [
        xid("G4", 13, 1, job="job-c", open_=True),
        xid("G5", 13, 1, job="job-c", open_=True),
        xid("G4", 13, 5, job="job-d"),  # G4 had it in another job too, but job-c shows it is the application
    ]
    esc = escalate(history, NOW, RULES)
    for gpu in ("G4", "G5"):
        assert reasons(esc.gpus, gpu) == ["xid-across-job"]
        [r] = esc.gpus[("c", "n1", gpu)]
        assert r.remedy is Remedy.RESTART_JOB and "on 2 GPUs of job job-c" in r.summary
    # resolved: nothing left to say about it
    closed = [Episode(**{**{f: getattr(e, f) for f in e.__slots__}, "open": False}) for e in history]
    assert not escalate(closed, NOW, RULES).gpus


def test_the_fold_shows_the_escalated_remedy_at_the_state_of_now() -> None:
    history = [xid("G1", 120, h) for h in (1, 30, 60)]
    firing = [FiringFinding({"cluster": "c", "node": "n1", "gpu": "G1", "detector": "xid", "severity": "critical"},
                            "XID 120", NOW, {"xid": 120.0})]  # fmt: skip
    fleet = [("c", "n1", "G1", NOW), ("c", "n1", "G2", NOW)]
    h = assess(firing, fleet, NOW, history=escalate(history, NOW, RULES))
    g1 = next(a for a in h.gpus if a.gpu == "G1")
    assert (g1.state, g1.remedy) == (Health.UNHEALTHY, Remedy.INSPECT)  # not "reset GPU": that did not help
    assert sorted(r.detector for r in g1.reasons) == ["recurring-fault", "xid"]
    # nothing fires now: degraded with the inspection still asked for
    quiet = assess([], fleet, NOW, history=escalate(history, NOW, RULES))
    g1 = next(a for a in quiet.gpus if a.gpu == "G1")
    assert (g1.state, g1.remedy) == (Health.DEGRADED, Remedy.INSPECT)
    assert next(a for a in quiet.gpus if a.gpu == "G2").state is Health.HEALTHY
    node = quiet.nodes[0]
    assert (node.state, node.remedy) == (Health.DEGRADED, Remedy.INSPECT)


def test_an_rma_gpu_is_unhealthy_even_when_quiet() -> None:
    history = [xid("G0", 119, h) for h in (1, 2, 3, 4, 5)]
    h = assess([], [("c", "n1", "G0", NOW)], NOW, history=escalate(history, NOW, RULES))
    assert (h.gpus[0].state, h.gpus[0].remedy) == (Health.UNHEALTHY, Remedy.RMA)
