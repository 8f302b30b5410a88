"""Query commands: ``trend``, ``top``, ``compare``, ``anomalies``, ``jobs`` (read back from InfluxDB through
the query layer) and ``storage setup|status|rollup|backfill`` (retention and downsampling). Output as an aligned
table, JSON or CSV (``--format``); a malformed question is one line on stderr and exit code 1, before anything is
queried."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

from hermeneut.cli.base import cli, errors, resolved
from pipeline.vocab import IDLE_UTIL_PERCENT

if TYPE_CHECKING:
    from sinks.query import Scope, Store, Table
    from sinks.retention import BackfillReport

F = TypeVar("F", bound=Callable[..., Any])

FN_HELP = "mean, max, min, median, count, sum, p50, p90, p95, p99 or stddev."


def scope_options(f: F) -> F:
    """--cluster --node --gpu --job --application --gpu-model: which GPUs a question is about."""
    for name, what in reversed(
        (
            ("--cluster", "only this cluster"),
            ("--node", "only this node"),
            ("--gpu", "only this GPU (uuid)"),
            ("--job", "only samples of this job id"),
            ("--application", "only this application class"),
            ("--gpu-model", "only this GPU model (e.g. 'NVIDIA H100 80GB HBM3')"),
        )
    ):
        f = click.option(name, default=None, help=what.capitalize() + ".")(f)
    return f


def time_options(default_range: str) -> Callable[[F], F]:
    def wrap(f: F) -> F:
        f = click.option("--stop", default=None, help="End of the range (RFC 3339; default now).")(f)
        f = click.option("--start", default=None, help="Start of the range (RFC 3339) instead of --range.")(f)
        return click.option(
            "--range",
            "range_",
            default=None,
            help=f"How far back from --stop (e.g. 15m, 6h, 30d) [default: {default_range}].",
        )(f)

    return wrap


def output_options(f: F) -> F:
    f = click.option(
        "--backend",
        default="auto",
        show_default=True,
        type=click.Choice(["auto", "flux", "influxql"]),
        help="Query language; auto picks per query (docs/queries.md).",
    )(f)
    return click.option(
        "--format", "fmt", default="table", show_default=True, type=click.Choice(["table", "json", "csv"])
    )(f)


def _scope(kw: dict[str, Any]) -> Scope:
    from sinks.query import Scope

    return Scope(**{k: kw.pop(k) for k in ("cluster", "node", "gpu", "job", "application", "gpu_model")})


@contextmanager
def _store(ctx: click.Context) -> Iterator[Store]:
    from sinks.query import Store

    settings = resolved(ctx, kafka=False)
    with errors(), Store.from_settings(settings) as store:
        yield store


def _emit(tables: list[Table], fmt: str) -> None:
    from sinks.query import render

    with errors():
        text = render(tables, fmt)
    click.echo(text)
    if fmt == "csv":
        for t in tables:
            for note in t.notes:
                click.echo(f"note: {note}", err=True)


def describe_backfill(report: BackfillReport) -> str:
    """A backfill's outcome in a few lines (what was rolled up, what was left out and why)."""
    from sinks.query.output import iso

    def span(spans: tuple[tuple[int, int], ...]) -> str:
        return ", ".join(f"{iso(a)} .. {iso(b)}" for a, b in spans) or "nothing"

    lines = [
        f"rolled up {span(report.rollup_spans)} (1-minute) and {span(report.jobs_spans)} (job summaries) "
        f"in {report.queries} queries, {report.seconds:.1f} s",
        *(f"  left out: {why}" for why in report.skipped),
    ]
    return "\n".join(lines)


def _check(validate: Callable[[], None]) -> None:
    """Reject a malformed question before connecting to anything."""
    with errors():
        validate()


@cli.command("trend")
@click.option("--field", "field_", default="power_watts", show_default=True, help="Reading to aggregate.")
@click.option(
    "--by",
    default="gpu_model",
    show_default=True,
    help="Tag to group by: cluster, node, gpu, gpu_index, gpu_model, application.",
)
@click.option("--every", default=None, help="Window, e.g. 10s, 5m, 1h [default: about 300 points over the range].")
@click.option("--fn", default="mean", show_default=True, help="Aggregation: " + FN_HELP)
@click.option("--band/--no-band", default=False, help="Add the baseline band (p05/p50/p95) of each group.")
@click.option("--phase", default="compute", show_default=True, help="Phase whose baseline band is shown.")
@time_options("15m")
@scope_options
@output_options
@click.pass_context
def trend_cmd(ctx: click.Context, /, **kw: Any) -> None:
    """A historical trend: FN(FIELD) per window and group, over a range, for a scope."""
    from sinks.query import TrendQuery, trend

    scope = _scope(kw)
    q = TrendQuery(
        kw["field_"],
        kw["by"],
        kw["every"],
        kw["range_"],
        kw["fn"],
        scope,
        kw["band"],
        kw["phase"],
        kw["start"],
        kw["stop"],
        kw["backend"],
    )
    _check(q.validate)
    with _store(ctx) as store:
        result = trend(store, q)
    _emit(result.tables(), kw["fmt"])


