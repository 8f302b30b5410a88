"""The ``hermeneut`` command: the face that wires the stages together. Only here do errors become exit codes.

Exit codes: 0 ok, 1 a run failed (data lost or a stage died), 2 invalid configuration or usage,
3 a local service could not be installed or started.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from pipeline import services
from pipeline.config import Settings, load_settings
from pipeline.errors import ConfigError, HermeneutError, ServiceError


def _fail(message: str, code: int) -> None:
    click.echo(f"hermeneut: {message}", err=True)
    sys.exit(code)


@contextmanager
def _errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        _fail(str(exc), 2)
    except ServiceError as exc:
        _fail(str(exc), 3)
    except HermeneutError as exc:
        _fail(str(exc), 1)


def _settings(ctx: click.Context) -> Settings:
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "settings" not in obj:
        with _errors():
            obj["settings"] = load_settings(obj.get("config"))
    settings: Settings = obj["settings"]
    return settings


def _resolved(ctx: click.Context, kafka: bool = True, influxdb: bool = True) -> Settings:
    """Settings with the local services' endpoints filled in, for the servers this command talks to."""
    with _errors():
        settings = services.resolve(_settings(ctx), kafka, influxdb)
        if kafka and not settings.kafka.bootstrap_servers:
            raise ConfigError("kafka.bootstrap_servers is empty")
        if influxdb and not (settings.influxdb.url and settings.influxdb.token):
            raise ConfigError("influxdb.url and influxdb.token are needed (HERMENEUT_INFLUXDB__URL/__TOKEN)")
        return settings


def _stop_event() -> threading.Event:
    """An event set by SIGTERM/SIGINT, so a stage drains and flushes instead of dying mid-batch."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", type=click.Path(path_type=Path), help="TOML settings file (else $HERMENEUT_CONFIG).")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
@click.pass_context
def cli(ctx: click.Context, config: Path | None, verbose: int) -> None:
    """hermeneut: GPU-fleet telemetry, interpreted in the context of the job on each GPU."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx.ensure_object(dict).update(config=config, verbose=verbose)


@cli.group("services")
def services_group() -> None:
    """Local Kafka and InfluxDB (installed and cached on first use)."""


@services_group.command("up")
@click.pass_context
def services_up(ctx: click.Context) -> None:
    """Install (first time), start and onboard the local services."""
    settings = _settings(ctx)
    with _errors():
        services.up(settings)
    for name, line in services.status(settings).items():
        click.echo(f"{name:9} {line}")


@services_group.command("status")
@click.pass_context
def services_status(ctx: click.Context) -> None:
    """Where the services are and whether they answer."""
    with _errors():
        lines = services.status(_settings(ctx))
    for name, line in lines.items():
        click.echo(f"{name:9} {line}")


@services_group.command("down")
@click.pass_context
def services_down(ctx: click.Context) -> None:
    """Stop the local services (their data and logs are kept)."""
    with _errors():
        services.down(_settings(ctx))


@cli.command("topics")
@click.pass_context
def topics_cmd(ctx: click.Context) -> None:
    """Create the pipeline's topics (idempotent)."""
    from pipeline.topics import ensure_topics, topic_specs

    settings = _resolved(ctx, influxdb=False)
    with _errors():
        created = ensure_topics(
            settings.kafka.client_config(), topic_specs(settings), timeout_s=settings.kafka.request_timeout_s
        )
    click.echo(f"created: {', '.join(created) or 'none (all existed)'}")


