"""The HTTP application on a real loopback server: health, JSON errors, parameter checks, bearer tokens.

InfluxDB is deliberately unreachable here (a closed port): what these tests check happens before or instead
of a query. tests/integration/test_queries.py runs the endpoints against a real InfluxDB.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from pydantic import SecretStr

from pipeline.config import InfluxSettings, ServiceSettings, Settings, WebSettings
from pipeline.face.web.app import create_app, is_loopback, required_token, serving, token_path
from tests.webserver import get, get_json


def _settings(tmp_path: Path, **web: object) -> Settings:
    return Settings(
        influxdb=InfluxSettings(url="http://127.0.0.1:9", token=SecretStr("t")),
        services=ServiceSettings(state_dir=tmp_path, cache_dir=tmp_path),
        web=WebSettings(**web),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("::", False), ("10.1.2.3", False), ("gpu-dash.example", False)],
)  # fmt: skip
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_token_required_off_loopback_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    assert required_token(_settings(tmp_path)) is None
    exposed = _settings(tmp_path, host="0.0.0.0")
    token = required_token(exposed)
    assert token and len(token) >= 40
    assert stat.S_IMODE(token_path(exposed).stat().st_mode) == 0o600
    assert required_token(exposed) == token
    assert required_token(_settings(tmp_path, host="0.0.0.0", token=SecretStr("configured"))) == "configured"


def test_health_and_json_errors(tmp_path: Path) -> None:
    with serving(create_app(_settings(tmp_path))) as url:
        assert get_json(f"{url}/healthz") == (200, {"status": "ok"})
        status, body = get_json(f"{url}/nope")
        assert status == 404 and body == {"error": "Not Found"}
        status, body = get_json(f"{url}/api/v1/trend?every=ten+seconds")
        assert (
            status == 400
            and body["error"] == "window 'ten seconds' is not a duration like 90s, 15m, 1h30m, 1.5h, 7d, 2w"
        )
        status, body = get_json(f"{url}/api/v1/trend?feild=power_watts")
        assert status == 400 and body["error"].startswith("unknown parameter(s) feild; this endpoint takes field,")
        status, body = get_json(f"{url}/api/v1/top/coolest")
        assert status == 400 and "top list 'coolest' is not one of" in body["error"]
        status, body = get_json(f"{url}/api/v1/top/hot?n=many")
        assert status == 400 and body["error"] == "parameter n='many' is not a int"
        status, body = get_json(f"{url}/api/v1/compare/models?application=llm-serving&a=X")
        assert status == 400 and body["error"] == "parameter(s) b required"
        status, body = get_json(f"{url}/api/v1/trend?fn=mean&fn=max")
        assert status == 400 and body["error"] == "parameter fn given 2 times"
        # a well-formed question while InfluxDB is down: 503 with one line, no stack trace
        status, ctype, text = get(f"{url}/api/v1/top/hot")
        assert status == 503 and ctype == "application/json"
        assert "did not answer" in text and "Traceback" not in text and "\n" not in text


def test_bearer_token(tmp_path: Path) -> None:
    with serving(create_app(_settings(tmp_path, token=SecretStr("s3cret-token")))) as url:
        assert get_json(f"{url}/healthz")[0] == 200  # liveness stays public
        for token in (None, "wrong", "s3cret-token-longer", "s3cret-toke"):
            status, body = get_json(f"{url}/api/v1/trend?every=x", token)
            assert status == 401 and "bearer token" in body["error"]
        assert get_json(f"{url}/api/v1/trend?every=x", "s3cret-token")[0] == 400  # past the check


def test_history_views_take_a_window_of_the_past_and_refuse_one_too_long(tmp_path: Path) -> None:
    with serving(create_app(_settings(tmp_path))) as url:
        past = "start=2025-09-24T03:17:00Z&stop=2025-09-24T03:40:00Z"
        # a valid window of imported history gets as far as the (unreachable) InfluxDB: 503, not a refusal
        status, body = get_json(f"{url}/api/v1/rightsizing?{past}")
        assert status == 503, body
        status, body = get_json(f"{url}/api/v1/rightsizing?start=2025-09-01T00:00:00Z&stop=2025-09-24T00:00:00Z")
        assert status == 400 and body["error"] == "the window (3w2d) is longer than the dashboard shows (7d)"
        status, body = get_json(f"{url}/api/v1/rightsizing?start=2025-09-24T03:40:00Z&stop=2025-09-24T03:17:00Z")
        assert status == 400 and body["error"] == "the range is empty: start must be before stop"