@cli.command("top")
@click.argument("kind")
@click.option("-n", "--n", "n", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--fn", default="max", show_default=True, help="For hot and power: " + FN_HELP)
@click.option(
    "--threshold",
    default=IDLE_UTIL_PERCENT,
    show_default=True,
    type=float,
    help="For wasted: utilization % under which it counts (default: idle, as the finding and rightsize count it).",
)
@time_options("1h")
@scope_options
@output_options
@click.pass_context
def top_cmd(ctx: click.Context, /, kind: str, **kw: Any) -> None:
    """The N GPUs that rank highest on KIND: hot, throttled, wasted (capacity), power or xid."""
    from sinks.query import TopQuery, top

    scope = _scope(kw)
    q = TopQuery(kind, kw["n"], kw["range_"], scope, kw["fn"], kw["threshold"], kw["start"], kw["stop"], kw["backend"])
    _check(q.validate)
    with _store(ctx) as store:
        result = top(store, q)
    _emit(result.tables(), kw["fmt"])


@cli.group("compare")
def compare_group() -> None:
    """Comparisons: a job against its baseline, two GPU models on one application."""


FEATURE_HELP = "Feature to compare (repeat; default: utilization and the relative power/memory/clock/temperature)."


@compare_group.command("job")
@click.argument("job")
@click.option("--feature", "features", multiple=True, help=FEATURE_HELP)
@click.option("--phase", default="compute", show_default=True, help="Phase of the baseline.")
@time_options("7d")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(["table", "json", "csv"]))
@click.pass_context
def compare_job_cmd(ctx: click.Context, /, job: str, features: tuple[str, ...], phase: str, **kw: Any) -> None:
    """JOB's p50/p95 per feature against the baseline band of its application and GPU model."""
    from sinks.query import COMPARE_FEATURES, CompareJobQuery, compare_job

    q = CompareJobQuery(job, kw["range_"], features or COMPARE_FEATURES, phase, kw["start"], kw["stop"])
    _check(q.validate)
    with _store(ctx) as store:
        result = compare_job(store, q)
    _emit(result.tables(), kw["fmt"])


@compare_group.command("models")
@click.argument("model_a")
@click.argument("model_b")
@click.option("--application", required=True, help="The application both models ran.")
@click.option("--cluster", default=None, help="Only this cluster.")
@click.option("--feature", "features", multiple=True, help=FEATURE_HELP)
@time_options("24h")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(["table", "json", "csv"]))
@click.pass_context
def compare_models_cmd(
    ctx: click.Context,
    /,
    model_a: str,
    model_b: str,
    application: str,
    cluster: str | None,
    features: tuple[str, ...],
    **kw: Any,
) -> None:
    """MODEL_A against MODEL_B running one application: normalized features, so the comparison is fair."""
    from sinks.query import COMPARE_FEATURES, CompareModelsQuery, compare_models

    q = CompareModelsQuery(
        application,
        model_a,
        model_b,
        kw["range_"],
        features or COMPARE_FEATURES,
        cluster,
        kw["start"],
        kw["stop"],
    )
    _check(q.validate)
    with _store(ctx) as store:
        result = compare_models(store, q)
    _emit(result.tables(), kw["fmt"])


@cli.command("anomalies")
@click.option("--every", default=None, help="Window of the verdict counts [default: about 100 windows].")
@click.option("--detector", default=None, help="Only findings of this detector.")
@click.option("--limit", default=200, show_default=True, type=click.IntRange(1, 10_000), help="Most findings shown.")
@click.option("--part", default="both", show_default=True, type=click.Choice(["both", "windows", "findings"]))
@time_options("24h")
@scope_options
@output_options
@click.pass_context
def anomalies_cmd(ctx: click.Context, /, **kw: Any) -> None:
    """Anomaly history: unusual/anomalous verdicts per window, and the findings, for a scope."""
    from sinks.query import AnomalyQuery, anomalies

    scope = _scope(kw)
    q = AnomalyQuery(
        kw["range_"], kw["every"], scope, kw["detector"], kw["limit"], kw["start"], kw["stop"], kw["backend"]
    )
    _check(q.validate)
    with _store(ctx) as store:
        result = anomalies(store, q)
    _emit(result.tables(kw["part"]), kw["fmt"])


