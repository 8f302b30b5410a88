"""Alerting routes of the web app: subscriptions, silences, alerts, acks and notification history (JSON).

    GET    /api/v1/alerts[?status=firing|pending|resolved]   current alerts (with silenced/inhibited/acked)
    POST   /api/v1/alerts/{fingerprint}/ack                   {"by": "...", "comment": "..."}
    GET    /api/v1/alerts/subscriptions                       secrets redacted
    POST   /api/v1/alerts/subscriptions                       {"name", "owner", "team", "match": [...],
                                                            "receivers": [{"kind": "webhook", "url", "secret"}...],
                                                            "group_by", "group_wait", "group_interval", "repeat",
                                                            "send_resolved"}  -> 201 {"id": ...}
    DELETE /api/v1/alerts/subscriptions/{id}
    GET    /api/v1/alerts/silences
    POST   /api/v1/alerts/silences                            {"match": [...], "for": "2h", "by", "comment"} -> 201
    DELETE /api/v1/alerts/silences/{id}
    GET    /api/v1/alerts/history?range=24h&subscription=&detector=&outcome=&status=&limit=
    GET    /api/v1/health[?cluster=&node=&gpu=&lookback=24h&silent_after=2m]  GPUs and nodes by state, remedies
                                                           now; with at=T or range=A..B|D the past (stored findings,
                                                           T/A/B RFC 3339 or a duration ago), "empty": true and
                                                           "empty_selection" when nothing reported
    GET    /api/v1/reliability[?range=7d&by=gpu_model|cluster|node&cluster=]  incidents, MTBI, repair, lemon nodes

Malformed input is HTTP 400 with ``{"error": "<one line>"}``; an unknown id is 404; Kafka or InfluxDB
unreachable is 503. Blocking work (Kafka, InfluxDB) runs in a thread, off the event loop. The admin (mirrors
of the alert topics) starts on the first alerting request, so the rest of the app serves without Kafka.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from alerting.admin import (
    AlertAdmin,
    silence_from_json,
    silence_json,
    subscription_from_json,
    subscription_json,
)
from alerting.model import AlertStatus
from hermeneut.views.health import HealthQuery, fleet_health, health_json, past_of
from hermeneut.views.reliability import ReliabilityQuery, fleet_reliability
from hermeneut.web.dashboard import TOPOLOGY
from hermeneut.web.query_api import SETTINGS, Params
from pipeline.config import Settings
from pipeline.errors import AlertConfigError, ConfigError, InvalidInput, InvalidQuery, ServiceError
from pipeline.reliability import report_json
from pipeline.vocab import parse_seconds
from sinks.query.alerts import HistoryQuery, row_json, run_history
from sinks.query.store import Store

#: what GET /api/v1/health takes (anything else is a 400)
HEALTH_PARAMS: Final = ("cluster", "node", "gpu", "lookback", "silent_after", "at", "range")


class _Admin:
    """The AlertAdmin, started on first use (a failed start is a 503 and is tried again next time)."""

    def __init__(self, settings: Settings, admin: AlertAdmin | None) -> None:
        self.settings, self.admin = settings, admin
        self.lock = asyncio.Lock()

    async def get(self) -> AlertAdmin:
        async with self.lock:
            if self.admin is None:
                try:
                    self.admin = await _run(lambda: AlertAdmin(self.settings).start())
                except ConfigError as exc:
                    raise ServiceError(str(exc)) from exc
            return self.admin

    async def close(self) -> None:
        if self.admin is not None:
            await _run(self.admin.close)


ADMIN: web.AppKey[_Admin] = web.AppKey("alerts_admin", _Admin)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message.splitlines()[0] if message else "error"}, status=status)


async def _run(fn: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


def _guard(
    handler: Callable[[web.Request], Awaitable[web.Response]],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def wrapped(request: web.Request) -> web.Response:
        try:
            return await handler(request)
        except InvalidInput as exc:
            status = 404 if str(exc).startswith("no ") else 400
            return _error(status, str(exc))
        except ServiceError as exc:
            return _error(503, str(exc))

    return wrapped


#: nesting a request body may have: the deepest valid one (a subscription's receivers) is 3
MAX_JSON_DEPTH = 16


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings do not count), in one
    pass, without parsing: the parser recurses per level, and a few thousand levels exhaust its stack."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


async def _body(request: web.Request) -> Any:
    """The JSON body: ``application/json`` only (415 otherwise: a cross-site form cannot send it), nested at most
    :data:`MAX_JSON_DEPTH` deep (400)."""
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(reason="send the body as JSON (Content-Type: application/json)")
    text = await request.text()
    if json_depth(text) > MAX_JSON_DEPTH:
        raise AlertConfigError(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except ValueError:
        raise AlertConfigError("the request body is not JSON") from None


def add_routes(app: web.Application, settings: Settings, admin: AlertAdmin | None = None) -> None:
    """Mount the alerting routes; the admin (Kafka mirrors) starts on first use and stops with the app."""
    app[ADMIN] = _Admin(settings, admin)

    async def stop(app: web.Application) -> None:
        await app[ADMIN].close()

    app.on_cleanup.append(stop)

    app.router.add_get("/api/v1/health", _health)
    app.router.add_get("/api/v1/reliability", _reliability)
    app.router.add_get("/api/v1/alerts", _list_alerts)
    app.router.add_get("/api/v1/alerts/subscriptions", _list_subscriptions)
    app.router.add_post("/api/v1/alerts/subscriptions", _add_subscription)
    app.router.add_delete("/api/v1/alerts/subscriptions/{id}", _delete_subscription)
    app.router.add_get("/api/v1/alerts/silences", _list_silences)
    app.router.add_post("/api/v1/alerts/silences", _add_silence)
    app.router.add_delete("/api/v1/alerts/silences/{id}", _delete_silence)
    app.router.add_get("/api/v1/alerts/history", _history)
    app.router.add_post("/api/v1/alerts/{alert}/ack", _ack)


@_guard
async def _list_alerts(request: web.Request) -> web.Response:
    raw = request.query.get("status")
    if raw is not None and raw not in {s.value for s in AlertStatus}:
        raise AlertConfigError(f"status {raw!r} is not one of pending, firing, resolved")
    status = AlertStatus(raw) if raw else None
    adm = await request.app[ADMIN].get()
    return web.json_response(await _run(lambda: adm.alerts_json(status)))


@_guard
async def _ack(request: web.Request) -> web.Response:
    body = await _body(request)
    if not isinstance(body, dict) or not isinstance(body.get("by"), str):
        raise AlertConfigError('an acknowledgement needs {"by": "<name>"}')
    comment = body.get("comment", "")
    if not isinstance(comment, str):
        raise AlertConfigError("'comment' must be a string")
    ref = request.match_info["alert"]
    adm = await request.app[ADMIN].get()
    done = await _run(lambda: adm.ack(ref, body["by"], comment))
    return web.json_response({"dedup_key": done.dedup_key, "by": done.by, "at_ns": done.at_ns})


@_guard
async def _list_subscriptions(request: web.Request) -> web.Response:
    adm = await request.app[ADMIN].get()
    subs = await _run(adm.subscriptions)
    return web.json_response([subscription_json(s) for s in subs])


@_guard
async def _add_subscription(request: web.Request) -> web.Response:
    sub = subscription_from_json(await _body(request))
    adm = await request.app[ADMIN].get()
    await _run(lambda: adm.add(sub))
    return web.json_response(subscription_json(sub), status=201)


@_guard
async def _delete_subscription(request: web.Request) -> web.Response:
    sub_id = request.match_info["id"]
    adm = await request.app[ADMIN].get()
    await _run(lambda: adm.remove_subscription(sub_id))
    return web.json_response({"deleted": sub_id})


@_guard
async def _list_silences(request: web.Request) -> web.Response:
    admin = await request.app[ADMIN].get()
    sils = await _run(admin.silences)
    now = admin.clock_ns()
    return web.json_response([silence_json(s, now) for s in sils])


@_guard
async def _add_silence(request: web.Request) -> web.Response:
    silence = silence_from_json(await _body(request))
    admin = await request.app[ADMIN].get()
    await _run(lambda: admin.add(silence))
    return web.json_response(silence_json(silence, admin.clock_ns()), status=201)


@_guard
async def _delete_silence(request: web.Request) -> web.Response:
    silence_id = request.match_info["id"]
    adm = await request.app[ADMIN].get()
    await _run(lambda: adm.remove_silence(silence_id))
    return web.json_response({"deleted": silence_id})


@_guard
async def _history(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    q = request.query
    limit = q.get("limit", "1000")
    if not limit.isdigit():
        raise InvalidQuery(f"limit {limit!r} is not a whole number")
    query = HistoryQuery(
        q.get("range", "24h"),
        q.get("subscription"),
        q.get("detector"),
        q.get("outcome"),
        q.get("status"),
        q.get("cluster"),
        q.get("dedup_key"),
        int(limit),
    )
    query.validate()
    rows = await _run(lambda: run_history(settings, query))
    return web.json_response([row_json(r) for r in rows])


@_guard
async def _health(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    p = Params(request.query, request.query.getall, HEALTH_PARAMS)
    now = time.time_ns()
    start_ns, stop_ns = past_of(p.text("at"), p.text("range"), now, ("at", "range"))
    query = HealthQuery(
        p.text("cluster") or None,
        p.text("node") or None,
        p.text("gpu") or None,
        parse_seconds(p.text("lookback", "24h") or "", "lookback", error=InvalidQuery),
        parse_seconds(p.text("silent_after", "2m") or "", "silent_after", error=InvalidQuery),
        start_ns,
        stop_ns,
    )
    query.validate()
    # the past is read from InfluxDB alone (the stored findings), as the CLI reads it: no Kafka needed
    adm = None if query.past else await request.app[ADMIN].get()
    topologies = (
        (await request.app[TOPOLOGY].get()).snapshot().values() if TOPOLOGY in request.app and not query.past else ()
    )

    def look() -> dict[str, Any]:
        with Store.from_settings(settings) as store:
            found = fleet_health(adm, store, query, now, settings.health, topologies, settings.alerts.stale_after_s)
            return health_json(found, query)

    return web.json_response(await _run(look))


@_guard
async def _reliability(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    q = request.query
    query = ReliabilityQuery(
        parse_seconds(q.get("range", "7d"), "range", error=InvalidQuery), q.get("by", "gpu_model"), q.get("cluster")
    )
    query.validate(settings.storage.raw_retention_days)

    def look() -> dict[str, Any]:
        with Store.from_settings(settings) as store:
            return report_json(fleet_reliability(store, query, time.time_ns(), settings.health))

    return web.json_response(await _run(look))
