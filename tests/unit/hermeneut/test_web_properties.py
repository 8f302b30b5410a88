"""Every HTTP input the web API parses is total (issue 37): any query string of every GET endpoint, any path
parameter, any JSON (or not JSON) body of every POST, any Host / Origin / Referer / Sec-Fetch-Site / Authorization
/ Cookie header, and the login form, are answered with a status below 500 (503 where the question was good and
InfluxDB, deliberately unreachable here, would have had to answer) and, for an error, JSON ``{"error": "<one
line>"}`` (or aiohttp's own plain 400 for a request its HTTP parser refuses before any handler runs); never a
500, never a stack trace. Receivers' URLs come from the URL check's own strategy
(tests/unit/alerting/test_targets_properties.py): a subscription the API accepts names no refused target.

The server is the real application on loopback (``serving``); the alerting admin is the real ``AlertAdmin`` with
its Kafka writes applied in memory, and the dashboard's Kafka-fed parts are the real, unstarted ones (empty), so
every request is parsed and checked by the code that serves it and nothing waits for a server."""

from __future__ import annotations

import contextlib
import http.client
import json
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from alerting.admin import AlertAdmin
from alerting.model import Subscription
from alerting.targets import refused_address
from hermeneut.web.alerts_api import ADMIN, _Admin
from hermeneut.web.app import create_app, serving
from hermeneut.web.dashboard import LIVE, TOPOLOGY, Lazy
from hermeneut.web.live import LiveFleet
from hermeneut.web.query_api import COMMON, SCOPE
from pipeline.codec import decode_record
from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings, WebSettings
from pipeline.mirror import TopicMirror
from pipeline.topology import NodeTopology
from tests.fuzzing import FANOUT, SEEDS, count, text_mutations
from tests.unit.alerting.test_targets_properties import _HOSTS, _URLS, _readings

TOKEN = "s3cret-token"


class OfflineAdmin(AlertAdmin):
    """The real admin (parsing, validation, the URL check, reads), its writes applied to its own mirror in memory
    instead of published: nothing here waits for Kafka."""

    def _write(self, key: bytes, value: bytes | None, visible: Callable[[], bool]) -> None:
        self._config._apply(key, value, "in memory")
        assert visible()


def _settings(tmp_path: Path, **web: Any) -> Settings:
    return Settings(
        kafka=KafkaSettings(bootstrap_servers="127.0.0.1:9"),
        influxdb=InfluxSettings(url="http://127.0.0.1:9", token=SecretStr("t")),
        services=ServiceSettings(state_dir=tmp_path, cache_dir=tmp_path),
        web=WebSettings(**web),
    )


@contextlib.contextmanager
def _server(settings: Settings) -> Iterator[tuple[str, int, OfflineAdmin]]:
    app = create_app(settings)
    admin = OfflineAdmin(settings)
    app[ADMIN] = _Admin(settings, admin)
    app[LIVE] = Lazy(lambda: LiveFleet(settings), LiveFleet.stop)
    app[TOPOLOGY] = Lazy(
        lambda: TopicMirror(
            settings.kafka.client_config(), settings.topics.topology, lambda v: decode_record(NodeTopology, v)
        ),
        TopicMirror.stop,
    )
    with serving(app) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        yield host, int(port), admin


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, OfflineAdmin]]:
    with _server(_settings(tmp_path_factory.mktemp("web"))) as running:
        yield running


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, OfflineAdmin]]:
    settings = _settings(tmp_path_factory.mktemp("web-token"), host="0.0.0.0", token=SecretStr(TOKEN))
    with _server(settings) as running:
        yield running


_CONNECTIONS: dict[int, http.client.HTTPConnection] = {}


def _request(
    where: tuple[str, int, OfflineAdmin], method: str, path: str, body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes] | None:  # fmt: skip
    """Status and body, or None when http.client itself refuses to send it (a control character in a header).
    One kept-alive connection per server: a new one per request costs more than the request."""
    host, port, _ = where
    kept = _CONNECTIONS.pop(port, None)
    conn = kept or http.client.HTTPConnection(host, port, timeout=20)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
    except (ValueError, http.client.InvalidURL):
        conn.close()
        return None
    except (ConnectionError, http.client.RemoteDisconnected):
        conn.close()
        if kept is None:
            raise
        return _request(where, method, path, body, headers)  # the server had closed the kept connection
    if resp.getheader("Content-Type", "").startswith("text/event-stream"):
        conn.close()  # a good version number opened the live stream, which never ends: that is its answer
        return resp.status, b""
    answer = resp.status, resp.read()
    if resp.will_close:
        conn.close()
    else:
        _CONNECTIONS[port] = conn
    return answer


