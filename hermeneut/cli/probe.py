"""``hermeneut probe links``: time copies between this node's GPUs (or, without a GPU, the host-staged copy) and
publish the figures as the node's topology facts (``NodeTopology.link_timings``), which ``hermeneut rightsize``
prices splits with. The measuring is :mod:`producers.linkprobe`; this wires it to the topology topic.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time

import click

from hermeneut.cli.base import cli, errors, fail, resolved
from pipeline.codec import CONTENT_TYPE, decode_record, encode_record
from pipeline.config import Settings
from pipeline.events import node_key
from pipeline.topology import LinkTiming, NodeTopology


@cli.group("probe")
def probe_group() -> None:
    """Measure this node's hardware for the advice (links between GPUs)."""


@probe_group.command("links")
@click.option(
    "--backend",
    type=click.Choice(["cuda", "host"]),
    default="cuda",
    show_default=True,
    help="cuda: GPU pairs through cuda-python (pip install 'hermeneut[linkprobe]'); host: the host-staged copy only.",
)
@click.option("--node", default=None, help="The node's name on the topology topic [default: this host's name].")
@click.option("--repeats", default=20, show_default=True, type=click.IntRange(3), help="Timed copies per size.")
@click.option("--publish/--no-publish", default=True, show_default=True, help="Put the figures on the topology topic.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_context
def links_cmd(ctx: click.Context, backend: str, node: str | None, repeats: int, publish: bool, fmt: str) -> None:
    """Time device-to-device, device-to-host-to-device and host-staged copies from 4 KiB to 64 MiB, synchronised,
    per GPU pair and path; fit bandwidth, latency and per-copy overhead; publish them on the node's topology."""
    from producers.linkprobe import HostCopier, cuda_copiers, probe

    node = node or socket.gethostname()
    settings = resolved(ctx, influxdb=False) if publish else None
    current = _topology(settings, node) if settings is not None else None
    with errors():
        if backend == "host":
            run = probe([HostCopier()], repeats=repeats, source="probe host numpy")
        else:
            try:
                uuids = [g.uuid for g in sorted(current.gpus, key=lambda g: g.index)] if current else []
                run = probe(
                    cuda_copiers(uuids, current.links if current else ()), repeats=repeats, source="probe cuda-python"
                )
            except RuntimeError as exc:
                fail(f"GPU probe: {exc}", 1)
    if fmt == "json":
        out = {
            "node": node,
            "cpu_s": run.cpu_s,
            "wall_s": run.wall_s,
            "timings": [dataclasses.asdict(t) for t in run.timings],
        }
        click.echo(json.dumps(out, indent=2))
    else:
        click.echo(format_timings(run.timings))
        click.echo(f"probe cost: {run.cpu_s:.2f} CPU-s, {run.wall_s:.2f} s wall")
    if settings is not None:
        base = current or NodeTopology(settings.cluster, node, time.time_ns(), ())
        topology = dataclasses.replace(base, ts_ns=time.time_ns(), link_timings=run.timings)
        _publish(settings, topology)
        click.echo(f"published {len(run.timings)} link timings on {settings.topics.topology} for {node}")


def format_timings(timings: tuple[LinkTiming, ...]) -> str:
    lines = [f"{'from':16} {'to':16} {'path':6} {'kind':12} {'GB/s':>8} {'latency us':>10} {'overhead us':>11}"]
    for t in timings:
        lines.append(
            f"{t.a[:16]:16} {t.b[:16]:16} {t.path:6} {t.kind:12} {t.bytes_per_second / 1e9:>8.2f} "
            f"{t.latency_s * 1e6:>10.1f} {t.overhead_s * 1e6:>11.1f}"
        )
    return "\n".join(lines)


def _topology(settings: Settings, node: str) -> NodeTopology | None:
    """The node's topology as the collector published it (its GPUs and paths), or None."""
    from pipeline.mirror import TopicMirror

    mirror = TopicMirror(
        settings.kafka.client_config(), settings.topics.topology, lambda v: decode_record(NodeTopology, v)
    ).start()
    try:
        if not mirror.wait_ready(settings.kafka.request_timeout_s):
            fail(f"could not read {settings.topics.topology} within {settings.kafka.request_timeout_s:.0f}s", 1)
        found: NodeTopology | None = mirror.get(node_key(settings.cluster, node))
        return found
    finally:
        mirror.stop()


def _publish(settings: Settings, topology: NodeTopology) -> None:
    from pipeline.publisher import Publisher

    publisher = Publisher(settings.kafka.client_config(), linger_ms=0)
    publisher.publish(
        settings.topics.topology, topology.kafka_key, encode_record(topology), [("content-type", CONTENT_TYPE)]
    )  # as the collector sends it
    if publisher.close(settings.kafka.request_timeout_s) or publisher.stats.failed:
        fail(f"not delivered to {settings.topics.topology}: {publisher.last_error or 'timed out'}", 1)
