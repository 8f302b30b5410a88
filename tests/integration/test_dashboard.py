"""The dashboard end to end, in a real headless Chromium (Debian's, driven by Playwright) against ``create_app``
served on loopback, with real data: a simulated fleet with an injected NVLink failure goes through Kafka, the
processor, the sink and the alert manager; the views must show the expected GPUs, values and events, the
filters must work, and the topology must highlight the GPU whose NVLink traffic fell back to PCIe.

Every view's screenshot is saved under ``artifacts/screenshots/`` (ignored by git) for people to look at.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect
from pydantic import SecretStr

from hermeneut.web.app import create_app, serving
from pipeline.config import Settings, WebSettings
from pipeline.services.stages import wait_for
from producers.simulator import Fleet
from producers.simulator.plan import FaultPlan, Injection
from sinks.retention import backfill, setup
from tests.webserver import get, get_json

from .alerting_parts import start_manager
from .conftest import READY, InfluxServer, KafkaServer, isolated_settings
from .harness import running_pipeline, simulating

pytestmark = pytest.mark.integration

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
HISTORY_S = 240
BROKEN = (0, 3)  # node 0 (an HGX H100 board), GPU 3: in a 4-GPU fine-tuning job on that seed


@dataclass
class Scene:
    url: str
    settings: Settings
    fleet: Fleet
    broken_uuid: str
    job: str


@pytest.fixture(scope="module")
def scene(
    kafka_server: KafkaServer,
    influx_server: InfluxServer,
    defaults: Settings,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Scene]:
    run_dir = tmp_path_factory.mktemp("dashboard")
    settings = isolated_settings(kafka_server, influx_server, defaults, run_dir / "state")
    plan = FaultPlan(rate_scale=0.0, injections=(Injection("nvlink-down", 20.0, 7200.0, *BROKEN),))
    fleet = Fleet(4, 8, cluster=settings.cluster, seed=1, faults=plan, extras=True)
    broken = fleet.uuids[BROKEN[0] * 8 + BROKEN[1]]
    with ExitStack() as stack:
        stages = stack.enter_context(running_pipeline(settings, run_dir / "pipeline"))
        manager = start_manager(settings, run_dir / "alerts")
        stack.callback(manager.stop)
        stack.enter_context(simulating(settings, fleet, HISTORY_S))
        sink = stages[1]
        assert wait_for(lambda: sink.stats().get("points_written", 0) >= HISTORY_S * 32, 180), sink.stats()
        url = stack.enter_context(serving(create_app(settings)))
        contexts = {c.gpu_uuid: c.workload for c in fleet.contexts(time.time_ns()) if c.workload}
        job = contexts[broken].job_id
        assert job is not None
        yield Scene(url, settings, fleet, broken, job)


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def open_view(page: Page, scene: Scene, hash_: str) -> None:
    page.goto(f"{scene.url}/#{hash_}")
    page.wait_for_function(READY, timeout=60_000)


def test_fleet_view_shows_every_gpu_live_and_filters(page: Page, scene: Scene) -> None:
    open_view(page, scene, "/fleet")
    tiles = page.locator("a.tile")
    expect(tiles).to_have_count(32)
    expect(page.locator("[data-count=total] b")).to_have_text("32")
    # the broken GPU carries its open finding
    expect(page.locator(f'a.tile[data-gpu="{scene.broken_uuid}"]')).to_have_class(re.compile(r"\bfinding\b"))
    # live updates arrive over server-sent events and are drawn
    page.wait_for_function("window.__hermeneut.updates > 0", timeout=30_000)
    shot(page, "fleet")
    models = {m.name for m in scene.fleet.model}
    page.select_option("select[data-filter=model]", "NVIDIA H100 80GB HBM3")
    expect(tiles).to_have_count(sum(1 for m in scene.fleet.model if m.name == "NVIDIA H100 80GB HBM3"))
    assert len(models) > 1
    page.select_option("select[data-filter=model]", "")
    page.select_option("select[data-filter=job]", scene.job)
    expect(tiles).to_have_count(4)


def test_fleet_view_shows_health_as_the_api_says(page: Page, scene: Scene) -> None:
    """Health counts above the tiles, the broken GPU and its node marked with the state the API gives them."""
    url = f"{scene.url}/api/v1/health?cluster={scene.settings.cluster}"
    assert wait_for(lambda: any(g["gpu"] == scene.broken_uuid for g in get_json(url)[1]["gpus"]), 90)
    health = get_json(url)[1]
    (broken,) = [g for g in health["gpus"] if g["gpu"] == scene.broken_uuid]
    assert broken["state"] in ("degraded", "unhealthy") and broken["reasons"][0]["detector"] == "nvlink-down", broken
    open_view(page, scene, "/fleet")
    page.select_option("select[data-filter=cluster]", scene.settings.cluster)  # the database holds other clusters
    for state, n in health["gpus_by_state"].items():
        expect(page.locator(f"[data-count=health-{state}] b")).to_have_text(str(n))
    expect(page.locator(f'a.tile[data-gpu="{scene.broken_uuid}"]')).to_have_attribute("data-health", broken["state"])
    (node,) = [n for n in health["nodes"] if n["node"] == broken["node"]]
    expect(page.locator(f'div.node[data-node="{broken["node"]}"]')).to_have_attribute("data-health", node["state"])


def test_node_page_shows_the_nodes_health_and_each_gpus_reasons(page: Page, scene: Scene) -> None:
    """From the fleet view's node name to the node page: the node's state and remedy and its broken GPU's, with the
    NVLink finding that names the job's GPUs waiting on it, as the API says."""
    url = f"{scene.url}/api/v1/health?cluster={scene.settings.cluster}"
    assert wait_for(lambda: any(g["gpu"] == scene.broken_uuid for g in get_json(url)[1]["gpus"]), 90)
    (broken,) = [g for g in get_json(url)[1]["gpus"] if g["gpu"] == scene.broken_uuid]
    node = get_json(f"{url}&node={broken['node']}")[1]["nodes"][0]
    open_view(page, scene, "/fleet")
    page.select_option("select[data-filter=cluster]", scene.settings.cluster)
    page.click(f'div.node[data-node="{broken["node"]}"] .node-name a[href^="#/node/"]')
    page.wait_for_function(f"document.body?.dataset.view === 'node' && {READY}")
    expect(page.locator("p.node-state")).to_have_attribute("data-health", node["state"])
    expect(page.get_by_test_id("node-remedy")).to_have_text(node["remedy"])
    row = page.locator(f'table.node-gpus tr[data-gpu="{scene.broken_uuid}"]')
    expect(row).to_have_attribute("data-health", broken["state"])
    expect(row.locator('li[data-detector="nvlink-down"]')).to_contain_text("other GPUs of its job wait on")
    shot(page, "node")


