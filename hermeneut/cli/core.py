"""Core commands: local services, topics, the pipeline's stages and the main job."""

from __future__ import annotations

import sys
from pathlib import Path

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
from hermeneut.stages import ENTRY
from pipeline import registry, services

MIX_HELP = (
    "Fleet mix (node kinds): default (a mixed NVIDIA cloud), llm-a100 (AcmeTrace's clusters), nvidia-amd (NVIDIA HGX "
    "beside AMD Instinct MI300X nodes), amd, or seeded (proportions drawn from the seed)."
)


def _mix(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A known fleet mix, checked before anything starts."""
    from producers.simulator.hardware import MIXES, SEEDED

    if value not in MIXES and value != SEEDED:
        fail(f"unknown fleet mix {value!r}; known: {', '.join((*MIXES, SEEDED))}", 2)
    return value


@cli.group("services")
def services_group() -> None:
    """Local Kafka and InfluxDB (installed and cached on first use)."""


@services_group.command("up")
@click.option("--web/--no-web", default=True, show_default=True, help="Also serve the dashboard.")
@click.pass_context
def services_up(ctx: click.Context, web: bool) -> None:
    """Install (first time), start and onboard the local services (and the dashboard); a recorded server whose
    process is gone is restarted with its data on its port, one that runs but does not answer is reported."""
    settings = settings_of(ctx)
    with errors():
        services.up(settings, restart=True)
        if web:
            from pipeline.topics import ensure_topics, topic_specs

            resolved = services.resolve(settings)
            ensure_topics(resolved.kafka.client_config(), topic_specs(resolved))
            services.start_web(settings, ENTRY)
    for name, line in services.status(settings).items():
        click.echo(f"{name:9} {line}")


@services_group.command("install")
@click.pass_context
def services_install(ctx: click.Context) -> None:
    """Install Kafka's jars and build influxd into the cache, once per version, without starting them (``make
    test`` runs this first: a cold influxd build outlasts any one test's time limit)."""
    from pipeline.services import influxdb, kafka

    settings = settings_of(ctx)
    cache = settings.services.cache_dir
    with errors():
        libs = kafka.install(cache, settings.kafka.version)
        binary = influxdb.install(cache, settings.influxdb.version)
    click.echo(f"kafka     {settings.kafka.version}: {libs}")
    click.echo(f"influxdb  {settings.influxdb.version}: {binary}")


@services_group.command("status")
@click.pass_context
def services_status(ctx: click.Context) -> None:
    """Where the services are and whether they answer."""
    with errors():
        lines = services.status(settings_of(ctx))
    for name, line in lines.items():
        click.echo(f"{name:9} {line}")


@services_group.command("down")
@click.pass_context
def services_down(ctx: click.Context) -> None:
    """Stop the local services (their data and logs are kept)."""
    with errors():
        services.down(settings_of(ctx))


@cli.command("topics")
@click.pass_context
def topics_cmd(ctx: click.Context) -> None:
    """Create the pipeline's topics (idempotent)."""
    from pipeline.topics import ensure_topics, topic_specs

    settings = resolved(ctx, influxdb=False)
    with errors():
        created = ensure_topics(
            settings.kafka.client_config(), topic_specs(settings), timeout_s=settings.kafka.request_timeout_s
        )
    click.echo(f"created: {', '.join(created) or 'none (all existed)'}")


@cli.command("simulate")
@click.option("--nodes", default=16, show_default=True, type=click.IntRange(1))
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64), help="GPUs per node.")
@click.option(
    "--duration", type=click.FloatRange(0), help="Seconds to run live (default: until Ctrl-C; 0 after --fast-forward)."
)
@click.option("--seed", default=0, show_default=True)
@click.option("--mix", default="default", show_default=True, help=MIX_HELP, callback=_mix)
@click.option(
    "--faults/--no-faults", default=False, show_default=True, help="Inject faults (ground truth to its topic)."
)
@click.option(
    "--fault-rate-scale", default=1.0, show_default=True, type=click.FloatRange(0), help="x the trace's fault rates."
)
@click.option("--fault-mix", default="trace", show_default=True, type=click.Choice(["trace", "balanced"]))
@click.option(
    "--fast-forward",
    "fast_forward_s",
    default=0.0,
    type=click.FloatRange(0),
    metavar="SECONDS",
    help="First publish this much history ending now, as fast as Kafka takes it.",
)
@click.option("--extras/--no-extras", default=True, show_default=True, help="Per-link NVLink, processes, NICs.")
@click.option("--stats-file", type=click.Path(path_type=Path))
@metrics_port_option
@click.pass_context
def simulate_cmd(
    ctx: click.Context,
    nodes: int,
    gpus: int,
    duration: float | None,
    seed: int,
    mix: str,
    faults: bool,
    fault_rate_scale: float,
    fault_mix: str,
    fast_forward_s: float,
    extras: bool,
    stats_file: Path | None,
    metrics_port: int | None,
) -> None:
    """Publish a simulated fleet (samples, context, topology, ground truth) in real time or fast-forward."""
    from pipeline.publisher import Publisher
    from pipeline.topics import ensure_topics, topic_specs
    from producers.agent import NodeAgent
    from producers.source import Source

    with errors():  # a bad fleet is refused before Kafka is touched
        source: Source = registry.create(
            "source",
            "simulator",
            settings_of(ctx),
            nodes=nodes,
            gpus=gpus,
            seed=seed,
            mix=mix,
            faults=faults,
            fault_rate_scale=fault_rate_scale,
            fault_mix=fault_mix,
            extras=extras,
        )
        source.open()
    settings = resolved(ctx, influxdb=False)
    with errors():
        ensure_topics(settings.kafka.client_config(), topic_specs(settings), settings.kafka.request_timeout_s)
    t = settings.topics
    limits = cluster_limits(settings, t.raw, t.context, t.topology, t.ground_truth, t.dead_letter)
    publisher = Publisher(settings.kafka.client_config(), limits=limits)
    if duration is None and fast_forward_s > 0:
        duration = 0.0
    exposed = expose(settings, "collect", metrics_port)  # the simulator is a source of the collector agent
    agent = NodeAgent(
        source,
        publisher,
        settings.topics,
        settings.sample_interval_s,
        shutdown_grace_s=60.0,
        stats_file=stats_file,
        registry=exposed.registry,
    )
    try:
        report = agent.run(stop_event(), duration, fast_forward_s=fast_forward_s, progress=True)
    finally:
        exposed.close()
    if publisher.stats.failed or publisher.stats.in_flight:
        fail(f"{publisher.stats.failed} messages failed, {publisher.stats.in_flight} undelivered", 1)
    click.echo(
        f"published {report.samples} samples in {report.messages} messages, {report.contexts} contexts, "
        f"{report.topologies} topologies, {report.ground_truth} faults"
    )


