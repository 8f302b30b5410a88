"""``hermeneut evaluate``: score what hermeneut tells a user against the ground truth of a seeded simulated fleet.

Three modes (the first two scored by one set of rules, hermeneut/jobs/evaluation.py):

- through the real pipeline (default): a replay through Kafka, the processor, the sink and InfluxDB, with the
  straggler check on the Alibaba PAI step times;
- ``--offline``: thousands of GPU-days through the processor's interpretation code in this process (no Kafka, no
  InfluxDB; labelled "offline" in everything it prints), over several seeds, day one and after learning.
- ``--overlay TRACE --mapping MAPPING.toml``: faults laid over a real healthy trace, sampled every 1/10/30/60 s,
  through the import path's steps and the same interpretation code (labelled "offline, overlay";
  hermeneut/jobs/overlay.py and overlayeval.py).

Exits 1 when an acceptance threshold is missed.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from tqdm import tqdm

from hermeneut.cli.base import cli, errors, fail, settings_of

if TYPE_CHECKING:
    from hermeneut.jobs.fleeteval import FleetPlan, Outcome


@cli.command("evaluate")
@click.option("--offline", is_flag=True, help="Fleet scale, in this process (no Kafka, no InfluxDB), over --seeds.")
@click.option("--nodes", default=None, type=click.IntRange(1), help="Nodes (default 16; offline 64).")
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64), help="GPUs per node.")
@click.option(
    "--hours", default=2.0, show_default=True, type=click.FloatRange(0.1, 48), help="Simulated history (through Kafka)."
)
@click.option("--seed", default=0, show_default=True, help="Seed (through Kafka; overlay: the faults' draws).")
@click.option(
    "--faults-per-class",
    default=6.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Injected faults per class (offline: the quota per seed).",
)
@click.option(
    "--withhold",
    default=0.25,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Share of nodes whose context is withheld (classification is measured there).",
)
@click.option(
    "--learn-hours",
    default=None,
    type=click.FloatRange(0, 48),
    help="Labelled, fault-free history learned from first (default 0.5; offline: day one, 3).",
)
@click.option(
    "--seeds",
    default="4242,5353,6464,7575,8686",
    show_default=True,
    help="Offline: comma-separated seeds, one fleet each.",
)
@click.option(
    "--gpu-days",
    default=1000.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Offline: GPU-days judged after learning, per seed.",
)
@click.option(
    "--interval",
    default=10.0,
    show_default=True,
    type=click.FloatRange(1, 60),
    help="Offline: seconds between samples.",
)
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(1, 8), help="Offline: seeds run at once.")
@click.option(
    "--learn-from",
    type=click.Choice(["own", "other"]),
    default="own",
    show_default=True,
    help="Offline: learn on the judged fleet's own day one, or on another seed's fleet (its own GPU models, "
    "application mix and jobs).",
)
@click.option(
    "--findings",
    type=click.Path(file_okay=False, writable=True, path_type=Path),
    default=None,
    help="Offline: write every finding and the ground truth of each seed to DIR/seed-N.jsonl.",
)
@click.option(
    "--overlay",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Lay faults over this real healthy trace (any table 'import table' reads).",
)
@click.option(
    "--mapping",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Overlay: the trace's mapping file (as for 'hermeneut import table').",
)
@click.option(
    "--intervals", default="1,10,30,60", show_default=True, help="Overlay: comma-separated sampling intervals (s)."
)
@click.option(
    "--learning",
    default="day-one,learned",
    show_default=True,
    help="Overlay: day-one (nothing learned), learned (from the untouched trace's first half).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def evaluate_cmd(
    ctx: click.Context,
    offline: bool,
    nodes: int | None,
    gpus: int,
    hours: float,
    seed: int,
    faults_per_class: float,
    withhold: float,
    learn_hours: float | None,
    seeds: str,
    gpu_days: float,
    interval: float,
    jobs: int,
    learn_from: str,
    findings: Path | None,
    overlay: Path | None,
    mapping: Path | None,
    intervals: str,
    learning: str,
    as_json: bool,
) -> None:
    """Score the detectors on a simulated fleet with ground truth, or on faults laid over a real trace (--overlay)."""
    if overlay is not None or mapping is not None:
        if overlay is None or mapping is None:
            raise click.UsageError("--overlay and --mapping go together")
        _overlay(overlay, mapping, _numbers(intervals, "--intervals"), _ways(learning), seed, as_json)
    elif offline:
        try:
            seed_list = [int(x) for x in seeds.split(",") if x.strip()]
        except ValueError:
            raise click.BadParameter(f"{seeds!r} is not a list of integers", param_hint="--seeds") from None
        _offline(
            nodes or 64,
            gpus,
            seed_list,
            gpu_days,
            interval,
            3.0 if learn_hours is None else learn_hours,
            max(1, round(faults_per_class)),
            withhold,
            jobs,
            as_json,
            findings,
            learn_from == "other",
        )
    else:
        _through_kafka(
            ctx,
            nodes or 16,
            gpus,
            hours,
            seed,
            faults_per_class,
            withhold,
            0.5 if learn_hours is None else learn_hours,
            as_json,
        )


def _numbers(text: str, hint: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a list of numbers", param_hint=hint) from None
    if not values or any(v <= 0 for v in values):
        raise click.BadParameter(f"{text!r}: give positive numbers", param_hint=hint)
    return values


def _ways(text: str) -> list[str]:
    from hermeneut.jobs.overlayeval import LEARNING

    ways = [x.strip() for x in text.split(",") if x.strip()]
    if not ways or any(w not in LEARNING for w in ways):
        raise click.BadParameter(f"{text!r}: choose from {', '.join(LEARNING)}", param_hint="--learning")
    return ways


def _overlay(
    trace_path: Path, mapping: Path, intervals: list[float], ways: list[str], seed: int, as_json: bool
) -> None:
    from hermeneut.jobs.overlay import read_trace
    from hermeneut.jobs.overlayeval import evaluate, format_result, to_json

    with errors():
        try:
            trace = read_trace(trace_path, mapping)
        except ValueError as exc:
            fail(str(exc), 2)
    click.echo(
        f"offline, overlay (faults laid over a real trace, the interpretation code in this process, no Kafka or "
        f"InfluxDB): {trace.label}, {len(trace.gpus)} GPUs, {len(trace.rows):,} rows every "
        f"{trace.median_interval_s():.2g} s, columns {', '.join(sorted(trace.columns))}; sampled every "
        f"{', '.join(f'{i:g}' for i in intervals)} s; judged {' and '.join(ways)}",
        err=as_json,
    )
    started = time.monotonic()
    bar = tqdm(desc="overlay runs", unit=" run", mininterval=1.0)

    def total(n: int) -> None:
        bar.total = n
        bar.refresh()

    results = evaluate(trace, intervals, ways, seed=seed, progress=bar.update, on_total=total)
    bar.close()
    missed = [m for r in results for m in r.failures()]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "mode": "offline, overlay",
                    "trace": str(trace_path),
                    "mapping": str(mapping),
                    "seconds": time.monotonic() - started,
                    "results": [to_json(r) for r in results],
                    "failures": missed,
                },
                indent=2,
            )
        )
    else:
        for r in results:
            click.echo("\n" + format_result(r, trace))
        click.echo(f"\n{time.monotonic() - started:.0f} s")
        click.echo("accepted" if not missed else "NOT accepted:\n  " + "\n  ".join(missed))
    if missed:
        sys.exit(1)


def _run_one(plan: FleetPlan, progress: bool, findings: Path | None = None) -> Outcome:
    from hermeneut.jobs.fleeteval import run, write_findings

    outcome = run(plan, progress=progress)
    if findings is not None:
        write_findings(outcome, findings / f"seed-{plan.seed}.jsonl")
    outcome.findings, outcome.truth = [], []  # not needed by the report, and large to send between processes
    return outcome


def _offline(
    nodes: int,
    gpus: int,
    seeds: list[int],
    gpu_days: float,
    interval: float,
    learn_hours: float,
    per_class: int,
    withhold: float,
    jobs: int,
    as_json: bool,
    findings: Path | None = None,
    elsewhere: bool = False,
) -> None:
    from hermeneut.jobs.evalreport import format_table, to_json
    from hermeneut.jobs.evaluation import Thresholds, failures
    from hermeneut.jobs.fleeteval import LEARN_SEED, FleetPlan, combined, in_workers, seed_line

    hours = gpu_days * 24.0 / (nodes * gpus)
    if findings is not None:
        findings.mkdir(parents=True, exist_ok=True)
    plans = [FleetPlan(s, nodes, gpus, hours, interval, learn_hours, per_class, withhold) for s in seeds]
    if elsewhere:
        plans = [dataclasses.replace(p, learn_seed=p.seed + LEARN_SEED) for p in plans]
    click.echo(
        f"offline evaluation (the interpretation code in this process, no Kafka or InfluxDB): {len(seeds)} seed(s), "
        f"{nodes} nodes x {gpus} GPUs, {learn_hours:g} h day one + {hours:.1f} h after learning "
        f"({gpu_days:g} GPU-days) at {interval:g} s, {per_class} faults per class"
        + (f", baselines learned on another fleet (seed + {LEARN_SEED:,})" if elsewhere else ""),
        err=as_json,
    )
    started = time.monotonic()
    with errors():  # SIGINT/SIGTERM stop every worker at once, nothing scored (exit 130/143)
        outcomes = in_workers(_run_one, [(p, jobs == 1, findings) for p in plans], jobs)
    day_one, after = combined(outcomes)
    missed = failures(after, Thresholds())
    day_one_missed = [m for m in failures(day_one, Thresholds()) if "false alarms" in m]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "mode": "offline",
                    "seeds": seeds,
                    "nodes": nodes,
                    "gpus": gpus,
                    "hours_after_learning": hours,
                    "day_one_hours": learn_hours,
                    "learned_on": "other" if elsewhere else "own",
                    "interval_s": interval,
                    "per_class": per_class,
                    "samples": sum(o.samples for o in outcomes),
                    "dead_lettered": sum(o.dead_lettered for o in outcomes),
                    "seconds": time.monotonic() - started,
                    "day_one": to_json(day_one),
                    "after_learning": to_json(after),
                    "per_seed": [{"seed": o.plan.seed, "after_learning": to_json(o.after)} for o in outcomes],
                    "failures": missed + [f"day one: {m}" for m in day_one_missed],
                },
                indent=2,
            )
        )
    else:
        for o in outcomes:
            click.echo(seed_line(o))
        click.echo("\n## Day one (healthy, no learned baselines)\n")
        click.echo(format_table(day_one))
        click.echo("\n## After learning (faults injected)\n")
        click.echo(format_table(after))
        click.echo(f"\n{time.monotonic() - started:.0f} s")
        missed += [f"day one: {m}" for m in day_one_missed]
        click.echo("accepted" if not missed else "NOT accepted:\n  " + "\n  ".join(missed))
    if missed:
        sys.exit(1)


def _through_kafka(
    ctx: click.Context,
    nodes: int,
    gpus: int,
    hours: float,
    seed: int,
    faults_per_class: float,
    withhold: float,
    learn_hours: float,
    as_json: bool,
) -> None:
    from hermeneut.jobs.evaljob import learning_producer, local_services, run_evaluation, simulator_producer
    from hermeneut.jobs.evalreport import format_table, to_json
    from hermeneut.jobs.evaluation import Thresholds, failures

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
            outcome = run_evaluation(settings, produce, Path(run_dir), seed, withhold, learn_from=learn_from)
        except RuntimeError as exc:
            click.echo(f"hermeneut: evaluation failed: {exc}", err=True)
            sys.exit(1)
    missed = failures(outcome.evaluation, Thresholds())
    pai_ok = bool(outcome.pai) and all(r.ok for r in outcome.pai)
    if not outcome.pai:
        missed.append("PAI straggler data not found")
    elif not pai_ok:
        missed.append(
            "PAI stragglers: "
            + "; ".join(
                f"job {r.job}: flagged {sorted(r.flagged)}, labelled {sorted(r.expected)}"
                for r in outcome.pai
                if not r.ok
            )
        )
    if as_json:
        click.echo(
            json.dumps(
                to_json(outcome.evaluation)
                | {
                    "mode": "through kafka",
                    "pai": [
                        {"job": r.job, "flagged": sorted(r.flagged), "labelled": sorted(r.expected), "ok": r.ok}
                        for r in outcome.pai
                    ],
                    "samples": outcome.samples,
                    "stored": outcome.stored,
                    "dead_lettered": outcome.dead_lettered,
                    "failures": missed,
                },
                indent=2,
            )
        )
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
