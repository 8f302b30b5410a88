"""Wire formats: Alertmanager's webhook payload (v4), the HMAC signature and its verification, Slack and mail
text, and the history's line protocol."""

from __future__ import annotations

import json
import socket

import pytest

from alerting.delivery import backoff_s
from alerting.model import AlertStatus, AlertView, Delivery, Receiver, fingerprint
from alerting.receivers import (
    HttpSender,
    headline,
    sign,
    slack_payload,
    text_body,
    verify_signature,
    webhook_payload,
)
from alerting.targets import TargetPolicy

S = 1_000_000_000


def _delivery(status: AlertStatus = AlertStatus.FIRING) -> Delivery:
    labels = {"alertname": "thermal-throttling", "detector": "thermal-throttling", "severity": "warning"}
    alerts = tuple(
        AlertView(
            f"thermal-throttling/c1/n1/GPU-{i}",
            status,
            labels | {"cluster": "c1", "node": "n1", "gpu": f"GPU-{i}"},
            {"summary": f"GPU-{i} is throttling", "action": "check the airflow"},
            1_700_000_000 * S,
            1_700_000_600 * S if status is AlertStatus.RESOLVED else 0,
        )
        for i in (1, 2)
    )
    group = {"cluster": "c1", "node": "n1", "detector": "thermal-throttling"}
    return Delivery("n1.0", "n1", "sub1", 0, '{cluster="c1"}', group, status, status.value, alerts, 0)


def test_webhook_payload_is_alertmanager_v4() -> None:
    p = webhook_payload(_delivery(), "sub1/0", "http://hermeneut.example")
    assert set(p) == {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    assert p["version"] == "4" and p["status"] == "firing" and p["receiver"] == "sub1/0"
    assert p["commonLabels"] == {
        "alertname": "thermal-throttling",
        "detector": "thermal-throttling",
        "severity": "warning",
        "cluster": "c1",
        "node": "n1",
    }
    assert p["commonAnnotations"] == {"action": "check the airflow"}
    a = p["alerts"][0]
    assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
    assert a["startsAt"] == "2023-11-14T22:13:20.000Z" and a["endsAt"] == "0001-01-01T00:00:00Z"
    assert a["fingerprint"] == fingerprint("thermal-throttling/c1/n1/GPU-1") and len(a["fingerprint"]) == 16
    resolved = webhook_payload(_delivery(AlertStatus.RESOLVED), "r", "http://x")
    assert resolved["status"] == "resolved" and resolved["alerts"][0]["endsAt"] == "2023-11-14T22:23:20.000Z"
    json.dumps(p)  # serializable as is


def test_signature_verifies_and_rejects_tampering_replay_and_wrong_secrets() -> None:
    body = b'{"version":"4"}'
    header = sign("s3cret", body, 1_700_000_000)
    assert header.startswith("t=1700000000,v1=") and len(header.split("v1=")[1]) == 64
    assert verify_signature("s3cret", header, body, now_s=1_700_000_100)
    assert not verify_signature("s3cret", header, body + b" ", now_s=1_700_000_100)  # body changed
    assert not verify_signature("other", header, body, now_s=1_700_000_100)  # wrong secret
    assert not verify_signature("s3cret", header, body, now_s=1_700_000_301)  # too old: a replay
    forged = header.replace("t=1700000000", "t=1700000200")  # a fresh timestamp on an old signature
    assert not verify_signature("s3cret", forged, body, now_s=1_700_000_250)
    assert not verify_signature("s3cret", "garbage", body, now_s=1_700_000_000)


def test_chat_and_mail_text() -> None:
    d = _delivery()
    assert headline(d) == "[FIRING:2] c1 thermal-throttling n1"
    body = text_body(d, "http://hermeneut.example")
    assert "GPU-2 is throttling" in body and "action: check the airflow" in body
    assert f"http://hermeneut.example/alerts/{fingerprint('thermal-throttling/c1/n1/GPU-1')}" in body
    slack = slack_payload(d, "http://x")
    assert slack["text"] == headline(d) and slack["blocks"][0]["type"] == "header"


def test_backoff_grows_exponentially_with_jitter_and_a_ceiling() -> None:
    assert backoff_s(1, 1.0, 60.0, rand=lambda: 0.0) == 0.5
    assert backoff_s(4, 1.0, 60.0, rand=lambda: 1.0) == 8.5
    assert backoff_s(20, 1.0, 60.0, rand=lambda: 1.0) == 60.5


def test_a_failed_delivery_never_reports_the_url_path(unused_port: int) -> None:
    url = f"http://127.0.0.1:{unused_port}/services/T000/B000/SECRETTOKEN"
    sender = HttpSender("http://x", timeout_s=1.0, policy=TargetPolicy.parse("127.0.0.1"))
    result = sender(_delivery(), Receiver("slack", url=url))
    assert not result.ok and result.retry and "refused" in result.error.lower()
    assert "SECRETTOKEN" not in result.error


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: connecting is refused
