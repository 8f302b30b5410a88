"""``hermeneut context``: set, clear, show and watch the workload context (which job runs on which GPU)."""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, cast

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
from pipeline.codec import decode_record, encode_record
from pipeline.config import Settings
from pipeline.errors import ConfigError, HermeneutError
from pipeline.events import GpuContext, Workload, gpu_key, node_key
from pipeline.registry import FLAG
from pipeline.topology import NodeTopology


@cli.group("context")
def context_group() -> None:
    """Workload context per GPU: which job, user, application, model and framework runs there."""


def _workload_options(f: Any) -> Any:
    for option in reversed(
        [
            click.option("--job", "job_id", help="Job id."),
            click.option("--user"),
            click.option("--tenant", help="Tenant, team or account."),
            click.option("--model", help="Model name, e.g. meta-llama/Llama-3.1-70B-Instruct."),
            click.option("--framework", help="e.g. pytorch, vllm, blender."),
            click.option("--job-gpus", type=click.IntRange(1), help="GPUs the job spans across nodes."),
        ]
    ):
        f = option(f)
    return f


def _uuid(value: str) -> str:
    if not value.startswith(("GPU-", "MIG-")):
        raise click.BadParameter(f"expected a GPU-... or MIG-... uuid, got {value!r}")
    return value


def _publish(settings: Settings, records: list[tuple[bytes, bytes | None]]) -> None:
    from pipeline.publisher import Publisher

    publisher = Publisher(settings.kafka.client_config(), linger_ms=0)
    for key, value in records:
        publisher.publish(settings.topics.context, key, value)
    if publisher.close(settings.kafka.request_timeout_s) or publisher.stats.failed:
        fail(f"not delivered to {settings.topics.context}: {publisher.last_error or 'timed out'}", 1)


@context_group.command("set")
@click.option("--node", required=True)
@click.option("--gpu", "gpu", required=True, help="GPU or MIG uuid.")
@click.option("--app", "application", required=True, help="Application class (see pipeline.events.APPLICATIONS).")
@_workload_options
@click.pass_context
def set_cmd(ctx: click.Context, /, node: str, gpu: str, application: str, **fields: Any) -> None:
    """Declare the workload of one GPU by hand; it overrides every source until `context clear`."""
    from producers.context.base import MANUAL
    from producers.context.static import workload_from_fields

    uuid = _uuid(gpu)
    try:
        workload = workload_from_fields({"application": application, **fields}, MANUAL)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--app") from None
    settings = resolved(ctx, influxdb=False)
    record = GpuContext(settings.cluster, node, uuid, time.time_ns(), workload)
    _publish(settings, [(record.kafka_key, encode_record(record))])
    click.echo(f"{node} {uuid}: {workload.application} (manual)")


@context_group.command("clear")
@click.option("--node", required=True)
@click.option("--gpu", "gpu", required=True, help="GPU or MIG uuid.")
@click.pass_context
def clear_cmd(ctx: click.Context, node: str, gpu: str) -> None:
    """Forget one GPU's context (a tombstone); a running watch publishes what its sources know again."""
    uuid = _uuid(gpu)
    settings = resolved(ctx, influxdb=False)
    _publish(settings, [(gpu_key(settings.cluster, node, uuid), None)])
    click.echo(f"{node} {uuid}: cleared")


def _mirror(settings: Settings, topic: str, cls: type[Any], wait_s: float) -> Any:
    from pipeline.mirror import TopicMirror

    mirror = TopicMirror(settings.kafka.client_config(), topic, lambda v: decode_record(cls, v)).start()
    if not mirror.wait_ready(wait_s):
        mirror.stop()
        raise HermeneutError(f"could not read {topic} within {wait_s:.0f}s")
    return mirror


