"""``hermeneut collect``: the node agent (a registered source, NVML by default -> the raw and topology topics)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hermeneut.cli.base import (
    cli,
    cluster_limits,
    errors,
    expose,
    fail,
    metrics_port_option,
    resolved,
    settings_of,
    stop_event,
)
from pipeline import registry
from producers.source import Source

if TYPE_CHECKING:
    from pipeline.config import Settings
    from producers.context.nodestate import NodeState


@cli.command("collect")
@click.option("--source", type=click.Choice(registry.names("source")), help="Default: collector.source (nvml).")
@click.option(
    "--url",
    help="The exporter's /metrics URL (dcgm-exporter default: collector.dcgm_exporter_url; amd-exporter: "
    "http://127.0.0.1:5000/metrics).",
)
@click.option("--binary", help="The amd-smi command the amd-smi source runs (default: amd-smi on PATH).")
@click.option("--interval", type=click.FloatRange(0.1, 3600), help="Seconds between rounds (sample_interval_s).")
@click.option("--duration", type=click.FloatRange(0), help="Seconds to run (default: until SIGTERM/Ctrl-C).")
@click.option("--node", help="Node name the samples carry (default: collector.node, else this host's name).")
@click.option("--stats-file", type=click.Path(path_type=Path), help="JSON counters, rewritten every round.")
@metrics_port_option
@click.pass_context
def collect_cmd(
    ctx: click.Context,
    source: str | None,
    url: str | None,
    binary: str | None,
    interval: float | None,
    duration: float | None,
    node: str | None,
    stats_file: Path | None,
    metrics_port: int | None,
) -> None:
    """Read this node's GPUs every interval and publish them (SIGTERM: finish the round, flush, exit)."""
    from pipeline.publisher import Publisher
    from producers.agent import NodeAgent

    with errors():  # the source's config is checked before anything is connected
        chosen: Source = registry.create(
            "source", source or settings_of(ctx).collector.source, settings_of(ctx), url=url, node=node, binary=binary
        )
    settings = resolved(ctx, influxdb=False)
    c = settings.collector
    try:
        chosen.open()
    except Exception as exc:  # NVML raises its own error type when there is no driver or no GPU
        hint = " (no NVIDIA driver here? --source dcgm-exporter reads an existing exporter)"
        hint = hint if chosen.name == "nvml" else ""
        fail(f"cannot start the {chosen.name} source: {exc}{hint}", 1)
    buffer_kib = c.buffer_mib * 1024
    t = settings.topics
    publisher = Publisher(
        settings.kafka.client_config(),
        buffer_messages=1_000_000,
        delivery_timeout_ms=int(c.delivery_timeout_s * 1000),
        extra={"queue.buffering.max.kbytes": buffer_kib},
        limits=cluster_limits(settings, t.raw, t.context, t.topology, t.ground_truth, t.dead_letter, fallback=True),
    )
    exposed = expose(settings, "collect", metrics_port)
    with errors():
        node_state = _node_state(settings, node or c.node or socket.gethostname().split(".", 1)[0])
    agent = NodeAgent(
        chosen,
        publisher,
        settings.topics,
        interval or settings.sample_interval_s,
        topology_interval_s=c.topology_interval_s,
        shutdown_grace_s=c.shutdown_grace_s,
        stats_file=stats_file,
        registry=exposed.registry,
        rack=c.rack,
        switch=c.switch,
        node_state=node_state,
    )
    try:
        report = agent.run(stop_event(), duration)
    finally:
        chosen.close()
        exposed.close()
    lost = publisher.stats.failed + report.undelivered + report.unqueued_samples
    click.echo(
        f"{report.rounds} rounds, {report.samples} samples, {report.events} events, {report.nics} NIC readings "
        f"in {report.messages} messages; {report.late_rounds} late, {report.skipped_rounds} skipped rounds, "
        f"{report.source_errors} failed reads, {report.dead_lettered} dead-lettered"
    )
    if lost:
        fail(
            f"{publisher.stats.failed} messages failed, {report.undelivered} undelivered at exit, "
            f"{report.unqueued_samples} samples never queued",
            1,
        )


def _node_state(settings: Settings, node: str) -> NodeState | None:
    """The reader of the node's maintenance state that ``collector.maintenance`` names (None: none)."""
    from producers.context import nodestate
    from producers.context.kubernetes import ApiServer

    c = settings.context
    if settings.collector.maintenance == "slurm":
        return nodestate.SlurmNodeState(node, c.command_timeout_s)
    if settings.collector.maintenance == "kubernetes":
        api = ApiServer.in_cluster(c.kubernetes_api, c.kubernetes_token_file, c.kubernetes_ca_file, c.command_timeout_s)
        return nodestate.KubernetesNodeState(node, api)
    return None
