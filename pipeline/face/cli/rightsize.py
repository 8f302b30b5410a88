"""``hermeneut rightsize``: per job or application, the smaller slice of GPU its measured usage needs.

The advice comes from :func:`pipeline.face.rightsizing.advise` (shared with the dashboard); this prints it as a table
or JSON.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from pipeline.events import APPLICATIONS
from pipeline.face.cli.base import cli, errors, resolved


@cli.command("rightsize")
@click.option("--job", help="One job id.")
@click.option("--application", type=click.Choice(APPLICATIONS), help="One application, across its runs.")
@click.option("--cluster", help="Only this cluster (default: every cluster in the bucket).")
@click.option("--range", "range_", default=None, help="How far back from --stop (Flux duration) [default: 7d].")
@click.option("--start", default=None, help="Start of the range (RFC 3339) instead of --range: imported history.")
@click.option("--stop", default=None, help="End of the range (RFC 3339; default now).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--headroom", default=0.2, show_default=True, type=click.FloatRange(0, 2), help="Memory/compute margin.")
@click.option(
    "--exchange-bytes",
    type=click.FloatRange(0, min_open=True),
    help="Bytes the model exchanges per step if split over several GPUs (gradients/activations): prices a split.",
)
@click.pass_context
def rightsize_cmd(
    ctx: click.Context,
    job: str | None,
    application: str | None,
    cluster: str | None,
    range_: str | None,
    start: str | None,
    stop: str | None,
    fmt: str,
    headroom: float,
    exchange_bytes: float | None,
) -> None:
    """Right-sizing advice from measured usage: a MIG profile, a smaller GPU, or packing jobs per GPU."""
    from pipeline.face.rightsizing import advise_and_gaps

    settings = resolved(ctx, kafka=False)
    with errors():
        advice, gaps = advise_and_gaps(settings, range_ or (None if start else "7d"), job, application, cluster,
                                       headroom, exchange_bytes, start, stop)  # fmt: skip
    for key, minutes in sorted(gaps.items()):
        click.echo(
            f"{key}: {minutes} GPU-minutes with utilization but no memory reading: not sized (right-sizing starts "
            "from memory used: import memory.used / DCGM_FI_DEV_FB_USED with it)"
        )
    if not advice:
        what = f"job {job}" if job else f"application {application}" if application else "any job"
        when = f"from {start} to {stop or 'now'}" if start else f"in the {range_ or '7d'} before {stop or 'now'}"
        if not gaps:
            click.echo(f"no usage of {what} {when} (job ids come from the workload context)")
        return
    if fmt == "json":
        click.echo(json.dumps([_jsonable(dataclasses.asdict(a)) for a in advice], indent=2))
        return
    click.echo(f"{'key':24} {'application':18} {'GPUs':>4} {'GPU-h':>8} {'used':>5} {'wasted':>8}  advice")
    for a in advice:
        s, best = a.stats, a.options[0]
        click.echo(
            f"{s.key[:24]:24} {(s.application or '-')[:18]:18} {s.gpus:>4} {s.gpu_hours:>8.1f} {a.used_share:>5.0%} "
            f"{a.wasted_gpu_hours:>8.1f}  {best.kind}: {best.target} ({best.detail})"
        )
    for a in advice:
        click.echo(f"\n{a.summary}")
        for o in a.options[1:]:
            click.echo(f"  also: {o.kind}: {o.target}, saves {o.saved_gpu_hours:.1f} GPU-h ({o.detail})")


def _jsonable(value: Any) -> Any:
    """NaN is not JSON: it becomes null."""
    if isinstance(value, float) and value != value:  # noqa: PLR0124
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
