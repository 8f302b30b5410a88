"""The dashboard: the single-page views in ``static/`` and the JSON they read.

    GET /                                   the dashboard (fleet, GPU, job, topology, alerts, right-sizing views)
    GET /login, POST /login                 exchange the API token for a session cookie (only when a token is needed)
    GET /api/v1/fleet                       the latest state of every GPU (LiveFleet)
    GET /api/v1/live?since=V                server-sent events: the GPUs that changed, once a second
    GET /api/v1/topology                    nodes with a published topology, with their PCIe-fallback flag
    GET /api/v1/topology/{cluster}/{node}   a node's interconnect graph with live traffic (hermeneut.web.topology)
    GET /api/v1/gpus/{uuid}/history         key metrics with their baseline band, and the GPU's timeline
    GET /api/v1/jobs/{job}/history          every GPU of a job side by side, stragglers marked
                                            (both: ``cannot_see``, the detectors the range's stored readings
                                            cannot feed, and why: processors.coverage, as an import's summary)
    GET /api/v1/rightsizing                 right-sizing advice per job (hermeneut.views.rightsizing)

Live state comes from Kafka (interpreted + alerts topics, and a mirror of the topology topic), history from
InfluxDB through the query layer. Both start on first use, so the page answers (with 503s for what is missing)
while a server is down. Nothing secret is ever sent to the browser: the session cookie is an HMAC of the API
token, HttpOnly and SameSite=Strict, and no InfluxDB or receiver credential is in any response.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

from aiohttp import web

from hermeneut.web.live import GpuState, LiveFleet
from hermeneut.web.query_api import SETTINGS, STORE
from hermeneut.web.topology import GpuTraffic, build_graph
from pipeline.codec import decode_record
from pipeline.config import Settings
from pipeline.errors import ConfigError, InvalidQuery, ServiceError
from pipeline.events import RELATIVE_FIELDS, node_key
from pipeline.mirror import TopicMirror
from pipeline.topology import NodeTopology
from pipeline.vocab import format_duration
from processors.detectors.names import HOLDS_JOB_BACK
from sinks.query import Scope, TrendQuery, trend
from sinks.query.coverage import StoredShape, stored_shape
from sinks.query.model import check_value, resolve_range
from sinks.query.timeline import TimelineQuery, gpu_timeline

STATIC: Final = Path(__file__).parent / "static"
#: the charts of the GPU view: (field, with the baseline band)
GPU_CHARTS: Final = (
    "utilization_gpu_percent",
    "power_ratio_of_limit",
    "memory_used_ratio",
    "temperature_ratio_of_slowdown",
    "sm_clock_ratio_of_max",
    "pcie_tx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
)
_MAX_RANGE_NS: Final = 7 * 86400 * 10**9
T = TypeVar("T")


class Lazy(Generic[T]):
    """A Kafka-fed part started on first use; a failed start is a 503 and is tried again on the next request."""

    def __init__(self, start: Callable[[], T], stop: Callable[[T], None]) -> None:
        self._start, self._stop = start, stop
        self.value: T | None = None
        self.lock = asyncio.Lock()

    async def get(self) -> T:
        async with self.lock:
            if self.value is None:
                try:
                    self.value = await _thread(self._start)
                except (ConfigError, ServiceError) as exc:
                    raise ServiceError(f"live data unavailable: {exc}") from exc
            return self.value

    def close(self) -> None:
        if self.value is not None:
            self._stop(self.value)


LIVE: Final = web.AppKey("live_fleet", Lazy[LiveFleet])
TOPOLOGY: Final = web.AppKey("topology_mirror", Lazy[TopicMirror[NodeTopology]])


async def _thread(fn: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


@dataclass(frozen=True, slots=True)
class _Window:
    """The time window of a history view: ``range`` back from ``stop`` (default now), or ``start`` to ``stop``
    (RFC 3339; imported history is in the past)."""

    range: str | None
    start: str | None
    stop: str | None
    length_ns: int


def _window(request: web.Request, default: str = "30m") -> _Window:
    start, stop = request.query.get("start"), request.query.get("stop")
    range_ = request.query.get("range") or (None if start else default)
    tr = resolve_range(range_, start, stop, time.time_ns(), default)
    if tr.length_ns > _MAX_RANGE_NS:
        raise InvalidQuery(f"the window ({format_duration(tr.length_ns)}) is longer than the dashboard shows (7d)")
    return _Window(range_, start, stop, tr.length_ns)


def _path_value(request: web.Request, key: str, what: str) -> str:
    """A path parameter, checked as the query layer checks a value; a line break or other control character is
    refused here first (``check_value``'s pattern lets one through at the end, and a 404's reason line naming the
    value cannot hold it: that was a 500)."""
    value = request.match_info[key]
    if not value.isprintable():
        raise InvalidQuery(f"{what} {value!r} has characters a {what} cannot have (control characters)")
    return check_value(value, what)


def _past_gpu(uuid: str) -> dict[str, Any]:
    """A GPU the live state does not know (its job is history), as the job view's card needs it."""
    return {"uuid": uuid, "node": "", "index": "", "verdict": "stored", "values": {}, "relative": {}, "findings": {}}


