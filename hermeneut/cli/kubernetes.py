"""``hermeneut kubernetes sync``: each GPU's health as a node condition and a DRA device taint (sinks.kubernetes)."""

from __future__ import annotations

import threading
from pathlib import Path

import click

from hermeneut.cli.base import cli, errors, expose, metrics_port_option, resolved, stop_event


@cli.group("kubernetes")
def kubernetes_group() -> None:
    """Hand health to Kubernetes: node conditions and DRA DeviceTaintRules."""


@kubernetes_group.command("sync")
@click.option("--dry-run", is_flag=True, help="Read everything, write nothing: print what would be written.")
@click.option("--once", is_flag=True, help="One round, then exit (the default runs until SIGTERM).")
@click.option("--kubeconfig", type=click.Path(path_type=Path, dir_okay=False), help="Over kubernetes.kubeconfig.")
@metrics_port_option
@click.pass_context
def sync_cmd(ctx: click.Context, dry_run: bool, once: bool, kubeconfig: Path | None, metrics_port: int | None) -> None:
    """Keep the cluster named by ``cluster`` in step with the health topic: a node condition
    (kubernetes.condition_type) on every node hermeneut has health for, and a DeviceTaintRule per GPU that is not
    healthy (None for degraded, NoSchedule for unhealthy, NoExecute only with kubernetes.no_execute), never more
    than kubernetes.max_tainted_share of the cluster's GPUs under NoSchedule/NoExecute at once."""
    from sinks.kubernetes.api import Client, credentials
    from sinks.kubernetes.plan import Plan
    from sinks.kubernetes.sync import Controller, describe, run

    settings = resolved(ctx, kafka=True, influxdb=False)
    cfg = settings.kubernetes
    with errors():
        client = Client(credentials(kubeconfig or cfg.kubeconfig, cfg.context), cfg.timeout_s)

        def show(p: Plan) -> None:
            for line in describe(p, cfg.condition_type, cfg.taint_key):
                click.echo(("would: " if dry_run else "") + line)

        stop = threading.Event() if once else stop_event()
        exposed = expose(settings, "kubernetes", metrics_port)
        controller = Controller(settings, client, dry_run=dry_run, registry=exposed.registry)
        try:
            stats = run(settings, controller, stop, once=once, on_round=show)
        finally:
            client.close()
            exposed.close()
    click.echo(
        f"kubernetes sync: {stats.rounds} rounds, {stats.conditions_written} conditions, "
        f"{stats.rules_created} taint rules created, {stats.rules_updated} changed, {stats.rules_deleted} deleted, "
        f"{stats.write_errors} writes refused, {stats.bad_records} unreadable health records",
        err=True,
    )
