"""Iterate commands: ``baselines train`` / ``baselines list`` (learned baselines) and ``feedback`` (operators'
verdicts on events, used by the next training)."""

from __future__ import annotations

import getpass
import time
from collections import Counter

import click

from hermeneut.cli.base import cli, errors, fail, resolved
from pipeline.vocab import parse_seconds


@cli.group("baselines")
def baselines_group() -> None:
    """Learned baselines per application, GPU model and phase."""


@baselines_group.command("train")
@click.option("--range", "range_", default="24h", show_default=True, help="How much history to learn from.")
@click.option("--stop", help="End of that history (RFC 3339; default now): imported history is in the past.")
@click.option("--min-samples", type=click.IntRange(20), help="Rows a baseline needs (default: settings).")
@click.option("--stride", help="Read one sample per GPU per window (Flux duration, e.g. 10s) for long ranges.")
@click.option(
    "--cluster",
    help="Learn only from this cluster tag's history; other clusters' baselines are kept (default: every cluster).",
)
@click.pass_context
def train_cmd(
    ctx: click.Context,
    range_: str,
    stop: str | None,
    min_samples: int | None,
    stride: str | None,
    cluster: str | None,
) -> None:
    """Learn from history in InfluxDB, publish a new version (running processors reload it), write the bands."""
    from hermeneut.jobs.training import train
    from sinks.query.model import parse_time

    with errors():
        seconds = parse_seconds(range_, "--range")
        stop_ns = parse_time(stop, "--stop") if stop else None
    settings = resolved(ctx)
    with errors():
        report = train(settings, seconds, min_samples, stride, stop_ns, echo=click.echo, cluster=cluster)
    click.echo(
        f"read {report.rows} samples ({report.rows_inferred} with an inferred application, not used; "
        f"{report.rows_excluded} excluded{_reasons(report.excluded_by)}; {report.feedback_used} feedback events used)"
    )
    for bid, n in sorted(report.baselines.items()):
        click.echo(f"  {bid:70} {n:>9} samples")
    for bid, n in sorted(report.skipped.items()):
        click.echo(f"  {bid:70} {n:>9} samples: too few, judged by its prior")
    if report.classifier_accuracy is not None:
        classes = ", ".join(report.classifier_classes)
        click.echo(f"classifier: {classes}; held-out window accuracy {report.classifier_accuracy:.3f}")
    if not report.published:
        fail("no baseline had enough samples; nothing published", 1)
    click.echo(f"published version {report.version}; {report.bands_written} band points written to InfluxDB")
    if report.kept:
        click.echo(f"kept {report.kept} baselines of other clusters, unchanged (without --cluster: relearn all)")


@baselines_group.command("list")
@click.pass_context
def list_cmd(ctx: click.Context) -> None:
    """The version running processors use, its training range and what it covers."""
    from pipeline.baselines import CLASSIFIER_KEY, MANIFEST_KEY, BaselineManifest, BaselineRecord, ClassifierRecord
    from pipeline.mirror import TopicMirror
    from processors.baselines.store import decode_baselines_record

    settings = resolved(ctx, influxdb=False)
    with errors():
        mirror = TopicMirror(settings.kafka.client_config(), settings.topics.baselines, decode_baselines_record)
        mirror.start()
    try:
        mirror.wait_ready(30)
        state = mirror.snapshot()
    finally:
        mirror.stop()
    manifest = state.get(MANIFEST_KEY)
    if not isinstance(manifest, BaselineManifest):
        click.echo("no baselines published yet: rows stay unscored (run `hermeneut baselines train`)")
        return
    fmt = "%Y-%m-%d %H:%M:%S"
    click.echo(
        f"version {manifest.version}, trained {time.strftime(fmt, time.gmtime(manifest.trained_ns / 1e9))} UTC "
        f"from {time.strftime(fmt, time.gmtime(manifest.range_start_ns / 1e9))} to "
        f"{time.strftime(fmt, time.gmtime(manifest.range_end_ns / 1e9))} UTC; "
        f"{manifest.feedback_used} feedback events, {manifest.rows_excluded} samples excluded"
    )
    click.echo(f"{'baseline':70} {'samples':>9} {'unusual':>8} {'anomalous':>9} features")
    for bid in manifest.ids:
        r = state.get(bid.encode())
        if isinstance(r, BaselineRecord):
            click.echo(f"{bid:70} {r.n:>9} {r.unusual:>8.2f} {r.anomalous:>9.2f} {len(r.features)}")
    classifier = state.get(CLASSIFIER_KEY)
    if manifest.classifier and isinstance(classifier, ClassifierRecord):
        click.echo(
            f"classifier: {', '.join(classifier.classes)}; window {classifier.window} samples, "
            f"held-out accuracy {classifier.holdout_accuracy:.3f}, unknown below {classifier.min_confidence:.2f}"
        )


@cli.command("feedback")
@click.argument("event_id")
@click.option("--anomalous/--not-anomalous", "anomalous", required=True, help="Your verdict on the event.")
@click.option("--note", default="", help="Why (kept with the feedback).")
@click.option("--user", default=None, help="Who says so (default: the login name).")
@click.pass_context
def feedback_cmd(ctx: click.Context, event_id: str, anomalous: bool, note: str, user: str | None) -> None:
    """Mark an interpreted event (<gpu uuid>@<epoch ms>) as anomalous or not; the next training uses it."""
    from pipeline.baselines import Feedback, parse_event_id
    from pipeline.codec import encode_record
    from pipeline.publisher import Publisher
    from sinks.influxdb.lines import feedback_line
    from sinks.influxdb.write import InfluxWriter
    from sinks.query.history import stored_event

    try:
        gpu, ts_ms = parse_event_id(event_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="EVENT_ID") from exc
    settings = resolved(ctx)
    with errors():
        event = stored_event(settings, gpu, ts_ms)
    if event is None:
        fail(f"no stored event {event_id} (GPU {gpu} at {ts_ms} ms) in InfluxDB", 1)
        return
    fb = Feedback(
        event_id=event_id,
        cluster=event.cluster,
        node=event.node,
        gpu_uuid=gpu,
        event_ts_ms=ts_ms,
        verdict="anomalous" if anomalous else "not-anomalous",
        ts_ns=time.time_ns(),
        application=event.application,
        gpu_model=event.gpu_model,
        note=note,
        user=user or getpass.getuser(),
    )
    pub = Publisher(settings.kafka.client_config())
    pub.publish(settings.topics.feedback, event_id.encode(), encode_record(fb))
    if pub.close(30) or pub.stats.failed:
        fail(f"could not publish the feedback to {settings.topics.feedback}: {pub.last_error}", 1)
    writer = InfluxWriter.from_settings(settings.influxdb)
    try:
        writer.write([feedback_line(fb)])
    finally:
        writer.close()
    was = f"{event.verdict}" + (f": {event.explanation}" if event.explanation else "")
    click.echo(f"recorded {event_id} as {fb.verdict} (the pipeline said {was}); the next training uses it")


_REASON = {"fault findings": "in fault findings", "marked anomalous": "near events marked anomalous"}


def _reasons(counts: Counter[str]) -> str:
    """Why rows were left out of training, e.g. `` (40 in fault findings)``; empty when none were."""
    said = ", ".join(f"{n} {_REASON[why]}" for why, n in sorted(counts.items()) if n)
    return f" ({said})" if said else ""