def test_reliability_view_shows_what_the_api_counts(page: Page, scene: Scene) -> None:
    url = f"{scene.url}/api/v1/reliability?range=7d&by=node&cluster={scene.settings.cluster}"
    assert wait_for(lambda: any(r["incidents"] or r["degradations"] for r in get_json(url)[1]["rows"]), 90)
    rows = {r["group"]: r for r in get_json(url)[1]["rows"]}
    open_view(page, scene, "/fleet")
    page.select_option("select[data-filter=cluster]", scene.settings.cluster)
    open_view(page, scene, "/reliability?by=node")
    for group, r in rows.items():
        cells = page.locator(f'table.reliability tr[data-group="{group}"] td.num')
        expect(cells.nth(2)).to_have_text(str(r["incidents"]))
        expect(cells.nth(7)).to_have_text(str(r["degradations"]))
    expect(page.locator(".days .day")).not_to_have_count(0)
    # effective time per job, from the job summaries of the history (the bucket storage setup makes, filled now)
    setup(scene.settings, tasks=False)
    backfill(scene.settings, [(time.time_ns() - (HISTORY_S + 600) * 10**9, time.time_ns())])
    jobs = {j["job"]: j for j in get_json(url)[1]["jobs"]}
    broken = jobs[scene.job]
    assert broken["effective"] < 1 and "nvlink-down" in {c["detector"] for c in broken["causes"]}, broken
    open_view(page, scene, "/fleet")  # drawn again, for this test's cluster (the jobs bucket holds other tests')
    page.select_option("select[data-filter=cluster]", scene.settings.cluster)
    open_view(page, scene, "/reliability?by=node")
    expect(page.locator("table.jobs-effective tr[data-job]")).to_have_count(len(jobs))
    cell = page.locator(f'table.jobs-effective tr[data-job="{scene.job}"] td[data-col=effective]')
    expect(cell).to_have_text(re.compile(r"^\d+\.\d%$"))
    # the job still runs with its GPU's finding open, so its share moves while the page loads: the page's own
    # request came seconds after the one above
    shown = float(cell.inner_text().rstrip("%"))
    assert abs(shown - 100 * broken["effective"]) < 2.0, (shown, broken)
    shot(page, "reliability")