@cli.command("jobs")
@time_options("30d")
@scope_options
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(["table", "json", "csv"]))
@click.pass_context
def jobs_cmd(ctx: click.Context, /, **kw: Any) -> None:
    """Job summaries from the jobs bucket: GPU-hours and utilization/memory/power p50, p95, max per job."""
    from sinks.query import JobsQuery, job_summaries

    q = JobsQuery(kw["range_"], _scope(kw), kw["start"], kw["stop"])
    _check(q.validate)
    with _store(ctx) as store:
        result = job_summaries(store, q)
    _emit(result.tables(), kw["fmt"])


@cli.group("storage")
def storage_group() -> None:
    """Buckets, retention and the job summaries in InfluxDB (the sink writes the 1-minute rollups)."""


@storage_group.command("setup")
@click.option("--tasks/--no-tasks", default=True, help="Also install the job-summary task.")
@click.pass_context
def storage_setup_cmd(ctx: click.Context, tasks: bool) -> None:
    """Create or update the buckets, their retention, InfluxQL mappings and the job-summary task (idempotent)."""
    from sinks.retention import setup

    settings = resolved(ctx, kafka=False)
    with errors():
        changes = setup(settings, tasks=tasks)
    for c in changes:
        click.echo(f"{c.what:7} {c.action:10} {c.name}")


@storage_group.command("status")
@click.pass_context
def storage_status_cmd(ctx: click.Context) -> None:
    """The buckets and the job-summary task as they are now, with its last run."""
    from sinks.retention import status

    with _store(ctx) as store:
        buckets, tasks = status(resolved(ctx, kafka=False), store)
    for b in buckets:
        kept = f"{b.retention_s / 86400:g} days" if b.retention_s else ("forever" if b.exists else "-")
        click.echo(f"bucket  {b.name:28} {'ok' if b.exists else 'MISSING':8} kept {kept:10} {b.holds}")
    for t in tasks:
        took = f"{t.last_run_s:.2f}s" if t.last_run_s is not None else "-"
        click.echo(f"task    {t.name:50} {t.status:8} every {t.every:4} last run {t.last_run} {t.last_run_at} ({took})")


@storage_group.command("rollup")
@click.option("--at", "at", required=True, help="Run the tasks as if scheduled at this time (RFC 3339): back-fill.")
@click.pass_context
def storage_rollup_cmd(ctx: click.Context, at: str) -> None:
    """Run the job-summary task now for a past time (it covers the 10 minutes before --at); the 1-minute rollups
    need no back-fill: the sink catches up from Kafka after an outage."""
    from sinks.query.model import parse_time
    from sinks.retention import run_task, task_specs

    with errors():
        at_ns = parse_time(at, "--at")
    settings = resolved(ctx, kafka=False)
    with _store(ctx) as store:
        results = [run_task(store, spec.name, at_ns) for spec in task_specs(settings)]
    for r in results:
        click.echo(f"{r.status:8} {r.seconds:7.2f}s  {r.task}")
        if r.status != "success":
            click.echo("  " + (r.log[-1] if r.log else "no log"), err=True)
    if any(r.status != "success" for r in results):
        ctx.exit(1)


@storage_group.command("backfill")
@click.option("--start", required=True, help="Start of the range to roll up (RFC 3339).")
@click.option("--stop", required=True, help="End of the range to roll up (RFC 3339).")
@click.pass_context
def storage_backfill_cmd(ctx: click.Context, start: str, stop: str) -> None:
    """Write the 1-minute rollups and job summaries of a past range at once (data that arrived after its minutes
    were rolled up: imported history, an outage); idempotent."""
    from sinks.query.model import check_range, parse_time
    from sinks.retention import backfill

    with errors():
        check_range(None, start, stop)
        start_ns, stop_ns = parse_time(start, "--start"), parse_time(stop, "--stop")
    settings = resolved(ctx, kafka=False)
    with errors():
        report = backfill(settings, [(start_ns, stop_ns)], progress=True)
    click.echo(describe_backfill(report))
