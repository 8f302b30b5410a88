"""An evaluation (hermeneut/jobs/evaluation.py) as plain data (``--json``) and as the Markdown tables
docs/results.md holds."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from hermeneut.jobs.evaluation import PAGING, Evaluation, Thresholds, number


def to_json(ev: Evaluation) -> dict[str, Any]:
    """An evaluation as plain data (the CLI's ``--json``)."""
    return {
        "classes": [
            asdict(c)
            | {
                "precision": c.precision,
                "recall": c.recall,
                "f1": c.f1,
                "delay_median_s": c.delay_median_s,
                "delay_p95_s": c.delay_p95_s,
                "alerts_mean": c.alerts_mean,
            }
            for c in ev.classes
        ],
        "false_alarms": [
            {"kind": kind, "severity": sev.value, "episodes": n} for (kind, sev), n in sorted(ev.false_alarms.items())
        ],
        "healthy_gpu_days": ev.healthy_gpu_days,
        "paging_false_alarms_per_gpu_day": ev.false_alarm_rate(severities=PAGING),
        "false_alarms_per_gpu_day": ev.false_alarm_rate(),
        "classification_accuracy": ev.classification.accuracy if ev.classification else None,
        "unplaced": ev.unplaced,
        "health": [
            {
                "fault": h.fault,
                "expected": h.expected.value,
                "faults": h.faults,
                "reached": len(h.delays_s),
                "delay_median_s": h.delay_median_s,
                "delays_s": list(h.delays_s),
            }
            for h in ev.health
        ],
        "false_unhealthy": ev.false_unhealthy,
    }


def format_table(ev: Evaluation) -> str:
    """The evaluation as Markdown (it goes into the README as it is): per class, then false alarms per kind."""
    lines = [
        "| finding kind | faults | excluded (tail) | detected | episodes | precision | recall | F1 | "
        "alerts per fault | delay median (s) | delay p95 (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in ev.classes:
        if not (c.faults or c.episodes or c.excluded):
            continue
        lines.append(
            f"| {c.fault} | {c.faults} | {c.excluded} | {c.detected} | {c.episodes} | {number(c.precision)} | "
            f"{number(c.recall)} | {number(c.f1)} | {number(c.alerts_mean)} | {number(c.delay_median_s, '.0f')} | "
            f"{number(c.delay_p95_s, '.0f')} |"
        )
    graded = [c for c in ev.classes if c.bands and c.faults]
    if graded:
        lines += ["", "| graded class | magnitude band | faults | detected | recall |", "|---|---|---:|---:|---:|"]
        for c in graded:
            for lo, hi, n, d in c.bands:
                lines.append(f"| {c.fault} | {lo:g}-{hi:g} | {n} | {d} | {number(d / n if n else None)} |")
    days = ev.healthy_gpu_days
    lines += [
        "",
        f"Healthy GPU-days: {days:.1f}",
        "",
        "| false alarms: finding kind | severity | episodes | per healthy GPU-day |",
        "|---|---|---:|---:|",
    ]
    for (kind, sev), n in sorted(ev.false_alarms.items(), key=lambda kv: (-kv[1], kv[0][0])):
        lines.append(f"| {kind} | {sev.value} | {n} | {number(n / days if days else None, '.4f')} |")
    lines.append(
        f"| **paging (critical + warning)** | | {ev.paging_false_alarms} | "
        f"{number(ev.false_alarm_rate(severities=PAGING), '.4f')} |"
    )
    if ev.health:
        limit = Thresholds().health_delay_s
        lines += [
            "",
            f"| hard fault class | state it must give | faults | reached | within {limit:g} s | delay median (s) |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for h in ev.health:
            lines.append(
                f"| {h.fault} | {h.expected.value} | {h.faults} | {len(h.delays_s)} | {h.in_time(limit)} | "
                f"{number(h.delay_median_s, '.0f')} |"
            )
        rate = ev.false_unhealthy / days if days else None
        lines += [
            "",
            f"Healthy GPUs called unhealthy: {ev.false_unhealthy} ({number(rate, '.4f')} per healthy GPU-day)",
        ]
    if ev.unplaced and any(ev.unplaced.values()):
        lines.append("")
        lines.append("Injections never placed: " + ", ".join(f"{k} {v}" for k, v in sorted(ev.unplaced.items()) if v))
    if ev.classification is not None:
        cl = ev.classification
        lines.append("")
        lines.append(f"Workload classification (context withheld): {number(cl.accuracy, '.3f')} over {cl.rows} rows")
    return "\n".join(lines)
