"""``hermeneut health``: which GPUs and nodes are healthy now, and what to do about the others (pipeline.health)."""

from __future__ import annotations

import json
import time

import click

from hermeneut.cli.base import cli, errors, resolved
from pipeline.vocab import parse_seconds, utc_text

#: the exit code of an empty selection (no GPU reported, nothing fired): nothing was judged
EMPTY = 4


def _ago(now_ns: int, ns: int | None) -> str:
    return "never" if ns is None else f"{max(0, now_ns - ns) / 1e9:.0f} s ago"


def _span(start_ns: int | None, at_ns: int) -> str:
    return f"over {utc_text(start_ns)} .. {utc_text(at_ns)}" if start_ns is not None else f"at {utc_text(at_ns)}"


@cli.command("health")
@click.option("--cluster", help="Only this cluster.")
@click.option("--node", help="One node, with every GPU of it.")
@click.option("--gpu", help="One GPU (its UUID), with the findings behind its state.")
@click.option("--lookback", default="24h", show_default=True, help="GPUs that reported within this are the fleet.")
@click.option("--silent-after", default="2m", show_default=True, help="A GPU silent this long is 'unknown'.")
@click.option("--at", "at", help="Judge the past at this time (RFC 3339, or a duration ago: 3d): imported history.")
@click.option(
    "--range",
    "range_",
    help="Judge the past over A..B (each RFC 3339 or a duration ago: 7d..6d), or "
    "the last D (a duration): every finding open at some moment of it.",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def health_cmd(
    ctx: click.Context,
    cluster: str | None,
    node: str | None,
    gpu: str | None,
    lookback: str,
    silent_after: str,
    at: str | None,
    range_: str | None,
    fmt: str,
) -> None:
    """The health of the fleet (GPUs and nodes by state, and every one that is not healthy), of one node or of one
    GPU: healthy, degraded, unhealthy, unknown or maintenance, the findings behind it and the remedy. Now (the
    alert manager's alerts), or at or over a time in the past (the stored findings). An empty selection (no GPU
    reported, nothing fired) says so and exits with 4."""
    from alerting.admin import AlertAdmin
    from hermeneut.views.health import HealthQuery, counted, fleet_health, health_json, node_topologies, past_of
    from sinks.query.store import Store

    now = time.time_ns()
    with errors():
        start_ns, stop_ns = past_of(at, range_, now)
    settings = resolved(ctx, kafka=stop_ns is None)
    with errors():
        q = HealthQuery(
            cluster,
            node,
            gpu,
            parse_seconds(lookback, "--lookback"),
            parse_seconds(silent_after, "--silent-after"),
            start_ns,
            stop_ns,
        )
        q.validate()
        topologies = node_topologies(settings) if not q.past else []
        admin = AlertAdmin(settings).start() if not q.past else None
        try:
            with Store.from_settings(settings) as store:
                found = fleet_health(admin, store, q, now, settings.health, topologies, settings.alerts.stale_after_s)
                data = health_json(found, q)
        finally:
            if admin is not None:
                admin.close()
    at_ns = stop_ns if stop_ns is not None else now
    if fmt == "json":
        click.echo(json.dumps(data, indent=1))
        if data["empty"]:
            ctx.exit(EMPTY)
        return
    if data["empty"]:
        click.echo(f"empty selection: {q.describe(at_ns)}; nothing to judge")
        ctx.exit(EMPTY)
    if q.past:
        click.echo(f"health {_span(start_ns, at_ns)} (stored findings and samples)")
    now = at_ns
    click.echo(counted(data["gpus_by_state"], "GPUs"))
    click.echo(counted(data["nodes_by_state"], "nodes"))
    for i in data["incidents"]:
        shared = ", ".join(f"{k}={v}" for k, v in i["shared"].items()) or "nothing but the cluster"
        click.echo(
            f"fleet incident: {i['detector']} on {i['gpus']} of {i['of_gpus']} GPUs of {i['cluster']} at once "
            f"(shared: {shared}): look at what they share; no per-GPU remedy"
        )
    for n in data["nodes"]:
        click.echo(f"node {n['cluster']}/{n['node']}: {n['state']}, remedy: {n['remedy']}")
    for a in data["gpus"]:
        seen = _ago(now, a["last_seen_ns"])
        click.echo(f"  {a['node']} {a['gpu']}: {a['state']}, remedy: {a['remedy']} (last sample {seen})")
        for r in a["reasons"]:
            click.echo(f"    {r['severity']:8} {r['detector']}: {r['summary']}")
    if not (data["nodes"] or data["gpus"]):
        click.echo("every GPU and node is healthy" if not q.past else "every GPU and node was healthy")
    for s in data["shadow"]:
        where = f"{s['node']} {s['gpu']}" if s["gpu"] else f"node {s['node']}"
        click.echo(f"shadow rule {s['rule']} would make {where} {s['state']}, remedy {s['remedy']}: {s['summary']}")


#: jobs listed in the table output (all are in --format json)
_JOBS_SHOWN = 20


@cli.command("reliability")
@click.option("--range", "range_", default="7d", show_default=True, help="How far back (within the raw retention).")
@click.option("--by", type=click.Choice(["cluster", "gpu_model", "node"]), default="gpu_model", show_default=True)
@click.option("--cluster", help="Only this cluster.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def reliability_cmd(ctx: click.Context, range_: str, by: str, cluster: str | None, fmt: str) -> None:
    """Reliability from the finding history: incidents (a GPU made unhealthy), mean GPU-hours between them, time
    to repair, degradations, lemon nodes, incidents per day, and each job's effective time."""
    from hermeneut.views.reliability import ReliabilityQuery, fleet_reliability
    from pipeline.reliability import report_json
    from sinks.query.store import Store

    settings = resolved(ctx, kafka=False)
    with errors():
        q = ReliabilityQuery(parse_seconds(range_, "--range"), by, cluster)
        q.validate(settings.storage.raw_retention_days)
        with Store.from_settings(settings) as store:
            data = report_json(fleet_reliability(store, q, time.time_ns(), settings.health))
    if fmt == "json":
        click.echo(json.dumps(data, indent=1))
        return

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    click.echo(
        f"reliability over {range_} by {by}: incidents = GPUs made unhealthy; MTBI in GPU-hours per "
        "incident; repair in minutes, finding start to clear; tell in seconds, finding start to the first "
        "notification a receiver took (told: of how many incidents)"
    )
    click.echo(
        f"{by:28} {'GPUs':>5} {'GPU-h':>9} {'incid.':>6} {'MTBI h':>8} {'repair p50':>10} {'p90':>8} "
        f"{'open':>5} {'degr.':>6} {'tell p50':>8} {'told':>5}"
    )
    for r in data["rows"]:
        click.echo(
            f"{r['group'][:28]:28} {r['gpus']:>5} {r['gpu_hours']:>9g} {r['incidents']:>6} "
            f"{num(r['mtbi_hours']):>8} {num(r['repair_median_min']):>10} {num(r['repair_p90_min']):>8} "
            f"{r['open_incidents']:>5} {r['degradations']:>6} {num(r['tell_median_s']):>8} "
            f"{r['told']:>5}"
        )
    for lemon in data["lemon_nodes"]:
        click.echo(f"lemon node {lemon['cluster']}/{lemon['node']}: {lemon['why']}")
    if data["days"]:
        click.echo(
            "per day (UTC): "
            + ", ".join(
                f"{time.strftime('%Y-%m-%d', time.gmtime(d['day_ns'] / 1e9))} {d['incidents']} incidents, "
                f"{d['degradations']} degradations"
                for d in data["days"]
            )
        )
    for note in data["notes"]:
        click.echo(f"note: {note}")
    if data["jobs"]:
        click.echo("effective time per job (its GPUs all healthy and busy), least effective first:")
    for j in data["jobs"][:_JOBS_SHOWN]:
        causes = ", ".join(f"{c['detector']} {c['hours']:g} h" for c in j["causes"]) or "nothing"
        click.echo(
            f"  {j['cluster']}/{j['job']} ({j['application']}): {j['effective']:.1%} of {j['hours']:g} h "
            f"({j['gpu_hours']:g} GPU-h); lost {j['lost_hours']:g} h to {causes}"
        )
