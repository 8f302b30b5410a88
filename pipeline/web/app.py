"""The one aiohttp application of hermeneut: ``create_app(settings, ...)`` plus the route modules per area.

A token is required whenever the server binds to anything but loopback (``Authorization: Bearer <token>``);
it is compared in constant time and never echoed. Malformed input is HTTP 400 with a one-line JSON message,
never a stack trace; an unexpected error is a 500 with a one-line message (the trace goes to the log only).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.web import alerts_api

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _token_middleware(token: str | None) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return web.json_response({"error": "internal error (see the server log)"}, status=500)

    return middleware


def create_app(settings: Settings, host: str = "127.0.0.1", token: str | None = None) -> web.Application:
    """The application; a token is required (ConfigError without one) unless ``host`` is loopback."""
    if host not in _LOOPBACK and not token:
        raise ConfigError(f"serving on {host} needs a token (Authorization: Bearer); only loopback may go without")
    app = web.Application(middlewares=[_token_middleware(token)])
    alerts_api.add_routes(app, settings)
    return app
