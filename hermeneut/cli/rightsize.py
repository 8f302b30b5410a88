"""``hermeneut rightsize``: per job or application, the smaller slice of GPU its measured usage needs, and the three
sizing questions answered: the smallest GPU (or MIG profile) that holds it, how many smaller GPUs a split needs, and
what each added GPU costs per step on each link kind the fleet has (with the terms that make it up).

The advice comes from :func:`hermeneut.views.rightsizing.advise` (shared with the dashboard); this prints it as a table
or JSON.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import click

from hermeneut.cli.base import cli, errors, resolved
from pipeline.catalogue import MODELS, ModelDims, model_dims
from pipeline.events import APPLICATIONS

_DIMS = re.compile(r"^hidden=(\d+),layers=(\d+),params=(\d+)(?:,dtype-bytes=(\d))?$")


def parse_model_dims(text: str) -> ModelDims:
    """``hidden=768,layers=12,params=124000000[,dtype-bytes=4]``: a model that is not in the catalogue."""
    found = _DIMS.match(text.replace(" ", ""))
    if found is None:
        raise click.BadParameter("expected hidden=N,layers=N,params=N[,dtype-bytes=N]", param_hint="--model-dims")
    hidden, layers, params = (int(found[i]) for i in (1, 2, 3))
    return ModelDims("--model-dims", hidden, layers, params, int(found[4] or 2), f"--model-dims {text}")


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
    "--model",
    "model_name",
    type=click.Choice([m.name for m in MODELS]),
    help="The model the job runs (catalogue dimensions): prices a split from what it hands on.",
)
@click.option("--model-dims", help="A model not in the catalogue: hidden=N,layers=N,params=N[,dtype-bytes=N].")
@click.option("--tokens", default=512, show_default=True, type=click.IntRange(1), help="Tokens per sequence.")
@click.option(
    "--training/--inference",
    "training",
    default=None,
    help="Whether the job trains (gradients back, a data-parallel all-reduce) [default: its application says].",
)
@click.option(
    "--links",
    "links_from",
    type=click.Choice(["fleet", "published"]),
    default="fleet",
    show_default=True,
    help="Link figures: the fleet's (topology topic: kinds and probe timings) or every published kind.",
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
    model_name: str | None,
    model_dims: str | None,
    tokens: int,
    training: bool | None,
    links_from: str,
) -> None:
    """Right-sizing advice from measured usage (a MIG profile, packing, a smaller GPU, a split), and per job the
    smallest GPU that holds it, how many smaller ones a split needs, and what each added GPU costs per link kind."""
    from hermeneut.views.rightsizing import advise_and_gaps, answer_lines, fleet_links
    from pipeline.catalogue import PUBLISHED_LINKS
    from processors.rightsize import Link, published_link

    if model_name and model_dims:
        raise click.UsageError("give --model or --model-dims, not both")
    model = _model(model_name) if model_name else parse_model_dims(model_dims) if model_dims else None
    settings = resolved(ctx, kafka=False)
    with errors():
        notes: list[str] = []

        def links() -> dict[str, Link]:
            """Read once there is a job to advise (the topology topic may wait for Kafka)."""
            if links_from == "published":
                notes.append("every published link kind (--links published)")
                return {k: published_link(f) for k, f in PUBLISHED_LINKS.items()}
            found, note = fleet_links(settings)
            notes.append(note)
            return found

        advice, gaps = advise_and_gaps(
            settings,
            range_ or (None if start else "7d"),
            job,
            application,
            cluster,
            headroom,
            start,
            stop,
            model,
            tokens,
            training,
            links,
        )
    links_note = notes[0] if notes else ""
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
        click.echo(json.dumps([_jsonable(_as_dict(a)) for a in advice], indent=2))
        return
    click.echo(f"{'key':24} {'application':18} {'GPUs':>4} {'GPU-h':>8} {'used':>5} {'wasted':>8}  advice")
    for a in advice:
        s, best = a.stats, a.options[0]
        click.echo(
            f"{s.key[:24]:24} {(s.application or '-')[:18]:18} {s.gpus:>4} {s.gpu_hours:>8.1f} {a.used_share:>5.0%} "
            f"{a.wasted_gpu_hours:>8.1f}  {best.kind}: {best.target} ({best.detail})"
        )
    click.echo(f"\nlinks: {links_note}")
    for a in advice:
        click.echo(f"\n{a.summary}")
        for o in a.options[1:]:
            saves = f", saves {o.saved_gpu_hours:.1f} GPU-h" if o.saved_gpu_hours > 0 else ""
            click.echo(f"  also: {o.kind}: {o.target}{saves} ({o.detail})")
        for line in answer_lines(a):
            click.echo(f"  {line}")


def _model(name: str) -> ModelDims:
    found = model_dims(name)
    assert found is not None  # click.Choice checked it
    return found


def _as_dict(advice: Any) -> dict[str, Any]:
    """The advice as JSON: the dataclasses, and each split cost's terms, which are properties."""
    out = dataclasses.asdict(advice)
    if advice.answers is not None:
        out["answers"]["costs"] = [
            dataclasses.asdict(c)
            | {
                "transfer_s": c.transfer_s,
                "latency_s": c.latency_s,
                "overhead_s": c.overhead_s,
                "total_s": c.total_s,
                "per_added_gpu_s": c.per_added_gpu_s,
            }
            for c in advice.answers.costs
        ]
    return out


def _jsonable(value: Any) -> Any:
    """NaN is not JSON: it becomes null."""
    if isinstance(value, float) and value != value:  # noqa: PLR0124
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
