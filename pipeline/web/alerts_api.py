"""Alerting routes of the web app: subscriptions, silences, alerts, acks and notification history (JSON).

    GET    /api/alerts[?status=firing|pending|resolved]   current alerts (with silenced/inhibited/acked)
    POST   /api/alerts/{fingerprint}/ack                   {"by": "...", "comment": "..."}
    GET    /api/alerts/subscriptions                       secrets redacted
    POST   /api/alerts/subscriptions                       {"name", "owner", "team", "match": [...],
                                                            "receivers": [{"kind": "webhook", "url", "secret"}...],
                                                            "group_by", "group_wait", "group_interval", "repeat",
                                                            "send_resolved"}  -> 201 {"id": ...}
    DELETE /api/alerts/subscriptions/{id}
    GET    /api/alerts/silences
    POST   /api/alerts/silences                            {"match": [...], "for": "2h", "by", "comment"} -> 201
    DELETE /api/alerts/silences/{id}
    GET    /api/alerts/history?range=24h&subscription=&detector=&outcome=&status=&limit=

Malformed input is HTTP 400 with ``{"error": "<one line>"}``; an unknown id is 404; Kafka or InfluxDB
unreachable is 503. Blocking work (Kafka, InfluxDB) runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pipeline.config import Settings
from pipeline.errors import InvalidQuery, ServiceError
from sinks.alerting.admin import (
    AlertAdmin,
    silence_from_json,
    silence_json,
    subscription_from_json,
    subscription_json,
)
from sinks.alerting.model import AlertConfigError, AlertStatus
from sinks.query_alerts import HistoryQuery, row_json, run_history

ADMIN: web.AppKey[AlertAdmin] = web.AppKey("alerts_admin", AlertAdmin)


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
        except (AlertConfigError, InvalidQuery) as exc:
            status = 404 if str(exc).startswith("no ") else 400
            return _error(status, str(exc))
        except ServiceError as exc:
            return _error(503, str(exc))

    return wrapped


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.text())
    except ValueError:
        raise AlertConfigError("the request body is not JSON") from None


def add_routes(app: web.Application, settings: Settings, admin: AlertAdmin | None = None) -> None:
    """Mount the alerting routes; the admin (Kafka mirrors) starts with the app and stops with it."""

    async def start(app: web.Application) -> None:
        app[ADMIN] = admin or await _run(lambda: AlertAdmin(settings).start())

    async def stop(app: web.Application) -> None:
        await _run(app[ADMIN].close)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)

    @_guard
    async def list_alerts(request: web.Request) -> web.Response:
        raw = request.query.get("status")
        if raw is not None and raw not in {s.value for s in AlertStatus}:
            raise AlertConfigError(f"status {raw!r} is not one of pending, firing, resolved")
        status = AlertStatus(raw) if raw else None
        return web.json_response(await _run(lambda: request.app[ADMIN].alerts_json(status)))

    @_guard
    async def ack(request: web.Request) -> web.Response:
        body = await _body(request)
        if not isinstance(body, dict) or not isinstance(body.get("by"), str):
            raise AlertConfigError('an acknowledgement needs {"by": "<name>"}')
        comment = body.get("comment", "")
        if not isinstance(comment, str):
            raise AlertConfigError("'comment' must be a string")
        ref = request.match_info["alert"]
        done = await _run(lambda: request.app[ADMIN].ack(ref, body["by"], comment))
        return web.json_response({"dedup_key": done.dedup_key, "by": done.by, "at_ns": done.at_ns})

    @_guard
    async def list_subscriptions(request: web.Request) -> web.Response:
        subs = await _run(request.app[ADMIN].subscriptions)
        return web.json_response([subscription_json(s) for s in subs])

    @_guard
    async def add_subscription(request: web.Request) -> web.Response:
        sub = subscription_from_json(await _body(request))
        await _run(lambda: request.app[ADMIN].add(sub))
        return web.json_response(subscription_json(sub), status=201)

    @_guard
    async def delete_subscription(request: web.Request) -> web.Response:
        sub_id = request.match_info["id"]
        await _run(lambda: request.app[ADMIN].remove_subscription(sub_id))
        return web.json_response({"deleted": sub_id})

    @_guard
    async def list_silences(request: web.Request) -> web.Response:
        admin = request.app[ADMIN]
        sils = await _run(admin.silences)
        now = admin.clock_ns()
        return web.json_response([silence_json(s, now) for s in sils])

    @_guard
    async def add_silence(request: web.Request) -> web.Response:
        silence = silence_from_json(await _body(request))
        admin = request.app[ADMIN]
        await _run(lambda: admin.add(silence))
        return web.json_response(silence_json(silence, admin.clock_ns()), status=201)

    @_guard
    async def delete_silence(request: web.Request) -> web.Response:
        silence_id = request.match_info["id"]
        await _run(lambda: request.app[ADMIN].remove_silence(silence_id))
        return web.json_response({"deleted": silence_id})

    @_guard
    async def history(request: web.Request) -> web.Response:
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

    app.router.add_get("/api/alerts", list_alerts)
    app.router.add_get("/api/alerts/subscriptions", list_subscriptions)
    app.router.add_post("/api/alerts/subscriptions", add_subscription)
    app.router.add_delete("/api/alerts/subscriptions/{id}", delete_subscription)
    app.router.add_get("/api/alerts/silences", list_silences)
    app.router.add_post("/api/alerts/silences", add_silence)
    app.router.add_delete("/api/alerts/silences/{id}", delete_silence)
    app.router.add_get("/api/alerts/history", history)
    app.router.add_post("/api/alerts/{alert}/ack", ack)
