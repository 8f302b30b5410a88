"""A mixed NVIDIA + AMD fleet on one dashboard (issue 41), in a real headless Chromium against ``create_app``: the
simulator's ``nvidia-amd`` mix (HGX H100 and A100 nodes beside an 8-GPU MI300X node, each AMD GPU reporting what
AMD's exporter gives) goes through the real Kafka, processor and sink into InfluxDB. The fleet view shows every GPU
of both vendors and filters by model; an AMD GPU's view draws its readings and names the detectors its readings
cannot feed (NVLink, PCIe width, XIDs, ...), as the API says.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from playwright.sync_api import Page, expect

from hermeneut.web.app import create_app, serving
from pipeline.config import Settings
from pipeline.services.stages import wait_for
from producers.simulator import Fleet
from tests.webserver import get_json

from .conftest import READY, InfluxServer, KafkaServer, isolated_settings
from .harness import running_pipeline, simulating

pytestmark = pytest.mark.integration

MI300X = "AMD Instinct MI300X"
HISTORY_S = 120


@dataclass
class Mixed:
    url: str
    fleet: Fleet
    amd_uuid: str


@pytest.fixture(scope="module")
def mixed(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Mixed]:
    run_dir = tmp_path_factory.mktemp("mixed")
    settings = isolated_settings(kafka_server, influx_server, defaults, run_dir / "state")
    fleet = Fleet(3, 8, cluster=settings.cluster, seed=2, extras=True, mix="nvidia-amd")
    assert {m.vendor for m in fleet.model} == {"nvidia", "amd"}, [k.name for k in fleet.kinds]
    with ExitStack() as stack:
        stages = stack.enter_context(running_pipeline(settings, run_dir / "pipeline"))
        stack.enter_context(simulating(settings, fleet, HISTORY_S))
        sink = stages[1]
        assert wait_for(lambda: sink.stats().get("points_written", 0) >= HISTORY_S * fleet.size, 180), sink.stats()
        url = stack.enter_context(serving(create_app(settings)))
        amd = next(u for u, m in zip(fleet.uuids, fleet.model, strict=True) if m.name == MI300X)
        yield Mixed(url, fleet, amd)


def test_both_vendors_on_one_fleet_view(page: Page, mixed: Mixed) -> None:
    page.goto(f"{mixed.url}/#/fleet")
    page.wait_for_function(READY, timeout=60_000)
    tiles = page.locator("a.tile")
    expect(tiles).to_have_count(mixed.fleet.size)
    amd = sum(1 for m in mixed.fleet.model if m.name == MI300X)
    page.select_option("select[data-filter=model]", MI300X)
    expect(tiles).to_have_count(amd)
    expect(page.locator(f'a.tile[data-gpu="{mixed.amd_uuid}"]')).to_have_count(1)
    page.select_option("select[data-filter=model]", "NVIDIA H100 80GB HBM3")
    expect(tiles).to_have_count(sum(1 for m in mixed.fleet.model if m.name == "NVIDIA H100 80GB HBM3"))


def test_an_amd_gpu_view_draws_its_readings_and_says_what_it_cannot_see(page: Page, mixed: Mixed) -> None:
    status, view = get_json(f"{mixed.url}/api/v1/gpus/{mixed.amd_uuid}/history?range=10m")
    assert status == 200
    # its readings relative to its own limits; no temperature ratio: AMD publishes no slowdown threshold for it
    assert set(view["series"]) == {
        "utilization_gpu_percent",
        "power_ratio_of_limit",
        "memory_used_ratio",
        "sm_clock_ratio_of_max",
    }, set(view["series"])
    blind = {c["detector"] for c in view["cannot_see"]}
    # what AMD's exporter does not give: NVLink link counts and counters, the PCIe width (XIDs are not claimed)
    assert {"nvlink-down", "pcie-link-narrow", "nvlink-crc-storm"} <= blind, blind
    assert "thermal-throttling" not in blind and "memory-leak" not in blind
    page.goto(f"{mixed.url}/#/gpu/{mixed.amd_uuid}")
    page.wait_for_function(READY, timeout=60_000)
    expect(page.locator(".chart[data-field=utilization_gpu_percent]")).to_have_attribute("data-series", "1")
    expect(page.locator(".chart[data-field=nvlink_tx_bytes_per_second]")).to_have_count(0)
    listed = page.locator("[data-testid=cannot-see] li")
    expect(listed.filter(has_text="nvlink-down")).to_have_count(1)
