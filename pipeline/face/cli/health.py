"""``hermeneut health``: which GPUs and nodes are healthy now, and what to do about the others (pipeline.health)."""

from __future__ import annotations

import json
import time

import click

from pipeline.face.cli.base import cli, errors, resolved
from pipeline.vocab import parse_seconds


def _ago(now_ns: int, ns: int | None) -> str:
    return "never" if ns is None else f"{max(0, now_ns - ns) / 1e9:.0f} s ago"


@cli.command("health")
@click.option("--cluster", help="Only this cluster.")
@click.option("--node", help="One node, with every GPU of it.")
@click.option("--gpu", help="One GPU (its UUID), with the findings behind its state.")
@click.option("--lookback", default="24h", show_default=True, help="GPUs that reported within this are the fleet.")
@click.option("--silent-after", default="2m", show_default=True, help="A GPU silent this long is 'unknown'.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def health_cmd(
    ctx: click.Context,
    cluster: str | None,
    node: str | None,
    gpu: str | None,
    lookback: str,
    silent_after: str,
    fmt: str,
) -> None:
    """The health of the fleet (GPUs and nodes by state, and every one that is not healthy), of one node or of one
    GPU: healthy, degraded, unhealthy or unknown, the findings behind it and the remedy."""
    from pipeline.face.health import HealthQuery, fleet_health, health_json
    from sinks.alerting.admin import AlertAdmin
    from sinks.query.store import Store

    settings = resolved(ctx)
    with errors():
        q = HealthQuery(cluster, node, gpu, parse_seconds(lookback, "--lookback"),
                        parse_seconds(silent_after, "--silent-after"))  # fmt: skip
        q.validate()
        admin = AlertAdmin(settings).start()
        try:
            with Store.from_settings(settings) as store:
                now = time.time_ns()
                data = health_json(fleet_health(admin, store, q, now, settings.health), q)
        finally:
            admin.close()
    if fmt == "json":
        click.echo(json.dumps(data, indent=1))
        return

    def counts(by: dict[str, int]) -> str:
        return ", ".join(f"{n} {state}" for state, n in by.items())

    click.echo(f"GPUs: {sum(data['gpus_by_state'].values())} ({counts(data['gpus_by_state'])})")
    click.echo(f"nodes: {sum(data['nodes_by_state'].values())} ({counts(data['nodes_by_state'])})")
    for i in data["incidents"]:
        shared = ", ".join(f"{k}={v}" for k, v in i["shared"].items()) or "nothing but the cluster"
        click.echo(f"fleet incident: {i['detector']} on {i['gpus']} of {i['of_gpus']} GPUs of {i['cluster']} at once "
                   f"(shared: {shared}): look at what they share; no per-GPU remedy")  # fmt: skip
    for n in data["nodes"]:
        click.echo(f"node {n['cluster']}/{n['node']}: {n['state']}, remedy: {n['remedy']}")
    for a in data["gpus"]:
        seen = _ago(now, a["last_seen_ns"])
        click.echo(f"  {a['node']} {a['gpu']}: {a['state']}, remedy: {a['remedy']} (last sample {seen})")
        for r in a["reasons"]:
            click.echo(f"    {r['severity']:8} {r['detector']}: {r['summary']}")
    if not (data["nodes"] or data["gpus"]):
        click.echo("every GPU and node is healthy")
