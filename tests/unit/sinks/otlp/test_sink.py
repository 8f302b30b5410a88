"""The OTLP sink against a scripted OTLP/HTTP server on loopback (a real socket and HTTP exchange; the real
OpenTelemetry Collector is tests/integration/test_otlp.py): answers sorted as the OTLP specification says,
requests never grown or resent once taken, a refused message dead-lettered alone, partial success counted; and the
plugin's contract (registry conformance)."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from pipeline import registry
from pipeline.codec import encode_interpreted, encode_record
from pipeline.config import OtlpSettings, Settings
from pipeline.errors import ConfigError, DecodeError, PermanentWriteError, SinkBackpressure, TransientWriteError
from pipeline.events import Finding, InterpretedBatch, Severity
from sinks.base import Position, Prepared
from sinks.otlp.mapping import Exported
from sinks.otlp.send import partial_success, refuses_data, retry_after_s
from sinks.otlp.sink import REJECTED, OtlpSink, parse_headers
from tests.unit.sinks.otlp.test_mapping import FINDING, h100_batches, health


class Script(http.server.BaseHTTPRequestHandler):
    """Answers each POST with the next scripted (status, headers, body); 200 ``{}`` once the script is done.
    A request whose body holds ``poison`` (a host name below) is answered 400 (a collector refusing bad data)."""

    answers: ClassVar[list[tuple[int, dict[str, str], bytes]]] = []
    seen: ClassVar[list[tuple[str, dict[str, Any], dict[str, str]]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append((self.path, body, dict(self.headers)))
        headers: dict[str, str] = {}
        if b"poison" in json.dumps(body).encode():
            status, text = 400, b'{"code":3,"message":"bad data"}'
        elif self.answers:
            status, headers, text = type(self).answers.pop(0)
        else:
            status, headers, text = 200, {}, b"{}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Script.answers, Script.seen = [], []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Script)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def batches() -> list[InterpretedBatch]:
    return h100_batches()[:6]


def make(endpoint: str, **options: Any) -> OtlpSink:
    settings = Settings(otlp=OtlpSettings(endpoint=endpoint, headers="x-api-key=s3cr3t"))
    sink: OtlpSink = registry.create("sink", "otlp", settings, **options)
    return sink


def prepared(sink: OtlpSink, batches: list[InterpretedBatch]) -> list[Prepared[Exported]]:
    t = sink.config
    out = [sink.prepare(t.interpreted_topic, encode_interpreted(b), Position(t.interpreted_topic, 0, i))
           for i, b in enumerate(batches)]  # fmt: skip
    out.append(sink.prepare(t.alerts_topic, encode_record(FINDING), Position(t.alerts_topic, 0, 0)))
    out.append(sink.prepare(t.health_topic, json.dumps(health("degraded")).encode(), Position(t.health_topic, 0, 0)))
    return out


def test_the_plugin_runs_against_the_contract(server: str, batches: list[InterpretedBatch]) -> None:
    sink = make(server)
    s = Settings()
    assert sink.name == "otlp" and sink.topics == (s.topics.interpreted, s.topics.alerts, s.topics.health)
    items = prepared(sink, batches)
    assert [p.size for p in items] == [1] * len(batches) + [1, 1]
    assert all(p.ts_ns is not None and (p.ts_ns == b.ts_ns).all() for p, b in zip(items, batches, strict=False))
    for topic, value in ((s.topics.interpreted, b"\x00garbage"), (s.topics.health, b"[1]"),
                         (s.topics.health, b"{not json"), ("elsewhere", b"{}")):  # fmt: skip
        with pytest.raises(DecodeError):
            sink.prepare(topic, value, Position(topic, 0, 9))
    sink.add(items)
    assert sink.flush() == [] and sink.marks() == {}
    paths = [path for path, _, _ in Script.seen]
    assert paths == ["/v1/metrics", "/v1/logs"]  # one request per signal: the batch fits max_request_items
    _, metrics, headers = Script.seen[0]
    assert headers["Content-Type"] == "application/json" and headers["x-api-key"] == "s3cr3t"
    assert len(metrics["resourceMetrics"]) == len(batches) + 1  # one per message: a node's batch, and the health
    points = sum(p.payload.points for p in items)
    assert sink.stats()["points_exported"] == points and sink.stats()["records_exported"] == 1
    sink.close()
    sink.close()


def test_a_request_the_collector_took_is_never_sent_again_and_a_retry_is_the_same_request(
    server: str, batches: list[InterpretedBatch]
) -> None:
    sink = make(server, max_request_items=120)  # about two rounds of the H100 per request
    items = prepared(sink, batches)
    Script.answers = [(200, {}, b"{}"), (503, {"Retry-After": "2"}, b"busy")]
    sink.add(items)
    with pytest.raises(SinkBackpressure) as exc:
        sink.flush()
    assert exc.value.retry_after_s == 2.0
    sink.add(items[:1])  # what the runner adds later belongs to the next batch, not to the retried requests
    Script.answers = [(502, {}, b"gateway")]
    with pytest.raises(TransientWriteError):
        sink.flush()
    assert sink.flush() == []
    bodies = [json.dumps(body, sort_keys=True) for _, body, _ in Script.seen]
    assert bodies[1] == bodies[2] == bodies[3]  # the failed request, resent as it was, twice
    assert bodies.count(bodies[0]) == 1  # the one taken before was not sent again
    stats = sink.stats()
    assert stats["points_exported"] == sum(p.payload.points for p in items + items[:1])
    assert stats["records_exported"] == 1 and stats["requests"] == len(bodies) - 2  # all but the two failed


def test_a_refused_request_is_sent_a_message_at_a_time_and_only_the_refused_message_is_dead_lettered(
    server: str, batches: list[InterpretedBatch]
) -> None:
    sink = make(server)
    items = prepared(sink, batches)
    from dataclasses import replace

    poisoned = replace(batches[2], node=("poison",))
    items[2] = sink.prepare(sink.config.interpreted_topic, encode_interpreted(poisoned), Position("t", 0, 2))
    sink.add(items)
    refused = sink.flush()
    assert [(r.reason, r.item) for r in refused] == [(REJECTED, 2)]
    assert "HTTP 400" in refused[0].detail and "bad data" in refused[0].detail
    stats = sink.stats()
    assert stats["messages_refused"] == 1 and stats["requests_split"] == 1
    assert stats["points_exported"] == sum(p.payload.points for i, p in enumerate(items) if i != 2)
    assert stats["records_exported"] == 1  # the logs request was never refused


def test_a_partial_success_is_counted_never_retried(server: str, batches: list[InterpretedBatch]) -> None:
    sink = make(server)
    items = prepared(sink, batches)
    Script.answers = [(200, {}, b'{"partialSuccess":{"rejectedDataPoints":"3","errorMessage":"NaN"}}')]
    sink.add(items)
    assert sink.flush() == []
    stats = sink.stats()
    assert stats["points_rejected"] == 3 and len(Script.seen) == 2
    assert stats["points_exported"] == sum(p.payload.points for p in items) - 3


def test_answers_are_sorted_as_the_specification_says() -> None:
    assert not refuses_data(429) and not refuses_data(503) and not refuses_data(401) and not refuses_data(404)
    assert refuses_data(400) and refuses_data(413) and refuses_data(422)
    assert retry_after_s("7") == 7.0 and retry_after_s(None) is None and retry_after_s("soon") is None
    assert retry_after_s("Sun, 06 Dec 2026 05:00:30 GMT", now_s=1796533200.0) == 30.0
    assert partial_success(b"", "metrics").rejected == 0
    assert partial_success(b'{"partialSuccess":{}}', "logs").rejected == 0
    assert partial_success(b'{"partialSuccess":{"rejectedLogRecords":"2"}}', "logs").rejected == 2


def test_down_and_unauthorised_are_transient_and_a_400_is_permanent(server: str) -> None:
    sink = make(server)
    log = sink.prepare(sink.config.alerts_topic, encode_record(FINDING), Position("a", 0, 0))
    for status in (401, 500):
        Script.answers = [(status, {}, b"no")]
        sink.add([log])
        with pytest.raises(TransientWriteError) as exc:
            sink.flush()
        assert not isinstance(exc.value, SinkBackpressure)
        sink.flush()
    Script.answers = [(429, {}, b"slow down")]  # throttled without a Retry-After: backoff
    sink.add([log])
    with pytest.raises(TransientWriteError):
        sink.flush()
    sink.flush()
    with pytest.raises(PermanentWriteError):
        sink.client.export("logs", {"resourceLogs": [{"poison": 1}]})
    down = make("http://127.0.0.1:9", timeout_s=1.0)
    down.add([log])
    with pytest.raises(TransientWriteError):
        down.flush()


def test_validation_is_one_line_without_secrets() -> None:
    plugin = registry.load("sink", "otlp")
    with pytest.raises(ConfigError, match="not set") as err:
        plugin.validate(plugin.Config())
    assert "\n" not in str(err.value)
    config = plugin.configure(Settings(otlp=OtlpSettings(endpoint="http://c:4318", headers="k=s3cr3t")), timeout_s=0)
    with pytest.raises(ConfigError) as err:
        plugin.validate(config)
    assert "s3cr3t" not in str(err.value) and "s3cr3t" not in repr(config)
    with pytest.raises(ConfigError, match="header 2 is not name=value") as err:
        parse_headers("a=1,s3cr3t")
    assert "s3cr3t" not in str(err.value)
    assert parse_headers(" a = 1 , b=x=y ") == (("a", "1"), ("b", "x=y"))
    finding = Finding("x", Severity.INFO, True, "c", "n", None, "", 1, 1, "s")  # a node's finding: no GPU
    sink = OtlpSink.from_config(plugin.configure(Settings(otlp=OtlpSettings(endpoint="http://c:4318"))))
    assert sink.prepare(Settings().topics.alerts, encode_record(finding), Position("a", 0, 0)).payload.records == 1


def test_the_sink_command_chooses_the_plugin_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hermeneut sink --sink otlp`` builds the otlp plugin (which wants an endpoint, not an InfluxDB token)."""
    from click.testing import CliRunner

    from hermeneut.cli import cli

    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    result = CliRunner().invoke(cli, ["sink", "--sink", "otlp"])
    assert result.exit_code == 2 and "otlp sink: endpoint must be http" in result.output
    assert "influxdb" not in result.output
    result = CliRunner().invoke(cli, ["sink", "--sink", "kafka"])
    assert result.exit_code == 2 and "'influxdb', 'otlp'" in result.output