def _check(answer: tuple[int, bytes] | None, what: str) -> int:
    if answer is None:
        return 0
    status, body = answer
    assert status < 500 or status == 503, (what, status, body[:300])
    assert b"Traceback" not in body, (what, body)
    if status == 400 and not body.startswith(b"{"):
        return status  # aiohttp's HTTP parser refused the request itself (a Host with a space): no handler ran
    if status >= 400:
        error = json.loads(body)["error"]
        assert isinstance(error, str) and error and "\n" not in error and "Traceback" not in error, (what, body)
    return status


_TOKENS = [
    "", "1h", "24h", "7d", "90s", "0s", "-1h", "1e309", "nan", "inf", "-1", "0", "10", "9" * 30, "2025-09-24T03:17:00Z",
    "2025-09-24T03:40:00Z", "2025-13-40T99:99:99Z", "power_watts", "power_ratio_of_limit", "p95", "mean", "max", "gpu",
    "node", "gpu_model", "true", "yes", "json", "csv", "table", "flux", "influxql", "auto", "x" * 300, 'a"b', "\\",
    "'", "${x}", "\x00", "\u00e9", "r\n", "|> drop()", "/.*/", "hot", "wasted", "firing", "windows", "compute",
]  # fmt: skip
_VALUE = st.sampled_from(_TOKENS) | st.text(max_size=24)
_GETS: dict[str, tuple[str, ...]] = {
    "/api/v1/trend": ("field", "by", "every", "fn", "band", "phase", *SCOPE, *COMMON),
    "/api/v1/top/{kind}": ("n", "fn", "threshold", *SCOPE, *COMMON),
    "/api/v1/compare/job": ("job", "feature", "phase", *COMMON),
    "/api/v1/compare/models": ("application", "a", "b", "feature", "cluster", *COMMON),
    "/api/v1/anomalies": ("every", "detector", "limit", "part", *SCOPE, *COMMON),
    "/api/v1/jobs": (*SCOPE, *COMMON),
    "/api/v1/alerts": ("status",),
    "/api/v1/alerts/history": ("range", "subscription", "detector", "outcome", "status", "cluster", "dedup_key",
                               "limit"),
    "/api/v1/health": ("cluster", "node", "gpu", "lookback", "silent_after", "at", "range"),
    "/api/v1/reliability": ("range", "by", "cluster"),
    "/api/v1/gpus/{p}/history": ("range", "start", "stop"),
    "/api/v1/jobs/{p}/history": ("range", "start", "stop"),
    "/api/v1/rightsizing": ("range", "start", "stop"),
    "/api/v1/topology/{p}/{p}": (),
    "/api/v1/live": ("since",),
    "/api/v1/fleet": (),
    "/api/v1/topology": (),
    "/api/v1/alerts/subscriptions": (),
    "/api/v1/alerts/silences": (),
}  # fmt: skip


@st.composite
def _get(draw: st.DrawFn) -> str:
    route = draw(st.sampled_from(sorted(_GETS)))
    names = _GETS[route]
    pairs = draw(st.lists(st.tuples(st.sampled_from(names) if names else _VALUE, _VALUE), max_size=5))
    if draw(st.booleans()):
        pairs.append((draw(st.text(max_size=8)), draw(_VALUE)))  # a parameter the endpoint does not take
    path = route.replace("{kind}", urllib.parse.quote(draw(_VALUE), safe=""))
    while "{p}" in path:
        path = path.replace("{p}", urllib.parse.quote(draw(_VALUE), safe="") or "x", 1)
    return f"{path}?{urllib.parse.urlencode(pairs)}"


@pytest.mark.fuzz
@given(_get(), SEEDS)
def test_every_get_endpoint_answers_any_query_with_a_result_or_one_line(
    server: tuple[str, int, OfflineAdmin], target: str, seed: int
) -> None:
    for variant in text_mutations(target, seed):
        # a request target must start with "/" (else aiohttp's HTTP parser answers before the application does)
        path = "/" + urllib.parse.quote(variant, safe="/?&=%+").lstrip("/")
        count()
        _check(_request(server, "GET", path), path)


