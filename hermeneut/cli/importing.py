"""``hermeneut import <format>``: bring history in (one subcommand per importer in the registry).

Options are checked before anything starts (exit 2 with one line); then local services (when no external Kafka /
InfluxDB is configured), a processor and a sink for the import, the import with a progress bar, and a summary that
says what was stored, what was dead-lettered and why, and what to run next. Exit 0 when every row read is accounted
for (stored or dead-lettered), 1 when some are not (yet).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Final

import click

from hermeneut.cli.base import cli, errors, resolved, settings_of
from pipeline import registry, services
from pipeline.registry import FLAG, Flag

#: what every import takes besides its importer's settings: the cluster, resuming or starting over, whether a
#: pipeline runs already, how long to wait for it
COMMON: Final = (
    click.Option(["--cluster"], default=None, help="Cluster tag of the imported GPUs [default: settings]."),
    click.Option(["--restart"], is_flag=True,
                 help="Send everything again instead of resuming (after training: judge the history anew)."),
    click.Option(["--pipeline/--no-pipeline"], default=True, show_default=True,
                 help="Start a processor and a sink for the import (--no-pipeline: they already run)."),
    click.Option(["--patience"], default=120.0, show_default=True, type=click.FloatRange(1),
                 help="Seconds without progress before the import stops waiting for the pipeline."),
)  # fmt: skip


@cli.group("import")
def import_group() -> None:
    """Import history: Prometheus, dcgm-exporter and AMD exporter scrapes, nvidia-smi CSV logs and XML captures,
    CSV/parquet traces."""


def _import(
    ctx: click.Context, name: str, options: dict[str, Any], inputs: tuple[Path, ...], kw: dict[str, Any]
) -> None:
    from hermeneut.jobs.importjob import run_import, summary

    options = {k: v for k, v in options.items() if v not in (None, "", ())} | (
        {"cluster": kw["cluster"]} if kw.get("cluster") else {}
    )
    base = settings_of(ctx)
    with errors():
        registry.create("importer", name, base, **options)  # options checked before anything is started
        if base.uses_local_kafka or base.uses_local_influxdb:
            services.up(base)
    settings = resolved(ctx)
    dashboard = None
    with errors():
        # the dashboard's address if one runs; an import never starts one (`services up --no-web` meant none)
        state = services.read_state(base)
        web = state.web if state is not None else None
        dashboard = web["url"] if web and services.web_healthy(web["url"]) else None
        outcome = run_import(
            settings,
            name,
            options,
            inputs,
            pipeline=kw["pipeline"],
            restart=kw["restart"],
            patience_s=kw["patience"],
            echo=click.echo,
        )
    click.echo("\n".join(summary(outcome, settings, dashboard)))
    if not outcome.complete:
        ctx.exit(1)


def importer_command(name: str) -> click.Command:
    """``hermeneut import <name>``, built from the importer's Config: each field declared with
    :func:`pipeline.registry.setting` is an option (or the positional files), with its help, choices and bounds."""
    plugin = registry.load("importer", name)
    flags = [(f.name, f.metadata[FLAG], f.default) for f in dataclasses.fields(plugin.Config) if FLAG in f.metadata]
    params: list[click.Parameter] = [_parameter(field, flag, default) for field, flag, default in flags]

    @click.pass_context
    def run(ctx: click.Context, /, **kw: Any) -> None:
        options = {field: kw.pop(field) for field, _, _ in flags}
        inputs = tuple(p for field, flag, _ in flags if flag.input for p in _paths(options[field]))
        _import(ctx, name, options, inputs, kw)

    return click.Command(name, callback=run, params=[*params, *COMMON], help=getattr(plugin, "description", None))


def _parameter(field: str, flag: Flag, default: Any) -> click.Parameter:
    """A Config field's command-line parameter (not given: None, so the Config's default holds)."""
    if flag.argument:
        return click.Argument([field], nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
    kind: click.ParamType | None = None
    if flag.choices:
        kind = click.Choice(flag.choices)
    elif flag.input:
        kind = click.Path(exists=True, path_type=Path)
    elif isinstance(default, int) and not isinstance(default, bool):
        kind = click.IntRange(flag.minimum) if flag.minimum is not None else click.INT
    elif isinstance(default, float):
        kind = click.FloatRange(flag.minimum) if flag.minimum is not None else click.FLOAT
    told = f" [default: {default}]" if default not in ("", None, 0) and not flag.required else ""
    return click.Option(
        [f"--{field.replace('_', '-')}", field], type=kind, required=flag.required, default=None, help=flag.help + told
    )


def _paths(value: Any) -> tuple[Path, ...]:
    return tuple(value) if isinstance(value, tuple) else (value,) if value is not None else ()


for _name in registry.names("importer"):
    import_group.add_command(importer_command(_name))
