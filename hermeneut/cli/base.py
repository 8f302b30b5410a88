"""What every ``hermeneut`` command shares: the top-level group, settings resolution, errors -> exit codes.

Only the CLI turns exceptions into exit codes: 0 ok, 1 a run failed (data lost or a stage died), 2 invalid
configuration or usage, 3 a local service could not be installed or started, 4 a run cut short gives no result
(IncompleteRun), 128 + N a run stopped by signal N (RunInterrupted: 130 SIGINT, 143 SIGTERM).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from prometheus_client import CollectorRegistry

from pipeline import services
from pipeline.config import Settings, load_settings
from pipeline.errors import (
    ConfigError,
    HermeneutError,
    IncompleteRun,
    InvalidInput,
    InvalidQuery,
    RunInterrupted,
    ServiceError,
)
from pipeline.kafka_auth import check_credentials
from pipeline.metrics import MetricsServer, serve, stage_registry
from pipeline.sizing import Limits, read_limits

log = logging.getLogger(__name__)


def fail(message: str, code: int) -> None:
    click.echo(f"hermeneut: {message}", err=True)
    sys.exit(code)


@contextmanager
def errors() -> Iterator[None]:
    try:
        yield
    except ConfigError as exc:
        fail(str(exc), 2)
    except ServiceError as exc:
        fail(str(exc), 3)
    except InvalidQuery as exc:
        fail(str(exc), 1)
    except InvalidInput as exc:
        fail(str(exc), 2)
    except RunInterrupted as exc:
        fail(str(exc), 128 + exc.signum)
    except IncompleteRun as exc:
        fail(str(exc), 4)
    except HermeneutError as exc:
        fail(str(exc), 1)


def settings_of(ctx: click.Context) -> Settings:
    obj: dict[str, Any] = ctx.ensure_object(dict)
    if "settings" not in obj:
        with errors():
            obj["settings"] = load_settings(obj.get("config"))
    settings: Settings = obj["settings"]
    return settings


def resolved(ctx: click.Context, kafka: bool = True, influxdb: bool = True) -> Settings:
    """Settings with the local services' endpoints filled in, for the servers this command talks to."""
    with errors():
        settings = services.resolve(settings_of(ctx), kafka, influxdb)
        if kafka and not settings.kafka.bootstrap_servers:
            raise ConfigError("kafka.bootstrap_servers is empty")
        if kafka:  # a refused login would otherwise be retried silently for ever
            check_credentials(settings.kafka.client_config(), settings.kafka.request_timeout_s)
        if influxdb and not (settings.influxdb.url and settings.influxdb.token):
            raise ConfigError("influxdb.url and influxdb.token are needed (HERMENEUT_INFLUXDB__URL/__TOKEN)")
        return settings


F = TypeVar("F", bound=Callable[..., Any])


def metrics_port_option(f: F) -> F:
    """``--metrics-port``: where this stage serves /metrics, over ``metrics.<stage>_port``."""
    option = click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        help="Port of /metrics on metrics.host (default: metrics.<stage>_port; 0: any free port).",
    )
    return option(f)


@dataclass
class Exposed:
    """A stage's metrics registry and, unless ``metrics.enabled`` is off, the server of its /metrics."""

    registry: CollectorRegistry
    server: MetricsServer | None

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def expose(settings: Settings, stage: str, port: int | None) -> Exposed:
    """The registry of ``stage``, served on ``metrics.host`` and ``port`` (None: the stage's configured port);
    the URL is printed on stderr. A port in use exits with code 2 and one line."""
    registry = stage_registry(stage)
    if not settings.metrics.enabled:
        return Exposed(registry, None)
    with errors():
        server = serve(registry, settings.metrics.host, settings.metrics.port(stage) if port is None else port, stage)
    click.echo(f"{stage}: metrics on {server.url}", err=True)
    return Exposed(registry, server)


def stop_event() -> threading.Event:
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


def cluster_limits(settings: Settings, *topics: str, fallback: bool = False) -> Limits:
    """The size limits of the topics a command writes, read from the cluster at start-up (pipeline.sizing): every
    record it builds is sized to them, so a deployment with other limits than Kafka's defaults works too.

    ``fallback``: a node agent starts while Kafka is away (it buffers until the broker is back), sized to Kafka's
    defaults, with a warning; other commands stop with one line."""
    timeout_s = min(settings.kafka.request_timeout_s, 5.0) if fallback else settings.kafka.request_timeout_s
    try:
        return read_limits(settings.kafka.client_config(), topics, timeout_s)
    except ServiceError as exc:
        if not fallback:
            fail(str(exc), 3)
        log.warning("%s; sizing records to Kafka's default limits", exc)
        return Limits()