_JSON: Any = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from(_TOKENS) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
_MATCHERS = st.lists(
    st.sampled_from(['node="n1"', 'detector=~"therm.*"', 'gpu!=""', "{", "x", ""]) | _VALUE, max_size=3
)
_RECEIVER = st.fixed_dictionaries(
    {"kind": st.sampled_from(["webhook", "slack", "email", "kafka", "pager"]) | _VALUE},
    optional={"url": _URLS | _JSON, "secret": _VALUE | _JSON, "secret_env": _VALUE, "to": _VALUE, "smtp": _VALUE,
              "topic": _VALUE, "smtp_starttls": _JSON},
)  # fmt: skip
_SUBSCRIPTION = st.fixed_dictionaries(
    {"name": _VALUE, "owner": _VALUE, "receivers": st.lists(_RECEIVER, max_size=3) | _JSON},
    optional={"team": _VALUE, "match": _MATCHERS | _JSON, "group_by": st.lists(_VALUE, max_size=3) | _JSON,
              "group_wait": _VALUE | _JSON, "group_interval": _VALUE, "repeat": _VALUE, "send_resolved": _JSON},
)  # fmt: skip
#: a subscription that passes every other check, so that its receivers' URLs reach the URL check
_HOOK = st.builds(
    lambda kind, scheme, host, port: {"kind": kind, "url": f"{scheme}://{host}{port}/hook"},
    st.sampled_from(["webhook", "slack"]),
    st.sampled_from(["http", "https"]),
    _HOSTS,
    st.sampled_from(["", ":8080", ":99999", ":x"]),
)
_GOOD_SUBSCRIPTION = st.builds(
    lambda receivers, match: {"name": "s", "owner": "o", "receivers": receivers, "match": match},
    st.lists(_HOOK, min_size=1, max_size=2),
    st.sampled_from([[], ['node="n1"']]),
)
_SILENCE = st.fixed_dictionaries(
    {"match": _MATCHERS | _JSON}, optional={"for": _VALUE | _JSON, "by": _VALUE | _JSON, "comment": _VALUE | _JSON}
)
_ACK = st.fixed_dictionaries({}, optional={"by": _VALUE | _JSON, "comment": _VALUE | _JSON})
_POSTS = st.one_of(
    st.tuples(st.just("/api/v1/alerts/subscriptions"), _GOOD_SUBSCRIPTION | _SUBSCRIPTION | _JSON),
    st.tuples(st.just("/api/v1/alerts/silences"), _SILENCE | _JSON),
    st.tuples(_VALUE.map(lambda ref: f"/api/v1/alerts/{urllib.parse.quote(ref, safe='') or 'x'}/ack"), _ACK | _JSON),
)


@pytest.mark.fuzz
@given(_POSTS, st.sampled_from(["application/json", "text/plain", "application/json; charset=latin-1", ""]), SEEDS)
def test_every_post_answers_any_body_with_a_result_or_one_line(
    server: tuple[str, int, OfflineAdmin], post: tuple[str, Any], content_type: str, seed: int
) -> None:
    path, value = post
    for variant in text_mutations(json.dumps(value), seed):
        count()
        headers = {"Content-Type": content_type} if content_type else {}
        status = _check(_request(server, "POST", path, variant.encode("utf-8", "surrogatepass"), headers), variant)
        if status == 201 and path.endswith("/subscriptions"):
            created = json.loads(variant)
            for receiver in created.get("receivers", []):
                refused = [ip for ip in _readings(str(receiver.get("url", ""))) if refused_address(ip)]
                assert not refused, receiver  # the URL check held at creation


def test_a_created_subscription_with_a_hostile_webhook_is_a_400_with_the_reason(
    server: tuple[str, int, OfflineAdmin],
) -> None:
    """Issue 37's URLs through the API: 400 with the reason (a 500 before), nothing stored; a good one is 201."""
    _, _, admin = server
    before = len(admin.subscriptions())
    for url in ("http://127.0.0.1%09:1/", "http://127\u30020\u30020\u30021/", "http://2130706433/", "http://0x7f.1/",
                "http://[::ffff:127.0.0.1]/", "http://[::127.0.0.1]/"):  # fmt: skip
        body = {"name": "s", "owner": "o", "receivers": [{"kind": "webhook", "url": url}]}
        answer = _request(server, "POST", "/api/v1/alerts/subscriptions", json.dumps(body).encode(),
                          {"Content-Type": "application/json"})  # fmt: skip
        assert answer is not None and answer[0] == 400, (url, answer)
        assert json.loads(answer[1])["error"].startswith("receiver URL"), answer
    assert len(admin.subscriptions()) == before
    good = {"name": "s", "owner": "o", "receivers": [{"kind": "webhook", "url": "https://hooks.example.com/x"}]}
    answer = _request(server, "POST", "/api/v1/alerts/subscriptions", json.dumps(good).encode(),
                      {"Content-Type": "application/json"})  # fmt: skip
    assert answer is not None and answer[0] == 201, answer
    assert [isinstance(s, Subscription) for s in admin.subscriptions()] == [True] * (before + 1)


