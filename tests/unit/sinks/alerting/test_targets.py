"""Webhook targets: loopback, link-local and metadata hosts are refused as written and as resolved, unless
``alerts.allowed_targets`` names them; a refused delivery fails for good without a request leaving the host."""

from __future__ import annotations

import socket

import pytest

from pipeline.config import AlertSettings
from pipeline.errors import AlertConfigError
from sinks.alerting.model import Receiver
from sinks.alerting.receivers import HttpSender
from sinks.alerting.targets import TargetPolicy
from tests.unit.sinks.alerting.test_receivers import _delivery


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://100.100.100.200/latest/meta-data/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://127.0.0.1:8080/api/v1/alerts/silences",
        "http://127.9.9.9/",
        "http://[::1]:9000/",
        "http://[::ffff:169.254.169.254]/",
        "http://localhost:6443/",
        "http://api.localhost/",
        "http://0.0.0.0:8086/api/v2/write",
        "https://[fe80::1]/",
    ],
)
def test_ssrf_targets_are_refused_as_written(url: str) -> None:
    with pytest.raises(AlertConfigError, match=r"refused unless alerts\.allowed_targets names it"):
        TargetPolicy().check_url(url)


@pytest.mark.parametrize(
    "url", ["https://hooks.example.com/x", "http://10.1.2.3:9000/hook", "http://192.168.7.7/", "http://[2001:db8::1]/"]
)
def test_ordinary_and_private_targets_pass(url: str) -> None:
    TargetPolicy().check_url(url)


def test_allowed_targets_open_exactly_what_they_name() -> None:
    policy = TargetPolicy.parse(AlertSettings(allowed_targets="127.0.0.1, localhost,fe80::/64").allowed_targets)
    for url in ("http://127.0.0.1:9/", "http://LOCALHOST./x", "http://[fe80::5]/"):
        policy.check_url(url)
    for url in ("http://127.0.0.2/", "http://169.254.169.254/", "http://[fe80:0:0:1::5]/"):
        with pytest.raises(AlertConfigError):
            policy.check_url(url)


def test_names_are_checked_by_every_address_they_resolve_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that passes as written but resolves to the metadata service (or to it among others) is refused
    when the notification is sent; the address checked is the one connected to."""
    answers = {"hooks.example": ["203.0.113.5"], "rebound.example": ["203.0.113.5", "169.254.169.254"]}

    def getaddrinfo(host: str, port: int, *_args: object, **_kw: object) -> list[tuple[object, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answers[host]]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    policy = TargetPolicy()
    policy.check_url("http://rebound.example/hook")
    assert policy.resolve("hooks.example", 443) == "203.0.113.5"
    with pytest.raises(AlertConfigError, match=r"rebound\.example resolves to 169\.254\.169\.254, link-local"):
        policy.resolve("rebound.example", 80)
    assert TargetPolicy.parse("169.254.0.0/16").resolve("rebound.example", 80) == "203.0.113.5"


def test_a_delivery_to_a_refused_target_fails_for_good_without_a_request() -> None:
    result = HttpSender("http://x", timeout_s=1.0)(_delivery(), Receiver("webhook", url="http://169.254.169.254/x"))
    assert not result.ok and not result.retry and "link-local" in result.error
