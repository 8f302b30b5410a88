"""The HTTP application on a real loopback server: health, JSON errors, parameter checks, bearer tokens.

InfluxDB is deliberately unreachable here (a closed port): what these tests check happens before or instead
of a query. tests/integration/test_queries.py runs the endpoints against a real InfluxDB.
"""

from __future__ import annotations

import json
import stat
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from hermeneut.web.alerts_api import json_depth
from hermeneut.web.app import create_app, is_loopback, required_token, serving, token_path
from pipeline.config import InfluxSettings, ServiceSettings, Settings, WebSettings
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


def test_health_of_the_past_takes_at_and_range_strictly_and_needs_no_kafka(tmp_path: Path) -> None:
    """``at``/``range`` as the CLI takes them: a bad one is a 400 with one line naming the parameter; a good one is
    judged from InfluxDB alone (here unreachable: its 503), never waiting for the alert manager's Kafka."""
    with serving(create_app(_settings(tmp_path))) as url:
        health = f"{url}/api/v1/health"
        for query, message in [
            ("at=soon", "at 'soon' is not a duration"),
            ("at=2025-09-24T03:17:00Z%0A", "at '2025-09-24T03:17:00Z\\n' is not a time like"),
            ("at=0001-01-01", "at '0001-01-01' is not between 1970 and 2262"),
            ("at=1d&range=2d", "give at (an instant) or range (a span), not both"),
            ("range=1d..2d", "range 1d..2d: its start must be before its end"),
            ("range=", "range '' is not a duration"),
            ("at=1d&at=2d", "parameter at given 2 times"),
            ("when=1d", "unknown parameter(s) when; this endpoint takes cluster, node, gpu, lookback,"),
            ("lookback=", "lookback '' is not a duration"),
        ]:
            status, body = get_json(f"{health}?{query}")
            assert (status, body["error"][: len(message)]) == (400, message), query
        for past in ("at=3d", "range=2025-09-24T03:17:00Z..2025-09-24T03:40:00Z", "range=6h&cluster=c"):
            status, body = get_json(f"{health}?{past}")
            assert status == 503 and body["error"].startswith("InfluxDB at http://127.0.0.1:9 did not answer"), body
        # now is the alert manager's alerts (Kafka, not set here): the past above did not ask for it
        status, body = get_json(health)
        assert status == 503 and "kafka.bootstrap_servers is not set" in body["error"], body


def _send(url: str, method: str = "POST", body: bytes | None = b"{}", **headers: str) -> tuple[int, dict[str, Any]]:
    """A request with exactly these headers (Content-Type defaults to JSON): status and the JSON answer."""
    headers = {"Content-Type": "application/json"} | headers
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


SILENCE = json.dumps({"match": ['node="n1"'], "for": "30d", "by": "evil"}).encode()


def test_a_cross_site_request_cannot_change_anything(tmp_path: Path) -> None:
    """What a page on another site can make a browser send: a text/plain or form POST (no preflight), a fetch with
    its Origin, a form from an opaque origin. None gets past; the same request from this origin, or from a client
    that is not a browser (no Origin), reaches the handler (which then finds no Kafka here: 503)."""
    with serving(create_app(_settings(tmp_path))) as url:
        silences = f"{url}/api/v1/alerts/silences"
        refused = [
            _send(silences, body=SILENCE, **{"Content-Type": "text/plain", "Origin": "http://evil.example"}),
            _send(silences, body=SILENCE, Origin="http://evil.example"),
            _send(silences, body=SILENCE, Origin="null"),
            _send(silences, body=SILENCE, Referer="http://evil.example/page.html"),
            _send(silences, body=SILENCE, **{"Sec-Fetch-Site": "cross-site"}),
            _send(f"{url}/api/v1/alerts/subscriptions/abc", "DELETE", None, Origin="http://127.0.0.1.evil.example"),
            _send(f"{url}/login", body=b"token=x", Origin="http://evil.example"),
        ]
        assert [s for s, _ in refused] == [403] * len(refused), refused
        assert all("cross-site request refused" in body["error"] for _, body in refused)
        # a simple (text/plain) POST from this very origin still is not JSON
        status, body = _send(silences, body=SILENCE, **{"Content-Type": "text/plain", "Origin": url})
        assert status == 415 and "application/json" in body["error"]
        assert _send(silences, body=SILENCE, Origin=url)[0] == 503
        assert _send(silences, body=SILENCE, **{"Sec-Fetch-Site": "same-origin"})[0] == 503
        assert _send(silences, body=SILENCE)[0] == 503


def test_a_rebound_dns_name_does_not_reach_a_loopback_server(tmp_path: Path) -> None:
    """A page at evil.example whose name the attacker rebinds to 127.0.0.1 sends ``Host: evil.example``: refused
    with 421 before any handler; loopback names and ``web.allowed_hosts`` pass (on to a 503 here: no InfluxDB in
    unit tests)."""
    with serving(create_app(_settings(tmp_path, allowed_hosts="dash.internal"))) as url:
        port = url.rsplit(":", 1)[1]
        answered = {}
        for host in (f"evil.example:{port}", "127.0.0.1.nip.example", f"localhost:{port}", f"127.0.0.1:{port}",
                     "[::1]", "DASH.internal:443"):  # fmt: skip
            request = urllib.request.Request(f"{url}/api/v1/top/hot", headers={"Host": host})
            try:
                with urllib.request.urlopen(request, timeout=60) as resp:
                    answered[host] = resp.status
            except urllib.error.HTTPError as exc:
                answered[host] = exc.code
    assert list(answered.values()) == [421, 421, 503, 503, 503, 503], answered


def test_a_token_server_answers_any_host_and_a_bearer_request_needs_no_origin(tmp_path: Path) -> None:
    with serving(create_app(_settings(tmp_path, host="0.0.0.0", token=SecretStr("tok")))) as url:
        silences = f"{url}/api/v1/alerts/silences"
        status, _ = _send(silences, body=SILENCE, Origin="http://evil.example", Host="gpu-dash.example")
        assert status == 403  # no token: the origin decides, and it is foreign
        bearer = {"Authorization": "Bearer tok", "Origin": "http://tool.example", "Host": "gpu-dash.example"}
        assert _send(silences, body=SILENCE, **bearer)[0] == 503  # past both checks


def test_deep_json_is_a_400_not_a_crash(tmp_path: Path) -> None:
    with serving(create_app(_settings(tmp_path))) as url:
        for body in (b"[" * 5000 + b"]" * 5000, b'{"a":' * 5000 + b"1" + b"}" * 5000):
            status, answer = _send(f"{url}/api/v1/alerts/silences", body=body)
            assert status == 400 and "nested deeper than 16 levels" in answer["error"]
        status, answer = _send(f"{url}/api/v1/alerts/silences", body=b'{"match": ["[[[[[[[[[[[[[[[[[[[["], "for": "')
        assert status == 400 and answer["error"] == "the request body is not JSON"


@pytest.mark.parametrize(
    ("text", "depth"), [("1", 0), ("[]", 1), ('{"a": [{"b": "]]]]"}]}', 3), ('["\\"[[["]', 1), ("[[]][[[]]]", 3)]
)
def test_json_depth(text: str, depth: int) -> None:
    assert json_depth(text) == depth