_HEADER = st.sampled_from(["Host", "Origin", "Referer", "Sec-Fetch-Site", "Authorization", "Cookie", "Content-Type"])
_HEADER_SAMPLES = [
    f"Bearer {TOKEN}", "Bearer", "bearer  x", f"hermeneut_session={'0' * 64}", "null", "http://evil.example",
    "cross-site", "same-origin", "[::1]", "localhost:1", "evil.example", "application/json", "a" * 500,
]  # fmt: skip
_HEADER_VALUES = st.sampled_from(_HEADER_SAMPLES) | _VALUE


@pytest.mark.fuzz
@given(
    st.sampled_from([("GET", "/api/v1/fleet"), ("POST", "/api/v1/alerts/silences"), ("GET", "/"),
                     ("POST", "/login"), ("GET", "/login"), ("DELETE", "/api/v1/alerts/silences/x")]),
    st.dictionaries(_HEADER, _HEADER_VALUES, max_size=4),
    _VALUE,
    st.booleans(),
    SEEDS,
)  # fmt: skip
def test_the_checks_before_every_handler_answer_any_headers_with_a_result_or_one_line(
    server: tuple[str, int, OfflineAdmin],
    token_server: tuple[str, int, OfflineAdmin],
    route: tuple[str, str],
    headers: dict[str, str],
    form_token: str,
    with_token: bool,
    seed: int,
) -> None:
    method, path = route
    body = (
        urllib.parse.urlencode({"token": form_token}).encode()
        if path == "/login"
        else json.dumps({"match": ['node="n1"'], "for": "1h", "by": "me"}).encode()
    )
    if path == "/login":
        headers = headers | {"Content-Type": "application/x-www-form-urlencoded"}
    where = token_server if with_token else server
    mutated = {name: list(text_mutations(value, seed + n)) for n, (name, value) in enumerate(headers.items())}
    for i in range(FANOUT if headers else 1):
        sent = {name: values[i] for name, values in mutated.items()}
        count()
        answer = _request(where, method, path, body if method == "POST" else None, sent)
        if answer is not None and answer[0] in (200, 302, 303):
            continue  # the page and the login form answer HTML or a redirect
        _check(answer, f"{method} {path} {sent}")


@pytest.mark.parametrize(
    "path", ["/api/v1/topology/c1%0A/n1", "/api/v1/topology/c1/n1%0D", "/api/v1/gpus/GPU-1%0A/history",
             "/api/v1/jobs/j1%0A/history"],
)  # fmt: skip
def test_a_path_value_ending_in_a_line_break_is_a_400_not_a_500(
    server: tuple[str, int, OfflineAdmin], path: str
) -> None:
    """Found by the GET target at 10,000 inputs: ``check_value``'s pattern (``^...$``) lets a trailing line break
    through, and the topology view's 404 reason cannot hold one (aiohttp raised ValueError: a 500)."""
    answer = _request(server, "GET", path)
    assert answer is not None and answer[0] == 400, answer
    assert "has characters a" in json.loads(answer[1])["error"]


@pytest.mark.parametrize(
    "headers", [{"Cookie": "hermeneut_session=0\u00e90"}, {"Authorization": "Bearer \u00e9"}],
    ids=["cookie", "bearer"],
)  # fmt: skip
def test_a_credential_with_a_byte_that_is_not_utf8_is_a_401_not_a_500(
    token_server: tuple[str, int, OfflineAdmin], headers: dict[str, str]
) -> None:
    """Found by the header target at 100,000 inputs (``make fuzz``): http.client sends the value's 0xE9 as is, aiohttp
    keeps that byte as a lone surrogate, and encoding it for the comparison raised (a 500)."""
    answer = _request(token_server, "GET", "/api/v1/fleet", headers=headers)
    assert answer is not None and answer[0] == 401, answer