@cli.command("simulate")
@click.option("--nodes", default=16, show_default=True, type=click.IntRange(1))
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64), help="GPUs per node.")
@click.option("--duration", type=click.FloatRange(0), help="Seconds to run (default: until Ctrl-C).")
@click.option("--seed", default=0, show_default=True)
@click.option("--stats-file", type=click.Path(path_type=Path))
@click.pass_context
def simulate_cmd(
    ctx: click.Context, nodes: int, gpus: int, duration: float | None, seed: int, stats_file: Path | None
) -> None:
    """Publish a simulated fleet's samples to the raw topic in real time."""
    from pipeline.publisher import Publisher
    from producers.simulator import Fleet
    from producers.simulator.run import run_simulation

    settings = _resolved(ctx, influxdb=False)
    fleet = Fleet(nodes, gpus, cluster=settings.cluster, seed=seed)
    publisher = Publisher(settings.kafka.client_config())
    report = run_simulation(
        fleet, publisher, settings.topics.raw, settings.sample_interval_s, _stop_event(), duration, stats_file
    )
    if publisher.stats.failed or publisher.stats.in_flight:
        _fail(f"{publisher.stats.failed} samples failed, {publisher.stats.in_flight} undelivered", 1)
    click.echo(f"published {report.samples} samples in {report.messages} messages")


@cli.command("process")
@click.option("--stats-file", type=click.Path(path_type=Path))
@click.pass_context
def process_cmd(ctx: click.Context, stats_file: Path | None) -> None:
    """Run the stream processor (faust worker) until SIGTERM/Ctrl-C."""
    from processors.app import run_worker

    settings = _resolved(ctx, influxdb=False)
    run_worker(settings, stats_file, loglevel="info" if ctx.obj.get("verbose") else "warning")


@cli.command("sink")
@click.option("--stats-file", type=click.Path(path_type=Path))
@click.pass_context
def sink_cmd(ctx: click.Context, stats_file: Path | None) -> None:
    """Store interpreted events in InfluxDB until SIGTERM/Ctrl-C."""
    from pipeline.publisher import Publisher
    from sinks.influxdb import InfluxWriter
    from sinks.runner import InfluxSink

    settings = _resolved(ctx)
    i = settings.influxdb
    assert i.url and i.token  # checked by _resolved
    writer = InfluxWriter(i.url, i.token.get_secret_value(), i.org, i.bucket, i.timeout_s)
    sink = InfluxSink(settings, writer, Publisher(settings.kafka.client_config()), stats_file=stats_file)
    sink.run(_stop_event())
    writer.close()


@cli.command("trend")
@click.option("--field", "field_", default="power_watts", show_default=True, help="Metric field to aggregate.")
@click.option("--by", default="gpu_model", show_default=True, help="Tag to group by.")
@click.option("--every", default="10s", show_default=True, help="Aggregation window (Flux duration).")
@click.option("--range", "range_", default="15m", show_default=True, help="How far back (Flux duration).")
@click.option("--fn", default="mean", show_default=True, type=click.Choice(["mean", "max", "min", "median", "count"]))
@click.pass_context
def trend_cmd(ctx: click.Context, field_: str, by: str, every: str, range_: str, fn: str) -> None:
    """A historical trend read back from InfluxDB, one row per window and group."""
    from sinks.query import TrendQuery, format_table, run_trend

    settings = _resolved(ctx, kafka=False)
    with _errors():
        rows = run_trend(settings, TrendQuery(field_, by, every, range_, fn))
    click.echo(format_table(rows, by, f"{fn}({field_})"))


@cli.command("run")
@click.option("--nodes", default=16, show_default=True, type=click.IntRange(1))
@click.option("--gpus", default=8, show_default=True, type=click.IntRange(1, 64), help="GPUs per node.")
@click.option("--duration", default=60.0, show_default=True, type=click.FloatRange(1), help="Seconds of simulation.")
@click.option("--down/--keep", default=False, help="Stop the local services at the end (default: keep, to look).")
@click.pass_context
def run_cmd(ctx: click.Context, nodes: int, gpus: int, duration: float, down: bool) -> None:
    """The main job: services up, simulated fleet -> Kafka -> processor -> InfluxDB, then a report."""
    from pipeline.mainjob import main_job

    settings = _settings(ctx)
    with _errors():
        ok = main_job(settings, nodes=nodes, gpus=gpus, duration_s=duration, stop_services=down)
    if not ok:
        sys.exit(1)


def main() -> None:
    cli(prog_name="hermeneut")


if __name__ == "__main__":
    main()
