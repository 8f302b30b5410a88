"""``hermeneut evaluate``: replay a seeded simulated fleet with injected faults through the real pipeline and score
the detectors (precision / recall / F1 per fault class, detection delay, false alarms per healthy GPU-day,
workload classification), plus the straggler check on the Alibaba PAI step times. Exits 1 when an acceptance
threshold is missed."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import click

from pipeline.face.cli.base import cli, errors, settings_of


@cli.command("evaluate")
@click.option("--nodes", default=16, show_default=True, type=click.IntRange(1))
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64), help="GPUs per node.")
@click.option("--hours", default=2.0, show_default=True, type=click.FloatRange(0.1, 48), help="Simulated history.")
@click.option("--seed", default=0, show_default=True)
@click.option("--faults-per-class", default=6.0, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Injected faults expected per class over the run (a balanced mix).")  # fmt: skip
@click.option("--withhold", default=0.25, show_default=True, type=click.FloatRange(0, 1),
              help="Share of nodes whose context is withheld (classification is measured there).")  # fmt: skip
@click.option("--grace", default=300.0, show_default=True, help="Seconds after a fault's end a detection still counts.")
@click.option("--learn-hours", default=0.5, show_default=True, type=click.FloatRange(0, 48),
              help="Labelled, fault-free history of another fleet seed the baselines and the classifier are learned "
              "from before the replay (0: none, nothing is inferred).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def evaluate_cmd(
    ctx: click.Context,
    nodes: int,
    gpus: int,
    hours: float,
    seed: int,
    faults_per_class: float,
    withhold: float,
    grace: float,
    learn_hours: float,
    as_json: bool,
) -> None:
    """Score the detectors on a simulated fleet with ground truth, through Kafka, the processor and InfluxDB."""
    from pipeline.face.evaljob import learning_producer, local_services, run_evaluation, simulator_producer
    from pipeline.face.evaluation import Thresholds, failures, format_table

    settings = settings_of(ctx)
    with errors():
        settings = local_services(settings)
    run_dir = settings.services.state_dir / "evaluations" / time.strftime("%Y%m%d-%H%M%S")
    click.echo(f"evaluating {nodes} nodes x {gpus} GPUs, {hours:g} h simulated, seed {seed} (logs in {run_dir})")
    produce = simulator_producer(nodes, gpus, hours, seed, faults_per_class)
    with errors():
        try:
            # another seed (never the replay's own data), and at least 16 nodes so most applications run in it
            learner = learning_producer(max(nodes, 16), gpus, learn_hours, seed + 1)
            learn_from = (learner, learn_hours * 3600) if learn_hours else None
            outcome = run_evaluation(
                settings, produce, Path(run_dir), seed, withhold, grace_s=grace, learn_from=learn_from
            )
        except RuntimeError as exc:
            click.echo(f"hermeneut: evaluation failed: {exc}", err=True)
            sys.exit(1)
    missed = failures(outcome.evaluation, Thresholds())
    pai_ok = bool(outcome.pai) and all(r.ok for r in outcome.pai)
    if not outcome.pai:
        missed.append("PAI straggler data not found")
    elif not pai_ok:
        missed.append("PAI stragglers: " + "; ".join(
            f"job {r.job}: flagged {sorted(r.flagged)}, labelled {sorted(r.expected)}" for r in outcome.pai if not r.ok
        ))  # fmt: skip
    if as_json:
        ev = outcome.evaluation
        click.echo(json.dumps({
            "classes": [asdict(c) | {"precision": c.precision, "recall": c.recall, "f1": c.f1,
                                     "delay_median_s": c.delay_median_s, "delay_p95_s": c.delay_p95_s}
                        for c in ev.classes],
            "false_alarms": ev.false_alarms, "healthy_gpu_days": ev.healthy_gpu_days,
            "false_alarms_per_gpu_day": ev.false_alarms_per_gpu_day, "other_findings": ev.other_episodes,
            "classification_accuracy": ev.classification.accuracy if ev.classification else None,
            "pai": [{"job": r.job, "flagged": sorted(r.flagged), "labelled": sorted(r.expected), "ok": r.ok}
                    for r in outcome.pai],
            "samples": outcome.samples, "stored": outcome.stored, "dead_lettered": outcome.dead_lettered,
            "failures": missed,
        }, indent=2))  # fmt: skip
    else:
        click.echo(format_table(outcome.evaluation))
        for r in outcome.pai:
            click.echo(
                f"PAI job {r.job}: stragglers flagged {sorted(r.flagged)}, labelled {sorted(r.expected)}: "
                f"{'ok' if r.ok else 'MISMATCH'}"
            )
        click.echo(
            f"{outcome.samples} samples, {outcome.stored} stored, {outcome.dead_lettered} dead-lettered, "
            f"{outcome.findings} finding records, {outcome.faults} faults injected, context withheld on "
            f"{len(outcome.withheld_nodes)} nodes"
        )
        click.echo("accepted" if not missed else "NOT accepted:\n  " + "\n  ".join(missed))
    if missed:
        sys.exit(1)