def _cannot_see(shape: StoredShape | None) -> list[dict[str, str]]:
    """The detectors that cannot fire on stored readings of this shape, each with why (none without readings)."""
    from processors.coverage import DataShape, blind_detectors

    if shape is None:
        return []
    # events=True: an XID is no column, and a range without one says nothing of whether its source could send them
    data = DataShape(shape.interval_s, shape.job_gpus, shape.node_gpus, events=True)
    return [{"detector": d, "why": why} for d, why in blind_detectors(shape.columns, data)]


def _traffic(state: GpuState, job_findings: bool) -> GpuTraffic:
    v = state.values
    nvlink = None
    if "nvlink_tx_bytes_per_second" in v or "nvlink_rx_bytes_per_second" in v:
        nvlink = v.get("nvlink_tx_bytes_per_second", 0.0) + v.get("nvlink_rx_bytes_per_second", 0.0)
    pcie = None
    if "pcie_tx_bytes_per_second" in v or "pcie_rx_bytes_per_second" in v:
        pcie = v.get("pcie_tx_bytes_per_second", 0.0) + v.get("pcie_rx_bytes_per_second", 0.0)
    return GpuTraffic(
        nvlink,
        pcie,
        v.get("nvlink_links_active"),
        v.get("nvlink_links_max"),
        state.job_gpus,
        state.verdict,
        job_findings,
    )


def _graph_json(topo: NodeTopology, fleet: LiveFleet) -> dict[str, Any]:
    states = {s.uuid: s for s in fleet.snapshot() if s.cluster == topo.cluster and s.node == topo.node}
    traffic = {u: _traffic(s, "nvlink-down" in s.findings) for u, s in states.items()}
    graph = build_graph(topo, traffic, fleet.nic_traffic(topo.cluster, topo.node))
    return {
        "cluster": topo.cluster,
        "node": topo.node,
        "nodes": [n.__dict__ for n in graph.nodes],
        "edges": [e.__dict__ for e in graph.edges],
        "fallback_gpus": graph.fallback_gpus,
    }


def add_routes(app: web.Application, settings: Settings) -> None:
    """Mount the dashboard on ``app`` (which already has the query store, see hermeneut.web.app)."""
    app[LIVE] = Lazy(lambda: _started_fleet(settings), LiveFleet.stop)
    app[TOPOLOGY] = Lazy(lambda: _started_topology(settings), TopicMirror.stop)

    async def close(app: web.Application) -> None:
        app[LIVE].close()
        app[TOPOLOGY].close()

    app.on_cleanup.append(close)

    app.router.add_get("/", _index)
    app.router.add_static("/static/", STATIC, append_version=False)
    app.router.add_get("/api/v1/fleet", _fleet)
    app.router.add_get("/api/v1/live", _stream)
    app.router.add_get("/api/v1/topology", _topology_index)
    app.router.add_get("/api/v1/topology/{cluster}/{node}", _topology)
    app.router.add_get("/api/v1/gpus/{uuid}/history", _gpu_history)
    app.router.add_get("/api/v1/jobs/{job}/history", _job_history)
    app.router.add_get("/api/v1/rightsizing", _rightsizing)