def test_gpu_view_draws_metrics_and_events_on_one_time_axis(page: Page, scene: Scene) -> None:
    open_view(page, scene, f"/gpu/{scene.broken_uuid}")
    util = page.locator(".chart[data-field=utilization_gpu_percent]")
    expect(util).to_have_attribute("data-series", "1")
    # a share is drawn on its whole range, and the pointer reads the value under it
    expect(util).to_have_attribute("data-y-range", "0 100")
    over = util.locator(".u-over")
    over.hover()
    expect(util.locator(".readout")).to_have_text(re.compile(r"\d%$"))
    # drag across it to zoom in, double-click for the whole window again
    whole = util.get_attribute("data-x-range")
    box = over.bounding_box()
    assert whole and box is not None
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.7, box["y"] + box["height"] / 2, steps=5)
    page.mouse.up()
    expect(util).not_to_have_attribute("data-x-range", whole)
    lo, hi = (int(v) for v in (util.get_attribute("data-x-range") or "").split())
    full_lo, full_hi = (int(v) for v in whole.split())
    assert full_lo < lo < hi < full_hi and (hi - lo) < 0.5 * (full_hi - full_lo), (lo, hi, whole)
    over.dblclick()
    expect(util).to_have_attribute("data-x-range", whole)
    expect(page.locator(".chart[data-field=nvlink_tx_bytes_per_second]")).to_have_count(1)
    events = page.locator("[data-testid=events] li")
    expect(events.filter(has_text="nvlink-down started")).not_to_have_count(0)
    expect(events.filter(has_text="links active").first).to_be_visible()
    # the same events are marks on the charts' time axis
    assert int(util.get_attribute("data-marks") or 0) >= 1
    shot(page, "gpu")


def test_job_view_puts_the_jobs_gpus_side_by_side(page: Page, scene: Scene) -> None:
    open_view(page, scene, f"/job/{scene.job}")
    cards = page.locator(".gpu-card")
    expect(cards).to_have_count(4)
    expect(page.locator(f'.gpu-card[data-gpu="{scene.broken_uuid}"]')).to_have_count(1)
    for i in range(4):
        expect(cards.nth(i).locator(".chart")).to_have_attribute("data-series", "1")
    # the story first: the broken GPU's finding, and that the job's other GPUs wait on it, above the GPU cards
    index = scene.fleet.uuids.index(scene.broken_uuid) % 8
    expect(page.locator("[data-testid=waited-on]")).to_contain_text(f"GPU {index}")
    listed = page.locator(f'[data-testid=job-findings] li[data-detector=nvlink-down][data-gpu="{scene.broken_uuid}"]')
    expect(listed).to_have_count(1)
    box, first_card = listed.bounding_box(), cards.first.bounding_box()
    assert box is not None and first_card is not None and box["y"] < first_card["y"]
    expect(page.locator(f'.gpu-card[data-gpu="{scene.broken_uuid}"]')).to_contain_text("the job waits on it")
    # its card marks when its finding started
    broken = page.locator(f'.gpu-card[data-gpu="{scene.broken_uuid}"] .chart')
    expect(broken).to_have_attribute("data-marks", re.compile(r"^[1-9]"))
    shot(page, "job")


