"""``hermeneut web``: serve the HTTP API (pipeline/web) until Ctrl-C / SIGTERM."""

from __future__ import annotations

import click

from hermeneut.cli.base import cli, errors, expose, metrics_port_option, resolved, settings_of
from pipeline import services
from pipeline.errors import ConfigError


@cli.command("web")
@click.option("--host", default=None, help="Address to listen on [default: web.host, 127.0.0.1].")
@click.option("--port", default=None, type=click.IntRange(1, 65535), help="Port [default: web.port, 8080].")
@metrics_port_option
@click.pass_context
def web_cmd(ctx: click.Context, host: str | None, port: int | None, metrics_port: int | None) -> None:
    """Serve the HTTP API; a bearer token is required unless it listens on loopback only."""
    from aiohttp import web

    from hermeneut.web.app import create_app, is_loopback, token_path

    try:
        settings = services.resolve(settings_of(ctx))
    except ConfigError:
        # no Kafka yet: the API serves what InfluxDB holds, live data says why it is unavailable until Kafka is up
        settings = resolved(ctx, kafka=False)
    w = settings.web.model_copy(update={k: v for k, v in (("host", host), ("port", port)) if v is not None})
    settings = settings.model_copy(update={"web": w})
    exposed = expose(settings, "web", metrics_port)
    with errors():
        app = create_app(settings, registry=exposed.registry)
    if settings.web.token is not None:
        click.echo("clients send Authorization: Bearer <web.token>")
    elif not is_loopback(w.host):
        click.echo(f"clients send Authorization: Bearer <token in {token_path(settings)}>")
    try:
        web.run_app(app, host=w.host, port=w.port, print=lambda _: click.echo(f"serving http://{w.host}:{w.port}"))
    finally:
        exposed.close()