async def _index(_request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


async def _fleet(request: web.Request) -> web.Response:
    live = await request.app[LIVE].get()
    version, states = live.changes_since(0)
    return web.json_response({"version": version, "gpus": [s.to_json() for s in states]})


async def _stream(request: web.Request) -> web.StreamResponse:
    live = await request.app[LIVE].get()
    since = request.query.get("since", "0")
    if not since.isdigit():
        raise InvalidQuery(f"since {since!r} is not a version number")
    version = int(since)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    last_beat = time.monotonic()
    try:
        while True:
            version, changed = live.changes_since(version)
            if changed:
                data = json.dumps({"version": version, "gpus": [s.to_json() for s in changed]})
                await response.write(f"event: update\ndata: {data}\n\n".encode())
            elif time.monotonic() - last_beat > 15:
                await response.write(b": keep-alive\n\n")
                last_beat = time.monotonic()
            await asyncio.sleep(1.0)
    except ConnectionResetError:  # the browser left: the normal end of a stream
        return response


async def _topology_index(request: web.Request) -> web.Response:
    mirror, live = await request.app[TOPOLOGY].get(), await request.app[LIVE].get()
    nodes = []
    for topo in sorted(mirror.snapshot().values(), key=lambda t: (t.cluster, t.node)):
        graph = _graph_json(topo, live)
        nodes.append(
            {
                "cluster": topo.cluster,
                "node": topo.node,
                "gpus": len(topo.gpus),
                "nvswitches": topo.nvswitches,
                "nics": len(topo.nics),
                "fallback": bool(graph["fallback_gpus"]),
            }
        )
    return web.json_response({"nodes": nodes})


async def _topology(request: web.Request) -> web.Response:
    cluster = _path_value(request, "cluster", "cluster")
    node = _path_value(request, "node", "node")
    mirror, live = await request.app[TOPOLOGY].get(), await request.app[LIVE].get()
    topo = mirror.get(node_key(cluster, node))
    if topo is None:
        raise web.HTTPNotFound(reason=f"no topology published for {cluster}/{node}")
    return web.json_response(_graph_json(topo, live))


async def _gpu_history(request: web.Request) -> web.Response:
    uuid = _path_value(request, "uuid", "gpu")
    w = _window(request)
    store = request.app[STORE]
    every = f"{max(5, w.length_ns // 10**9 // 120)}s"

    def series(field: str) -> tuple[str, list[list[float]], dict[str, Any] | None]:
        q = TrendQuery(
            field,
            "gpu",
            every,
            w.range,
            "mean",
            Scope(gpu=uuid),
            field in RELATIVE_FIELDS,
            start=w.start,
            stop=w.stop,
        )
        result = trend(store, q)
        points = [[r.time_ns // 10**6, r.value] for r in result.rows if r.value is not None]
        band = next((r.band for r in result.rows if r.band is not None), None)
        band_json = None if band is None else {"p05": band.p05, "p50": band.p50, "p95": band.p95, "baseline": ""}
        return field, points, band_json

    results = await asyncio.gather(*(_thread(functools.partial(series, f)) for f in GPU_CHARTS))
    timeline = await _thread(lambda: gpu_timeline(store, TimelineQuery(uuid, w.range, start=w.start, stop=w.stop)))
    shape = await _thread(lambda: stored_shape(store, timeline.range, (uuid,)))
    return web.json_response(
        {
            "from_ms": timeline.range.start_ns // 10**6,
            "to_ms": timeline.range.stop_ns // 10**6,
            "series": {f: points for f, points, _ in results if points},
            "band": {f: band for f, _, band in results if band},
            "events": [
                {
                    "ts_ms": e.time_ns // 10**6,
                    "kind": e.kind,
                    "severity": e.severity,
                    "title": e.title,
                    "text": e.text,
                }
                for e in timeline.events
            ],
            "cannot_see": _cannot_see(shape),
        }
    )


async def _job_history(request: web.Request) -> web.Response:
    job = _path_value(request, "job", "job")
    w = _window(request)
    live = await request.app[LIVE].get()
    gpus = sorted((s for s in live.snapshot() if s.job_id == job), key=lambda s: (s.node, s.index))
    # job ids repeat across clusters (each scheduler counts its own): a running job is the one of its cluster
    clusters = {s.cluster for s in gpus}
    scope = Scope(cluster=clusters.pop() if len(clusters) == 1 else None, job=job)
    q = TrendQuery(
        "utilization_gpu_percent",
        "gpu",
        f"{max(5, w.length_ns // 10**9 // 120)}s",
        w.range,
        "mean",
        scope,
        start=w.start,
        stop=w.stop,
    )
    store = request.app[STORE]
    result = await _thread(lambda: trend(store, q))
    series: dict[str, list[list[float]]] = {}
    for r in result.rows:
        if r.value is not None:
            series.setdefault(r.group[0], []).append([r.time_ns // 10**6, r.value])
    # the job's GPUs with stored samples in the window: the trend's groups
    shape = await _thread(lambda: stored_shape(store, result.range, tuple(sorted(series)), job=job))
    now_ms = time.time_ns() // 10**6
    cards = [s.to_json() for s in gpus]
    # a job of the past (imported history) has no live state: its GPUs are those of its stored samples
    cards += [_past_gpu(uuid) for uuid in sorted(series) if uuid not in {s.uuid for s in gpus}]
    return web.json_response(
        {
            "from_ms": result.range.start_ns // 10**6,
            "to_ms": min(now_ms, result.range.stop_ns // 10**6),
            "gpus": cards,
            "series": series,
            "stragglers": [s.uuid for s in gpus if "straggler" in s.findings],
            # the GPUs whose open finding holds the whole job back (its peers wait on them)
            "waited_on": [s.uuid for s in gpus if len(gpus) > 1 and any(d in s.findings for d in HOLDS_JOB_BACK)],
            "cannot_see": _cannot_see(shape),
        }
    )


async def _rightsizing(request: web.Request) -> web.Response:
    from hermeneut.views.rightsizing import advise, answer_lines, links_of

    w = _window(request, "24h")
    # the fleet's link kinds and probe timings when the topology mirror is up (the topology or health view
    # started it), else the published figures: this view does not wait for Kafka
    lazy = request.app.get(TOPOLOGY)
    links = links_of(lazy.value.snapshot().values())[0] if lazy is not None and lazy.value is not None else None
    advice = await _thread(lambda: advise(request.app[SETTINGS], w.range, start=w.start, stop=w.stop, links=links))
    items = []
    for a in sorted(advice, key=lambda a: -a.wasted_gpu_hours):
        s, best = a.stats, a.options[0]
        items.append(
            {
                "job_id": s.key if s.scope == "job" else None,
                "application": s.application or "unknown",
                "gpus": s.gpus,
                "gpu_model": s.gpu_model,
                "memory_p95_bytes": s.memory_p95_bytes,
                "memory_allocated_bytes": s.memory_total_bytes,
                "sm_p95_percent": s.sm_active_p95_percent
                if s.sm_active_p95_percent is not None
                else s.utilization_p95_percent,
                "gpu_hours": s.gpu_hours,
                "wasted_gpu_hours": a.wasted_gpu_hours,
                "idle_gpu_hours": s.idle_gpu_hours,
                "recommendation": f"{best.kind}: {best.target} ({best.detail})",
                "summary": a.summary,
                "answers": answer_lines(a),
            }
        )
    return web.json_response({"items": items})


def _started_topology(settings: Settings) -> TopicMirror[NodeTopology]:
    mirror = TopicMirror(
        settings.kafka.client_config(), settings.topics.topology, lambda v: decode_record(NodeTopology, v)
    ).start()
    mirror.wait_ready(10)
    return mirror


def _started_fleet(settings: Settings) -> LiveFleet:
    fleet = LiveFleet(settings).start()
    fleet.ready.wait(10)  # the first catch-up pass, so the first page shows the fleet
    return fleet
