"""The one aiohttp application: bearer-token check, JSON errors, ``/healthz``, and each area's routes.

A token is required whenever the server listens on anything but loopback (and whenever one is configured):
``Authorization: Bearer <token>``, compared in constant time. It comes from ``web.token`` or, when unset, is
generated once and kept in ``<state_dir>/web-token`` (mode 0600); it is never logged and never put in a page.
Cross-site requests are refused (:func:`same_origin_middleware`): a request that changes state (any method but
GET/HEAD/OPTIONS) without the bearer token must not carry an ``Origin`` (or ``Referer``) other than this server's
own, nor ``Sec-Fetch-Site: cross-site``, which is what a browser adds to a form or ``fetch`` posted from another
site; the API also takes JSON bodies only as ``application/json``, which no cross-site page can send without a CORS
preflight that is never granted. A server on loopback (no token) answers only to loopback names and
``web.allowed_hosts`` in its ``Host`` header, so a page whose DNS name is rebound to 127.0.0.1 gets a 421. The page
itself changes nothing (the dashboard only reads); its login form is covered by the same origin check.
Every error is JSON ``{"error": "<one line>"}``: 400 for a malformed request, 401 without the right token,
403 for a cross-site request, 404/405 for unknown routes, 415 for a body that is not JSON, 421 for a foreign
Host, 503 when InfluxDB does not answer, 500 (logged here, never a stack trace in the response) for anything else.
Requests are counted by route, method and status for ``/metrics``, which the CLI
serves on a port of its own (``metrics.web_port``), outside the token check.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram

from hermeneut.web import alerts_api, dashboard, query_api
from pipeline.config import Settings
from pipeline.errors import HermeneutError, InvalidInput, ServiceError
from pipeline.metrics import DURATION_BUCKETS
from pipeline.services.procs import free_port
from sinks.query import Store

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PUBLIC_PATHS = frozenset({"/healthz", "/login"})
#: methods counted by name; any other a client sends is counted as "other" (a label must not grow without bound)
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or a wildcard: reachable from elsewhere


def token_path(settings: Settings) -> Path:
    return settings.services.state_dir / "web-token"


def load_or_create_token(path: Path) -> str:
    """The token kept at ``path``, generated (mode 0600) the first time."""
    try:
        token = path.read_text().strip()
        if token:
            return token
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def required_token(settings: Settings) -> str | None:
    """The token clients must present, or None (loopback without a configured token)."""
    if settings.web.token is not None:
        return settings.web.token.get_secret_value()
    if is_loopback(settings.web.host):
        return None
    return load_or_create_token(token_path(settings))


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message.splitlines()[0] if message else "error"}, status=status)


SESSION_COOKIE: Final = "hermeneut_session"


def session_value(token: str) -> str:
    """What the dashboard's session cookie holds: an HMAC of the token, so the token itself never sits in a
    browser (and a leaked cookie does not give the bearer token to the API's other clients)."""
    return hmac.new(token.encode(), b"hermeneut dashboard session", hashlib.sha256).hexdigest()


def _public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith("/static/")


#: methods that only read: a cross-site page may cause them (a link, an image) but learns nothing it can read
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _sent(text: str) -> bytes:
    """The bytes a client sent, from aiohttp's text of a header or form (which keeps bytes that are not UTF-8 as
    lone surrogates: a plain ``encode`` raised on them, a 500 for a cookie holding a Latin-1 byte)."""
    return text.encode("utf-8", "surrogateescape")


def _bearer(request: web.Request, expected: bytes | None) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return expected is not None and scheme.lower() == "bearer" and hmac.compare_digest(_sent(given.strip()), expected)


def _origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of a URL (an Origin header already is one; a Referer is a whole URL); None for
    an opaque origin (``null``) or a malformed one."""
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme or not rest:
        return None
    return f"{scheme.lower()}://{rest.split('/', 1)[0].lower()}"


def host_allowed(host: str, extra: frozenset[str]) -> bool:
    """Whether a ``Host`` header names this loopback server: a loopback address or ``localhost`` (any port), or a
    name in ``web.allowed_hosts``."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower().rstrip(".")
    return is_loopback(name) or name in extra


def same_origin_middleware(settings: Settings, token: str | None) -> Middleware:
    """Refuse DNS rebinding (a loopback server answers only to its own names) and cross-site requests that change
    state (see the module docstring). A request with the bearer token is exempt from the origin check: a browser
    cannot add that header to a cross-site request without a preflight this server never grants."""
    expected = token.encode() if token is not None else None
    check_host = is_loopback(settings.web.host)
    extra = settings.web.allowed_host_names()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if check_host and not host_allowed(request.host, extra):
            return error(421, f"Host {request.host[:100]!r} is not this server (web.allowed_hosts names others)")
        if request.method not in SAFE_METHODS and not _bearer(request, expected):
            own = f"{request.scheme}://{request.host.lower()}"
            origin = request.headers.get("Origin") or request.headers.get("Referer")
            if origin is not None and _origin_of(origin) != own:
                return error(403, f"cross-site request refused: origin {origin[:100]!r} is not {own}")
            if request.headers.get("Sec-Fetch-Site", "").lower() in ("cross-site", "same-site"):
                return error(403, "cross-site request refused (Sec-Fetch-Site)")
        return await handler(request)

    return check


def auth_middleware(token: str | None) -> Middleware:
    expected = token.encode() if token is not None else None
    session = session_value(token).encode() if token is not None else None

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if expected is not None and session is not None and not _public(request.path):
            bearer = _bearer(request, expected)
            cookie = hmac.compare_digest(_sent(request.cookies.get(SESSION_COOKIE, "")), session)
            if not (bearer or cookie):
                if request.method == "GET" and request.path == "/":
                    raise web.HTTPFound("/login")
                response = error(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        return await handler(request)

    return check


def add_login(app: web.Application, token: str | None) -> None:
    """``/login``: a form that trades the token for an HttpOnly, SameSite=Strict session cookie."""

    async def form(_request: web.Request) -> web.StreamResponse:
        if token is None:
            raise web.HTTPFound("/")
        return web.FileResponse(Path(__file__).parent / "static" / "login.html")

    async def login(request: web.Request) -> web.StreamResponse:
        given = str((await request.post()).get("token", "")).strip()
        if token is None or not hmac.compare_digest(_sent(given), token.encode()):
            raise web.HTTPFound("/login?failed=1")
        response = web.HTTPFound("/")
        response.set_cookie(
            SESSION_COOKIE, session_value(token), httponly=True, samesite="Strict", secure=request.secure, path="/"
        )
        raise response

    app.router.add_get("/login", form)
    app.router.add_post("/login", login)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, exc.reason or exc.text or "error")
    except InvalidInput as exc:
        return error(400, str(exc))
    except ServiceError as exc:
        return error(503, str(exc))
    except HermeneutError as exc:
        return error(400, str(exc))
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error(500, "internal error (the server log has the details)")


def metrics_middleware(registry: CollectorRegistry | None) -> Middleware:
    """Counts every answered request (``hermeneut_web_requests_total{route,method,status}``) and times it
    (``hermeneut_web_request_seconds{route}``); ``route`` is the matched route's pattern (``/api/v1/gpu/{uuid}``),
    never the path itself, or ``unmatched``."""
    requests = Counter(
        "hermeneut_web_requests",
        "HTTP requests answered, by route, method and status.",
        ["route", "method", "status"],
        registry=registry,
    )
    seconds = Histogram(
        "hermeneut_web_request_seconds",
        "Seconds to answer a request, by route.",
        ["route"],
        buckets=DURATION_BUCKETS,
        registry=registry,
    )

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
        started, status = time.perf_counter(), 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            method = request.method if request.method in METHODS else "other"
            requests.labels(route, method, str(status)).inc()
            seconds.labels(route).observe(time.perf_counter() - started)

    return count


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def create_app(
    settings: Settings, store: Store | None = None, registry: CollectorRegistry | None = None
) -> web.Application:
    """The application for resolved settings (InfluxDB known); ``store`` is created from them when not given
    (and then closed with the app); requests are counted on ``registry``."""
    token = required_token(settings)
    app = web.Application(
        middlewares=[
            metrics_middleware(registry),
            json_errors,
            same_origin_middleware(settings, token),
            auth_middleware(token),
        ]
    )
    app.router.add_get("/healthz", healthz)
    add_login(app, token)
    query_api.add_routes(app, settings, store)
    alerts_api.add_routes(app, settings)
    dashboard.add_routes(app, settings)
    return app


@contextmanager
def serving(app: web.Application, host: str = "127.0.0.1", port: int | None = None) -> Iterator[str]:
    """Serve ``app`` from a background thread until the block ends; yields the base URL (tests, benchmarks).

    The event loop lives in its own thread from setup to cleanup, so this works beside another running loop
    (Playwright's sync API keeps one in the calling thread)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(app)
    port = port or free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    try:
        yield f"http://{host}:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
