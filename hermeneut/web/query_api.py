"""Read-only query endpoints mirroring the CLI (``hermeneut trend|top|compare|anomalies``), all GET:

    /api/v1/trend?field=power_watts&by=node&every=1m&range=6h&fn=p95&band=true&gpu_model=...
    /api/v1/top/{hot|throttled|wasted|power|xid}?n=10&range=1h&fn=max&threshold=10
    /api/v1/compare/job?job=J&feature=power_ratio_of_limit&phase=compute&range=7d
    /api/v1/compare/models?application=A&a=MODEL_A&b=MODEL_B&feature=...&range=24h
    /api/v1/anomalies?range=24h&every=1h&detector=D&limit=200&part=both
    /api/v1/jobs?range=30d&application=A

Every question also takes ``start``/``stop`` (RFC 3339) instead of ``range``, the scope parameters
``cluster node gpu job application gpu_model`` where it has a scope, ``backend`` (auto/flux/influxql) and
``format`` (json, the default; csv; table). Parameters are checked by the same query objects as the CLI's;
an unknown or malformed one is HTTP 400 with one line. Queries run in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

from aiohttp import web

from pipeline.config import Settings
from pipeline.errors import InvalidQuery
from sinks.query import (
    COMPARE_FEATURES,
    AnomalyQuery,
    CompareJobQuery,
    CompareModelsQuery,
    JobsQuery,
    Scope,
    Store,
    Table,
    TopQuery,
    TrendQuery,
    anomalies,
    compare_job,
    compare_models,
    job_summaries,
    render,
    top,
    trend,
)

STORE: Final = web.AppKey("query_store", Store)
#: the settings the application was made with (every area's handlers read them from the request)
SETTINGS: Final = web.AppKey("settings", Settings)
T = TypeVar("T")
SCOPE: Final = ("cluster", "node", "gpu", "job", "application", "gpu_model")
COMMON: Final = ("range", "start", "stop", "format", "backend")
CONTENT_TYPES: Final = {"json": "application/json", "csv": "text/csv", "table": "text/plain"}


class Params:
    """Query-string parameters, each read once; anything left over is an unknown parameter."""

    def __init__(self, query: Mapping[str, str], getall: Callable[[str], list[str]], allowed: tuple[str, ...]) -> None:
        unknown = sorted(set(query) - set(allowed))
        if unknown:
            raise InvalidQuery(f"unknown parameter(s) {', '.join(unknown)}; this endpoint takes {', '.join(allowed)}")
        self._query, self._getall = query, getall

    def text(self, name: str, default: str | None = None) -> str | None:
        values = self._getall(name) if name in self._query else []
        if len(values) > 1:
            raise InvalidQuery(f"parameter {name} given {len(values)} times")
        return values[0] if values else default

    def number(self, name: str, default: T, kind: Callable[[str], T]) -> T:
        raw = self.text(name)
        if raw is None:
            return default
        try:
            return kind(raw)
        except ValueError:
            raise InvalidQuery(f"parameter {name}={raw!r} is not a {kind.__name__}") from None

    def flag(self, name: str) -> bool:
        raw = (self.text(name) or "false").lower()
        if raw not in ("true", "false", "1", "0", "yes", "no"):
            raise InvalidQuery(f"parameter {name}={raw!r} is not true or false")
        return raw in ("true", "1", "yes")

    def many(self, name: str) -> tuple[str, ...]:
        return tuple(self._getall(name)) if name in self._query else ()

    def scope(self) -> Scope:
        return Scope(**{k: self.text(k) for k in SCOPE})


def _params(request: web.Request, *names: str) -> Params:
    return Params(request.query, request.query.getall, (*names, *COMMON))


def _respond(tables: list[Table], fmt: str) -> web.Response:
    if fmt not in CONTENT_TYPES:
        raise InvalidQuery(f"format {fmt!r} is not one of {', '.join(CONTENT_TYPES)}")
    return web.Response(text=render(tables, fmt), content_type=CONTENT_TYPES[fmt])


async def _run(request: web.Request, call: Callable[[Store], list[Table]], p: Params) -> web.Response:
    fmt = p.text("format", "json") or "json"
    tables = await asyncio.to_thread(call, request.app[STORE])
    return _respond(tables, fmt)


async def trend_handler(request: web.Request) -> web.Response:
    p = _params(request, "field", "by", "every", "fn", "band", "phase", *SCOPE)
    q = TrendQuery(
        p.text("field", "power_watts") or "",
        p.text("by", "gpu_model") or "",
        p.text("every"),
        p.text("range"),
        p.text("fn", "mean") or "",
        p.scope(),
        p.flag("band"),
        p.text("phase", "compute") or "",
        p.text("start"),
        p.text("stop"),
        p.text("backend", "auto") or "",
    )
    q.validate()
    return await _run(request, lambda store: trend(store, q).tables(), p)


async def top_handler(request: web.Request) -> web.Response:
    p = _params(request, "n", "fn", "threshold", *SCOPE)
    q = TopQuery(
        request.match_info["kind"],
        p.number("n", 10, int),
        p.text("range"),
        p.scope(),
        p.text("fn", "max") or "",
        p.number("threshold", 10.0, float),
        p.text("start"),
        p.text("stop"),
        p.text("backend", "auto") or "",
    )
    q.validate()
    return await _run(request, lambda store: top(store, q).tables(), p)


async def compare_job_handler(request: web.Request) -> web.Response:
    p = _params(request, "job", "feature", "phase")
    job = p.text("job")
    if not job:
        raise InvalidQuery("parameter job is required")
    q = CompareJobQuery(
        job,
        p.text("range"),
        p.many("feature") or COMPARE_FEATURES,
        p.text("phase", "compute") or "",
        p.text("start"),
        p.text("stop"),
    )
    q.validate()
    return await _run(request, lambda store: compare_job(store, q).tables(), p)


async def compare_models_handler(request: web.Request) -> web.Response:
    p = _params(request, "application", "a", "b", "feature", "cluster")
    missing = [n for n in ("application", "a", "b") if not p.text(n)]
    if missing:
        raise InvalidQuery(f"parameter(s) {', '.join(missing)} required")
    q = CompareModelsQuery(
        p.text("application") or "",
        p.text("a") or "",
        p.text("b") or "",
        p.text("range"),
        p.many("feature") or COMPARE_FEATURES,
        p.text("cluster"),
        p.text("start"),
        p.text("stop"),
    )
    q.validate()
    return await _run(request, lambda store: compare_models(store, q).tables(), p)


async def anomalies_handler(request: web.Request) -> web.Response:
    p = _params(request, "every", "detector", "limit", "part", *SCOPE)
    part = p.text("part", "both") or "both"
    if part not in ("both", "windows", "findings"):
        raise InvalidQuery(f"part {part!r} is not one of both, windows, findings")
    q = AnomalyQuery(
        p.text("range"),
        p.text("every"),
        p.scope(),
        p.text("detector"),
        p.number("limit", 200, int),
        p.text("start"),
        p.text("stop"),
        p.text("backend", "auto") or "",
    )
    q.validate()
    return await _run(request, lambda store: anomalies(store, q).tables(part), p)


async def jobs_handler(request: web.Request) -> web.Response:
    p = _params(request, *SCOPE)
    q = JobsQuery(p.text("range"), p.scope(), p.text("start"), p.text("stop"))
    q.validate()
    return await _run(request, lambda store: job_summaries(store, q).tables(), p)


def add_routes(app: web.Application, settings: Settings, store: Store | None = None) -> None:
    """The query endpoints on ``app``; the store is created from ``settings`` unless given (then it is the
    caller's to close)."""
    own = store is None
    app[SETTINGS], app[STORE] = settings, store or Store.from_settings(settings)

    async def close(app: web.Application) -> None:
        if own:
            app[STORE].close()

    app.on_cleanup.append(close)
    app.router.add_get("/api/v1/trend", trend_handler)
    app.router.add_get("/api/v1/top/{kind}", top_handler)
    app.router.add_get("/api/v1/compare/job", compare_job_handler)
    app.router.add_get("/api/v1/compare/models", compare_models_handler)
    app.router.add_get("/api/v1/anomalies", anomalies_handler)
    app.router.add_get("/api/v1/jobs", jobs_handler)