@cli.command("process")
@click.option("--stats-file", type=click.Path(path_type=Path))
@metrics_port_option
@click.pass_context
def process_cmd(ctx: click.Context, stats_file: Path | None, metrics_port: int | None) -> None:
    """Run the stream processor (faust worker) until SIGTERM/Ctrl-C."""
    from processors.app import run_worker

    settings = resolved(ctx, influxdb=False)
    exposed = expose(settings, "process", metrics_port)
    try:
        run_worker(settings, stats_file, "info" if ctx.obj.get("verbose") else "warning", exposed.registry)
    finally:
        exposed.close()


@cli.command("sink")
@click.option(
    "--sink",
    "sink_name",
    default="influxdb",
    show_default=True,
    type=click.Choice(registry.names("sink")),
    help="The sink plugin: influxdb stores in InfluxDB; otlp sends to an OpenTelemetry Collector (otlp.endpoint).",
)
@click.option("--stats-file", type=click.Path(path_type=Path))
@metrics_port_option
@click.pass_context
def sink_cmd(ctx: click.Context, sink_name: str, stats_file: Path | None, metrics_port: int | None) -> None:
    """Store interpreted events and findings until SIGTERM/Ctrl-C: in InfluxDB (the ``influxdb`` sink plugin), or
    with ``--sink otlp`` as OTLP, health states too, to an OpenTelemetry Collector (docs/otlp.md)."""
    from pipeline.publisher import Publisher
    from sinks.base import Sink
    from sinks.runner import RunnerConfig, SinkRunner, sink_consumer

    settings = resolved(ctx, influxdb=sink_name == "influxdb")
    with errors():
        sink: Sink[object] = registry.create("sink", sink_name, settings)
    limits = cluster_limits(settings, settings.topics.dead_letter)
    dlq = Publisher(settings.kafka.client_config(), limits=limits)
    config = RunnerConfig.of(settings, limits.limit(settings.topics.dead_letter))
    exposed = expose(settings, "sink", metrics_port)
    consumer = sink_consumer(settings, sink.name)
    runner = SinkRunner(sink, consumer, dlq, config, stats_file, registry=exposed.registry)
    try:
        runner.run(stop_event())
    finally:
        sink.close()
        exposed.close()


@cli.command("run")
@click.option("--nodes", default=16, show_default=True, type=click.IntRange(1))
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64), help="GPUs per node.")
@click.option("--duration", default=60.0, show_default=True, type=click.FloatRange(1), help="Live seconds.")
@click.option(
    "--learn-minutes",
    default=15.0,
    show_default=True,
    type=click.FloatRange(2, 24 * 60),
    help="Simulated minutes of healthy history the baselines are learned from first.",
)
@click.option("--seed", default=0, show_default=True, help="The simulated fleet's seed.")
@click.option("--mix", default="default", show_default=True, help=MIX_HELP, callback=_mix)
@click.option("--down/--keep", default=False, help="Stop the local services at the end (default: keep, to look).")
@click.pass_context
def run_cmd(
    ctx: click.Context, nodes: int, gpus: int, duration: float, learn_minutes: float, seed: int, mix: str, down: bool
) -> None:
    """The main job: the whole system on a simulated fleet (learn, then live with faults), then a report."""
    from hermeneut.jobs.mainjob import main_job

    settings = settings_of(ctx)
    with errors():
        ok = main_job(settings, nodes, gpus, duration, down, learn_s=learn_minutes * 60, seed=seed, mix=mix)
    if not ok:
        sys.exit(1)
