"""``hermeneut rightsize``'s model and link options, ``hermeneut probe links`` on the CPU path, and the probe's
figures as topology facts (on the wire and as the links the advice prices a split with)."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.cli.rightsize import parse_model_dims
from hermeneut.views.rightsizing import links_of
from pipeline.catalogue import PUBLISHED_LINKS
from pipeline.codec import decode_record, encode_record
from pipeline.topology import LinkTiming, NodeTopology, TopologyGpu, TopologyLink

TIMING = LinkTiming("G0", "G1", "d2d", "nvlink", 40e9, 3e-6, 7e-6, 8, "probe cuda-python")


def node(timings: tuple[LinkTiming, ...] = (), link: str = "NV12") -> NodeTopology:
    gpus = (TopologyGpu("G0", 0, "NVIDIA H100 80GB HBM3", "0000:01:00.0"),
            TopologyGpu("G1", 1, "NVIDIA H100 80GB HBM3", "0000:02:00.0"))  # fmt: skip
    return NodeTopology("dc1", "n1", 1, gpus, (TopologyLink("G0", "G1", link),), link_timings=timings)


@pytest.mark.parametrize("args", [["rightsize"], ["probe"], ["probe", "links"]])
def test_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


def test_model_dims_are_parsed_or_refused_in_one_line() -> None:
    m = parse_model_dims("hidden=4096, layers=32, params=8030000000")
    assert (m.hidden, m.layers, m.params, m.dtype_bytes) == (4096, 32, 8_030_000_000, 2)
    assert parse_model_dims("hidden=768,layers=12,params=124439808,dtype-bytes=4").activation_bytes(12) == 12 * 768 * 4
    with pytest.raises(click.BadParameter):
        parse_model_dims("hidden=768")
    both = CliRunner().invoke(cli, ["rightsize", "--model", "gpt2", "--model-dims", "hidden=1,layers=1,params=1"])
    assert both.exit_code == 2 and "not both" in both.output


def test_probe_links_on_the_host_prints_its_figures_and_its_cost() -> None:
    result = CliRunner().invoke(cli, ["probe", "links", "--backend", "host", "--no-publish", "--format", "json",
                                      "--repeats", "3", "--node", "n1"])  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    (t,) = out["timings"]
    assert out["node"] == "n1" and out["cpu_s"] > 0 and t["path"] == "host" and t["bytes_per_second"] > 0
    table = CliRunner().invoke(cli, ["probe", "links", "--backend", "host", "--no-publish", "--repeats", "3"])
    assert table.exit_code == 0 and "overhead us" in table.output and "CPU-s" in table.output


def test_link_timings_travel_on_the_topology_and_old_records_still_decode() -> None:
    topology = node((TIMING,))
    assert decode_record(NodeTopology, encode_record(topology)) == topology
    old = encode_record(node())  # a collector that knows no timings sends none: the default
    assert decode_record(NodeTopology, old).link_timings == ()


def test_the_fleet_links_are_its_kinds_measured_where_probed() -> None:
    links, note = links_of([node((TIMING,))])
    assert set(links) == {"nvlink"} and links["nvlink"].latency_s == 3e-6 and "measured by the probe: nvlink" in note
    links, note = links_of([node(link="SYS")])
    assert set(links) == {"sys"} and links["sys"].latency_s == PUBLISHED_LINKS["sys"].latency_s
    assert "measured by the probe: none" in note
    links, note = links_of([])
    assert set(links) == set(PUBLISHED_LINKS) and "every published link kind" in note
