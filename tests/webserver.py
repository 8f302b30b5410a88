"""A real aiohttp server for tests: the application on a free loopback port, served by a background thread."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from pipeline.services.procs import free_port


@contextmanager
def serving(app: web.Application) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1:<free port> until the block ends; yields the base URL.

    The event loop lives in its own thread from setup to cleanup, so this works beside another running loop
    (Playwright's sync API keeps one in the calling thread)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(app)
    port = free_port()

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()

    asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def get(url: str, token: str | None = None) -> tuple[int, str, str]:
    """GET ``url``: status, content type and body text (error statuses too)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as resp:
            return resp.status, resp.headers.get_content_type(), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get_content_type(), exc.read().decode()


def get_json(url: str, token: str | None = None) -> tuple[int, Any]:
    status, _, body = get(url, token)
    return status, json.loads(body)
