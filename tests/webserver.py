"""A real aiohttp server for tests (``serving``, from hermeneut.web.app) and small HTTP helpers to read it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


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
