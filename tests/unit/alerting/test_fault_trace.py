"""348 days of real GPU faults (StepFun InfiniteHBD trace, 158 faults on an LLM-training cluster) replayed as
findings through the alert engine: every fault pages its subscribers once and gets exactly one all-clear, a
severity filter sees only its faults, and nothing is lost or doubled when faults recur on the same server."""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import replace

from alerting.admin import make_receiver, make_subscription
from alerting.engine import AlertEngine
from alerting.inhibit import parse_inhibit_rules
from alerting.model import AlertStatus
from pipeline.events import Finding, Severity
from tests import TESTDATA
from tests.unit.alerting.helpers import S, settings

TRACE = TESTDATA / "stepfun-fault-trace" / "gpu_fault_events.csv"
DAY_S = 86_400

#: the trace's descriptions mapped onto the detectors that would report them
DETECTOR = {
    "GPU DBE(Double Bit ECC) > Threshold": ("ecc-uncorrectable", Severity.CRITICAL),
    "Silent Data Corruption": ("ecc-uncorrectable", Severity.CRITICAL),
    "GPU Lost": ("fallen-off-bus", Severity.CRITICAL),
    "GPU device not found": ("fallen-off-bus", Severity.CRITICAL),
    "GPU device unknow error": ("xid", Severity.CRITICAL),
    "nvidia-smi Timeout": ("xid", Severity.WARNING),
    "GPU xid Error": ("xid", Severity.WARNING),
    "GPU PCI link width low": ("pcie-link-degraded", Severity.WARNING),
    "GPU P2P Bandwidth Low": ("nvlink-down", Severity.WARNING),
    "GPU Temperature High": ("thermal-throttling", Severity.WARNING),
    "GPU SBE(Single Bit ECC) > Threshold": ("row-remap", Severity.INFO),
}


REPEAT_S = 6 * 3600


def _findings() -> list[Finding]:
    """The trace as findings, with a repeat every 6 h while a fault lasts (detectors repeat every 60 s; 6 h
    with a one-day staleness limit keeps the replay small and shows the same thing)."""
    with TRACE.open() as f:
        rows = sorted(csv.DictReader(f), key=lambda r: (float(r["event_time"]), r["event_type"] == "fault_start"))
    events: list[Finding] = []
    started: dict[str, Finding] = {}
    last_ts = 0
    for r in rows:
        detector, severity = DETECTOR[r["Desc"]]
        # the trace has 1e-4 day resolution; keep events of the same instant in order (ends first)
        ts = max(int(float(r["event_time"]) * DAY_S * S), last_ts + 1_000_000)
        last_ts = ts
        active = r["event_type"] == "fault_start"
        f = Finding(detector, severity, active, "stepfun", r["node_id"][:13], None, "", ts, ts, r["Desc"])
        if active:
            started[f.dedup_key] = f
        else:
            begin = started.pop(f.dedup_key)
            repeat = begin.ts_ns + REPEAT_S * S
            while repeat < ts:
                events.append(replace(begin, ts_ns=repeat))
                repeat += REPEAT_S * S
        events.append(f)
    return sorted(events, key=lambda f: f.ts_ns)


def test_every_real_fault_pages_once_and_clears_once() -> None:
    findings = _findings()
    everyone = make_subscription("all", "ops", [], [make_receiver("kafka", "x")], group_by=["..."], now_ns=0)
    critical = make_subscription(
        "crit", "oncall", ['severity="critical"'], [make_receiver("kafka", "y")], group_by=["..."], now_ns=0
    )
    cfg = settings(stale_after_s=DAY_S, group_wait_s=30, group_interval_s=300)
    engine = AlertEngine(cfg, parse_inhibit_rules(""))
    engine.configure([everyone, critical], [], [])
    told: dict[str, list[tuple[str, str]]] = {everyone.id: [], critical.id: []}
    for f in findings:
        engine.apply(f)
        for t in (f.ts_ns, f.ts_ns + 31 * S):  # right away, and once group_wait has passed
            for sub, note in engine.step(t).notifications:
                if note.reason != "repeat":  # repeats of long faults (repeat_interval) are not new pages
                    told[sub.id] += [(a.dedup_key, a.status.value) for a in note.alerts]
    assert not engine.step(findings[-1].ts_ns + 2 * DAY_S * S).notifications
    starts = Counter(f.dedup_key for f in findings if f.active and f.since_ns == f.ts_ns)
    assert sum(starts.values()) == 158
    per_key: dict[str, list[str]] = {}
    for key, status in told[everyone.id]:
        per_key.setdefault(key, []).append(status)
    assert set(per_key) == set(starts)
    for key, statuses in per_key.items():
        assert statuses == ["firing", "resolved"] * (len(statuses) // 2), key  # strictly alternating, each cleared
    paged = sum(len(s) // 2 for s in per_key.values())
    assert paged == 158, paged
    critical_keys = {f.dedup_key for f in findings if f.severity is Severity.CRITICAL}
    assert {k for k, _ in told[critical.id]} <= critical_keys
    assert sum(s == "firing" for _, s in told[critical.id]) == sum(
        len(v) // 2 for k, v in per_key.items() if k in critical_keys
    )
    assert all(a.status is AlertStatus.RESOLVED for a in engine.alerts.values())
