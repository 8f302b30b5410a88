"""Dashboard benchmark: page load and live-update latency with a 1,000-GPU simulated fleet, in headless Chromium.

    python -m bench.dashboard [--gpus 1000] [--seconds 60] [--loads 5] [--json out.json]

On a fresh local Kafka and influxd: processor and sink run, a simulated fleet is published (a minute of history,
then live at 1 Hz) and ``create_app`` is served on loopback. Measured in the same run:
- fleet view load (navigation to every GPU tile drawn), against the raw JSON of ``/api/v1/fleet`` fetched alone;
- GPU view load (seven trend queries and the timeline), and the topology view load;
- update latency: sample time -> tile redrawn in the browser (sample -> Kafka -> processor -> Kafka -> the web
  server's live state -> server-sent event -> render), against the pipeline's own sample -> stored latency
  (the sink's p50/p99) over the same seconds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from playwright.sync_api import Page, sync_playwright

from bench.pipeline import GPUS_PER_NODE, bench_settings
from hermeneut.stages import start_stage
from hermeneut.web.app import create_app, serving
from pipeline.config import load_settings
from pipeline.publisher import Publisher
from pipeline.services import influxdb, kafka
from pipeline.services.stages import wait_for
from producers.agent import NodeAgent
from producers.simulator import Fleet
from producers.simulator.source import SimulatorSource

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]  # fmt: skip


def _ready(page: Page, hash_: str, url: str, selector: str, count: int) -> float:
    """Milliseconds from navigation start until ``count`` elements match ``selector``."""
    page.goto("about:blank")
    page.goto(f"{url}/#{hash_}")
    page.wait_for_function(
        f"document.body.dataset.ready === '1' && document.querySelectorAll({selector!r}).length >= {count}",
        timeout=120_000,
    )
    return float(page.evaluate("performance.now()"))


def _fetch_ms(url: str) -> float:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as resp:
        resp.read()
    return (time.perf_counter() - start) * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0, help="live seconds over which update latency is measured")
    ap.add_argument("--loads", type=int, default=5, help="page loads per view")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-bench-dashboard-"))
    print(f"starting local Kafka and InfluxDB in {run_dir}")
    k = kafka.start(base.services.cache_dir, base.kafka.version, run_dir / "kafka", heap_mb=1024)
    i = influxdb.start(base.services.cache_dir, base.influxdb.version, run_dir / "influxdb", "hermeneut", "telemetry")
    results: dict[str, Any] = {"gpus": args.gpus}
    stages = []
    stop = threading.Event()
    try:
        s = bench_settings(base, k, i, "dash")
        stages = [start_stage("process", s, run_dir), start_stage("sink", s, run_dir)]
        assert wait_for(lambda: all(st.stats().get("assigned") for st in stages), 120)
        fleet = Fleet(max(1, args.gpus // GPUS_PER_NODE), GPUS_PER_NODE, cluster=s.cluster, seed=3, extras=True)
        publisher = Publisher(s.kafka.client_config())
        sim = threading.Thread(
            target=NodeAgent(SimulatorSource.of(fleet), publisher, s.topics, 1.0).run,
            args=(stop,),
            kwargs={"fast_forward_s": 60},
            daemon=True,
        )
        sim.start()
        print(f"1/3 a minute of history for {fleet.size} GPUs, then live at 1 Hz")
        assert wait_for(lambda: stages[1].stats().get("points_written", 0) >= 60 * fleet.size, 600)
        with serving(create_app(s)) as url, sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            print("2/3 page loads")
            _ready(page, "/fleet", url, "a.tile", fleet.size)  # warm: the live state's first catch-up
            fleet_json = [_fetch_ms(f"{url}/api/v1/fleet") for _ in range(args.loads)]
            fleet_view = [_ready(page, "/fleet", url, "a.tile", fleet.size) for _ in range(args.loads)]
            gpu_view = [_ready(page, f"/gpu/{fleet.uuids[0]}", url, ".chart", 5) for _ in range(args.loads)]
            topo = f"/topology/{s.cluster}/{fleet.nodes[0]}"
            topo_view = [_ready(page, topo, url, "g.n.gpu", GPUS_PER_NODE) for _ in range(args.loads)]
            print(f"3/3 live updates for {args.seconds:.0f}s")
            _ready(page, "/fleet", url, "a.tile", fleet.size)
            page.evaluate("window.__hermeneut.updateLatencyMs = []")
            sink_before = stages[1].stats()
            time.sleep(args.seconds)
            latencies = np.array(page.evaluate("window.__hermeneut.updateLatencyMs"), dtype=float)
            sink_after = stages[1].stats()
            browser.close()
    finally:
        stop.set()
        for st in stages:
            st.stop()
        k.stop()
        i.stop()
    results |= {
        "fleet_json_ms": statistics.median(fleet_json),
        "fleet_view_ms": statistics.median(fleet_view),
        "gpu_view_ms": statistics.median(gpu_view),
        "topology_view_ms": statistics.median(topo_view),
        "update_p50_ms": float(np.percentile(latencies, 50)) if latencies.size else None,
        "update_p99_ms": float(np.percentile(latencies, 99)) if latencies.size else None,
        "updates": int(latencies.size),
        "sink_p50_ms": (sink_after.get("latency_p50_s") or 0) * 1000,
        "sink_p99_ms": (sink_after.get("latency_p99_s") or 0) * 1000,
        "stored_during": int(sink_after.get("points_written", 0)) - int(sink_before.get("points_written", 0)),
    }
    r = results
    print()
    print(f"{'measure (' + str(r['gpus']) + ' GPUs)':44} {'median ms':>10}  baseline in the same run")
    ratio = r["fleet_view_ms"] / r["fleet_json_ms"]
    print(
        f"{'fleet view: navigation -> every tile drawn':44} {r['fleet_view_ms']:>10.0f}  "
        f"/api/v1/fleet JSON alone {r['fleet_json_ms']:.0f} ms (x{ratio:.1f})"
    )
    print(f"{'GPU view: 7 trends + timeline drawn':44} {r['gpu_view_ms']:>10.0f}")
    print(f"{'topology view drawn':44} {r['topology_view_ms']:>10.0f}")
    if r["update_p50_ms"] is not None:
        stored = f"sample -> stored p50 {r['sink_p50_ms']:.0f} / p99 {r['sink_p99_ms']:.0f} ms"
        print(
            f"{'update: sample -> tile redrawn p50 / p99':44} {r['update_p50_ms']:>10.0f}  / "
            f"{r['update_p99_ms']:.0f} ms; {stored}"
        )
    print(f"{'GPU updates drawn in ' + str(int(args.seconds)) + ' s':44} {r['updates']:>10}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