def test_topology_highlights_the_pcie_fallback(page: Page, scene: Scene) -> None:
    open_view(page, scene, f"/topology/{scene.settings.cluster}/node-0000")
    expect(page.locator("[data-testid=fallback]")).to_contain_text("GPU 3")
    gpu = page.locator(f'g.n[data-node="{scene.broken_uuid}"]')
    expect(gpu).to_have_attribute("data-flags", re.compile("pcie-fallback"))
    expect(page.locator(f'line[data-edge^="pcie:{scene.broken_uuid}:"]')).to_have_attribute("data-state", "fallback")
    nvlink = page.locator(f'line[data-edge="nvlink:{scene.broken_uuid}:nvswitch"]')
    expect(nvlink).to_have_attribute("data-state", "down")
    # its peers keep their NVLink
    peer = scene.fleet.uuids[1]
    expect(page.locator(f'line[data-edge="nvlink:{peer}:nvswitch"]')).not_to_have_attribute("data-state", "down")
    expect(page.locator("g.n.gpu")).to_have_count(8)
    expect(page.locator("g.n.nic")).not_to_have_count(0)
    shot(page, "topology")
    open_view(page, scene, "/topology")
    row = page.locator("tr", has_text="node-0000")
    expect(row).to_contain_text("PCIe fallback")


def test_alerts_view_shows_the_firing_alert_and_subscriptions(page: Page, scene: Scene) -> None:
    receiver = {"kind": "kafka", "topic": scene.settings.topics.alerts + ".notifications"}
    match = ['detector="nvlink-down"']
    body = json.dumps({"name": "gpu-team", "owner": "ops", "match": match, "receivers": [receiver]})
    request = urllib.request.Request(
        f"{scene.url}/api/v1/alerts/subscriptions", body.encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 201
    assert wait_for(
        lambda: any(
            a["labels"].get("detector") == "nvlink-down" and a["status"] == "firing"
            for a in get_json(f"{scene.url}/api/v1/alerts")[1]
        ),
        90,
    )
    open_view(page, scene, "/alerts")
    firing = page.locator("tr[data-alert]", has_text="nvlink-down")
    expect(firing.first).to_contain_text("firing")
    expect(page.locator("tr", has_text="gpu-team")).to_have_count(1)
    # a day's timeline says its dates: its two ends are not the same clock time
    ends = [page.locator(f".chart [data-axis={end}]").first.text_content() for end in ("from", "to")]
    assert ends[0] and ends[1] and ends[0] != ends[1], ends
    shot(page, "alerts")


def test_rightsizing_view_lists_jobs_with_advice(page: Page, scene: Scene) -> None:
    open_view(page, scene, "/rightsizing")
    rows = page.locator("tr[data-job]")
    expect(rows.first).to_be_visible(timeout=60_000)
    expect(page.locator(f'tr[data-job="{scene.job}"]')).to_have_count(1)
    assert rows.count() >= 3
    shot(page, "rightsizing")


def test_beyond_loopback_the_dashboard_needs_the_token_and_keeps_secrets(
    scene: Scene, browser: Browser, tmp_path: Path
) -> None:
    exposed = scene.settings.model_copy(update={"web": WebSettings(host="0.0.0.0", token=SecretStr("dash-token"))})
    with serving(create_app(exposed)) as url:
        assert get(f"{url}/api/v1/fleet")[0] == 401
        context = browser.new_context()
        page = context.new_page()
        page.goto(url)
        expect(page).to_have_url(re.compile("/login"))
        page.fill("input[name=token]", "wrong")
        page.click("button[type=submit]")
        expect(page.locator("#failed")).to_be_visible()
        page.fill("input[name=token]", "dash-token")
        page.click("button[type=submit]")
        expect(page).not_to_have_url(re.compile("/login"))
        page.wait_for_function(READY, timeout=60_000)
        expect(page.locator("a.tile")).to_have_count(32)
        cookies = {c["name"]: c for c in context.cookies()}
        session = cookies["hermeneut_session"]
        assert session["httpOnly"] and session["sameSite"] == "Strict" and "dash-token" not in session["value"]
        assert page.evaluate("document.cookie") == ""  # HttpOnly: invisible to scripts
        token = exposed.influxdb.token.get_secret_value() if exposed.influxdb.token else ""
        for path in ("/", "/static/app.js", "/api/v1/fleet"):
            text = page.evaluate(f"fetch({path!r}).then(r => r.text())")
            assert token not in text and "dash-token" not in text, path
        context.close()
    assert urllib.parse.urlparse(url).hostname == "127.0.0.1"
