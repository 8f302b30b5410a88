"""``hermeneut import <format>``: bring history in (one subcommand per importer in the registry).

Options are checked before anything starts (exit 2 with one line); then local services (when no external Kafka /
InfluxDB is configured), a processor and a sink for the import, the import with a progress bar, and a summary that
says what was stored, what was dead-lettered and why, and what to run next. Exit 0 when every row read is accounted
for (stored or dead-lettered), 1 when some are not (yet).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from hermeneut.cli.base import cli, errors, resolved, settings_of
from pipeline import registry, services
from pipeline.events import APPLICATIONS

F = TypeVar("F", bound=Callable[..., Any])

_PATHS = click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))


def common(f: F) -> F:
    """What every import takes: the cluster, resuming or starting over, and whether a pipeline runs already."""
    patience = "Seconds without progress before the import stops waiting for the pipeline."
    f = click.option("--patience", default=120.0, show_default=True, type=click.FloatRange(1), help=patience)(f)
    own = "Start a processor and a sink for the import (--no-pipeline: they already run)."
    f = click.option("--pipeline/--no-pipeline", default=True, show_default=True, help=own)(f)
    again = "Send everything again instead of resuming (after training: judge the history anew)."
    f = click.option("--restart", is_flag=True, help=again)(f)
    return click.option("--cluster", default=None, help="Cluster tag of the imported GPUs [default: settings].")(f)


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
            settings, name, options, inputs, pipeline=kw["pipeline"], restart=kw["restart"],
            patience_s=kw["patience"], echo=click.echo,
        )  # fmt: skip
    click.echo("\n".join(summary(outcome, settings, dashboard)))
    if not outcome.complete:
        ctx.exit(1)


@import_group.command("nvidia-smi-csv")
@_PATHS
@click.option("--node", help="The node the GPUs are on [default: each file's name].")
@click.option("--columns", help="The --query-gpu list of a log written with noheader (comma-separated).")
@click.option("--timezone", default="UTC", show_default=True, help="nvidia-smi prints local time: which zone.")
@click.option(
    "--gpus-per-timestamp",
    type=click.IntRange(1),
    help="A log without index/uuid/pci.bus_id: each time's N lines are GPUs 0..N-1 (nvidia-smi's order).",
)
@common
@click.pass_context
def nvsmi_csv_cmd(ctx: click.Context, /, paths: tuple[Path, ...], **kw: Any) -> None:
    """nvidia-smi --query-gpu=... --format=csv logs (any columns, with or without units and header)."""
    names = ("node", "columns", "timezone", "gpus_per_timestamp")
    _import(ctx, "nvidia-smi-csv", {"paths": paths} | {n: kw.pop(n) for n in names}, paths, kw)


@import_group.command("nvidia-smi-xml")
@_PATHS
@click.option("--node", help="The node the captures are from [default: each capture's folder name].")
@click.option("--timezone", default="UTC", show_default=True, help="nvidia-smi prints local time: which zone.")
@common
@click.pass_context
def nvsmi_xml_cmd(ctx: click.Context, /, paths: tuple[Path, ...], **kw: Any) -> None:
    """Folders (or files) of nvidia-smi -q -x captures, replayed through the NVML collector."""
    _import(ctx, "nvidia-smi-xml", {"paths": paths, "node": kw.pop("node"), "timezone": kw.pop("timezone")}, paths, kw)


@import_group.command("dcgm-exporter")
@_PATHS
@click.option("--node", help="The node of series without a Hostname label [default: each file's name].")
@click.option("--time", "time_", help="The time of files without timestamps (RFC 3339) [default: file mtime].")
@click.option("--application", type=click.Choice(APPLICATIONS), help="Application of the jobs the labels name.")
@common
@click.pass_context
def dcgm_cmd(ctx: click.Context, /, paths: tuple[Path, ...], **kw: Any) -> None:
    """Saved dcgm-exporter scrapes (one per file, or timestamped lines)."""
    options = {"paths": paths, "node": kw.pop("node"), "time": kw.pop("time_"), "application": kw.pop("application")}
    _import(ctx, "dcgm-exporter", options, paths, kw)


@import_group.command("amd-exporter")
@_PATHS
@click.option("--node", help="The node of series without a hostname label [default: each file's name].")
@click.option("--time", "time_", help="The time of files without timestamps (RFC 3339) [default: file mtime].")
@click.option("--application", type=click.Choice(APPLICATIONS), help="Application of the jobs the labels name.")
@common
@click.pass_context
def amd_cmd(ctx: click.Context, /, paths: tuple[Path, ...], **kw: Any) -> None:
    """Saved AMD device-metrics-exporter scrapes (one scrape per file)."""
    options = {"paths": paths, "node": kw.pop("node"), "time": kw.pop("time_"), "application": kw.pop("application")}
    _import(ctx, "amd-exporter", options, paths, kw)


@import_group.command("table")
@_PATHS
@click.option("--mapping", required=True, type=click.Path(exists=True, path_type=Path), help="The TOML mapping.")
@common
@click.pass_context
def table_cmd(ctx: click.Context, /, paths: tuple[Path, ...], **kw: Any) -> None:
    """CSV or parquet traces, read through a mapping file (time, GPU or pod, fields and units, context)."""
    mapping = kw.pop("mapping")
    _import(ctx, "table", {"paths": paths, "mapping": mapping}, (*paths, mapping), kw)


@import_group.command("prometheus")
@click.option("--url", required=True, help="The Prometheus server, e.g. http://prometheus:9090.")
@click.option("--start", required=True, help="Start of the range (RFC 3339).")
@click.option("--end", required=True, help="End of the range (RFC 3339).")
@click.option("--step", help="A regular grid (e.g. 60s) instead of the samples as stored.")
@click.option("--selector", help='Narrow every query, e.g. {Hostname=~"gpu0.*"}.')
@click.option("--node", help="The node of series without a Hostname label.")
@click.option("--application", type=click.Choice(APPLICATIONS), help="Application of the jobs the labels name.")
@common
@click.pass_context
def prometheus_cmd(ctx: click.Context, /, **kw: Any) -> None:
    """dcgm-exporter series (DCGM_FI_DEV_*, DCGM_FI_PROF_*) from a Prometheus server's HTTP API."""
    names = ("url", "start", "end", "step", "selector", "node", "application")
    _import(ctx, "prometheus", {n: kw.pop(n) for n in names}, (), kw)