def format_contexts(contexts: list[GpuContext], now_ns: int) -> str:
    """The context table ``show`` prints."""
    head = (
        "node",
        "gpu",
        "application",
        "source",
        "conf",
        "job",
        "user",
        "tenant",
        "model",
        "framework",
        "gpus",
        "age",
    )
    rows = [head]
    for c in sorted(contexts, key=lambda c: (c.node, c.gpu_uuid)):
        w = c.workload or Workload("-")
        rows.append(
            (
                c.node,
                c.gpu_uuid,
                w.application,
                w.source,
                f"{w.confidence:.2f}",
                w.job_id or "-",
                w.user or "-",
                w.tenant or "-",
                w.model or "-",
                w.framework or "-",
                str(w.job_gpus or "-"),
                f"{max(0, now_ns - c.ts_ns) / 1e9:.0f}s",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows)


@context_group.command("show")
@click.option("--node", help="Only this node.")
@click.option("--wait", "wait_s", default=30.0, show_default=True, help="Seconds to wait for the topic.")
@click.pass_context
def show_cmd(ctx: click.Context, node: str | None, wait_s: float) -> None:
    """The current context of every GPU (read back from the compacted context topic)."""
    settings = resolved(ctx, influxdb=False)
    with errors():
        mirror = _mirror(settings, settings.topics.context, GpuContext, wait_s)
    try:
        contexts = [c for c in mirror.snapshot().values() if c.cluster == settings.cluster and node in (None, c.node)]
    finally:
        mirror.stop()
    click.echo(format_contexts(contexts, time.time_ns()) if contexts else "no workload context known")


def _inventory(settings: Settings, node: str, path: Path | None) -> Any:
    """The node's GPUs: a file, else the collector's topology on the topology topic, else `nvidia-smi -L`."""
    from producers.context.inventory import GpuInventory

    if path is not None:
        try:
            return GpuInventory.parse(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read GPU inventory {path}: {exc.strerror}") from None
    mirror = _mirror(settings, settings.topics.topology, NodeTopology, settings.kafka.request_timeout_s)
    try:
        topology = mirror.get(node_key(settings.cluster, node))
    finally:
        mirror.stop()
    if topology is not None:
        return GpuInventory.from_topology(topology)
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            return GpuInventory.from_nvidia_smi_list(done.stdout)
    raise ConfigError(
        f"no GPU inventory for node {node}: give --inventory (nvidia-smi -L or -q -x output), "
        "run the collector (topology topic) or install nvidia-smi"
    )


def _source_options(f: Any) -> Any:
    """``--<name>`` per context source in the registry: a switch, or the value of its one flagged setting (optional
    when that setting has a default)."""
    for name in reversed(registry.names("context")):
        plugin = registry.load("context", name)
        flags = [field.metadata[FLAG] for field in dataclasses.fields(plugin.Config) if FLAG in field.metadata]
        how: dict[str, Any] = {"is_flag": True}
        if flags:  # given alone, an optional value is the setting's (the settings', else its default)
            how = {"type": click.Path(path_type=Path)} | (
                {} if flags[0].required else {"is_flag": False, "flag_value": ""}
            )
        f = click.option(f"--{name}", _dest(name), default=None, help=getattr(plugin, "description", None), **how)(f)
    return f


def _dest(name: str) -> str:
    return name.replace("-", "_")


def _chosen(settings: Settings, given: dict[str, Any]) -> list[tuple[registry.PluginClass, Any]]:
    """The context sources asked for, configured and validated (nothing is connected): ConfigError when none is, or
    when two of them are two ways to the same answer."""
    chosen = [name for name in registry.names("context") if given[_dest(name)] not in (None, False)]
    if not chosen:
        flags = [f"--{name}" for name in registry.names("context")]
        raise ConfigError(f"no source: give {', '.join(flags[:-1])} and/or {flags[-1]}")
    configured: list[tuple[registry.PluginClass, Any]] = []
    covered: dict[str, str] = {}
    for name in chosen:
        plugin = cast(registry.ContextPluginClass, registry.load("context", name))
        if plugin.covers in covered:
            raise ConfigError(f"--{covered[plugin.covers]} and --{name} are two ways to the same jobs: choose one")
        covered[plugin.covers] = name
        flagged = [field.name for field in dataclasses.fields(plugin.Config) if FLAG in field.metadata]
        value = given[_dest(name)]
        options = {flagged[0]: value} if flagged and value not in (True, "") else {}
        config = plugin.configure(settings, **options)
        plugin.validate(config)
        configured.append((plugin, config))
    return configured


@context_group.command("watch")
@click.option("--node", help="This node's name (default: the host's short name; Slurm/Kubernetes node name).")
@click.option("--inventory", type=click.Path(path_type=Path), help="nvidia-smi -L or -q -x output of the node.")
@_source_options
@click.option("--interval", "interval_s", type=click.FloatRange(0.5), help="Seconds between polls.")
@click.option("--once", is_flag=True, help="Poll once, publish what changed, exit.")
@click.option("--stats-file", type=click.Path(path_type=Path))
@metrics_port_option
@click.pass_context
def watch_cmd(
    ctx: click.Context,
    /,
    node: str | None,
    inventory: Path | None,
    interval_s: float | None,
    once: bool,
    stats_file: Path | None,
    metrics_port: int | None,
    **given: Any,
) -> None:
    """Poll this node's context sources and publish every change to the context topic (until Ctrl-C)."""
    from pipeline.metrics import StatsView
    from pipeline.publisher import Publisher
    from pipeline.stats import write_stats
    from producers.context.base import MANUAL
    from producers.context.watch import WATCH_FIELDS, Watcher

    with errors():  # validate early, connect late
        chosen = _chosen(settings_of(ctx), given)
    settings = resolved(ctx, influxdb=False)
    node = node or socket.gethostname().split(".", 1)[0]
    with errors():
        gpus = _inventory(settings, node, inventory)
        sources = [plugin.from_config(config, node=node, inventory=gpus) for plugin, config in chosen]
        mirror = _mirror(settings, settings.topics.context, GpuContext, settings.kafka.request_timeout_s)

    def on_node(manual_only: bool) -> dict[str, Workload]:
        return {
            c.gpu_uuid: c.workload
            for c in mirror.snapshot().values()
            if c.cluster == settings.cluster
            and c.node == node
            and c.workload is not None
            and (not manual_only or c.workload.source == MANUAL)
        }

    topic = settings.topics.context
    publisher = Publisher(settings.kafka.client_config(), linger_ms=5, limits=cluster_limits(settings, topic))
    watcher = Watcher(
        settings.cluster,
        node,
        sources,
        lambda key, value: publisher.publish(topic, key, value),
        manual=lambda: on_node(manual_only=True),
        published=on_node(manual_only=False),
        reassert_s=settings.context.reassert_s,
        backoff_max_s=settings.context.backoff_max_s,
    )
    failed = 0

    def values() -> dict[str, Any]:
        p = publisher.stats
        delivery = {"delivered": p.delivered, "failed": p.failed, "in_flight": p.in_flight, "blocked_s": p.blocked_s}
        return watcher.values() | delivery

    def after_step() -> bool:
        nonlocal failed
        publisher.poll(0)
        write_stats(stats_file, values())
        lost, failed = publisher.stats.failed > failed, publisher.stats.failed
        return lost

    click.echo(f"watching node {node} ({len(gpus)} GPUs) with {', '.join(s.name for s in sources)}", err=True)
    exposed = None if once else expose(settings, "context", metrics_port)
    if exposed is not None:
        exposed.registry.register(StatsView(values, WATCH_FIELDS))
    try:
        if once:
            watcher.step()
            publisher.flush(settings.kafka.request_timeout_s)
            after_step()
        else:
            watcher.run(stop_event(), interval_s or settings.context.interval_s, after_step)
    finally:
        mirror.stop()
        undelivered = publisher.close(settings.kafka.request_timeout_s)
        after_step()
        if exposed is not None:
            exposed.close()
    if undelivered or publisher.stats.failed:
        fail(f"{publisher.stats.failed} context records failed, {undelivered} undelivered", 1)
    click.echo(f"published {watcher.stats.published} records and {watcher.stats.tombstones} tombstones", err=True)
