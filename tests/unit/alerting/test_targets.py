"""Webhook targets: loopback, link-local and metadata hosts are refused as written and as resolved, unless
``alerts.allowed_targets`` names them; a refused delivery fails for good without a request leaving the host."""

from __future__ import annotations

import socket

import pytest

from alerting.model import Receiver
from alerting.receivers import HttpSender
from alerting.targets import TargetPolicy
from pipeline.config import AlertSettings
from pipeline.errors import AlertConfigError
from tests.unit.alerting.test_receivers import _delivery


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
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[2002:7f00:1::]/",
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
    ("url", "why"),
    [
        ("http://127.0.0.1%09:1/", r"'127\.0\.0\.1%09:1' is not a host and port"),
        ("http://127\u30020\u30020\u30021/", r"is not ASCII: write a name in its xn-- form"),
        ("http://2130706433/", r"is a number, not a dotted quad \(some resolvers read it as 127\.0\.0\.1\)"),
        ("http://0x7f.1/", r"is a number, not a dotted quad \(some resolvers read it as 127\.0\.0\.1\)"),
        ("http://0177.0.0.1:8080/x", r"some resolvers read it as 127\.0\.0\.1"),
        ("http://127.0.0.1./", r"is a number, not a dotted quad"),
        ("http://hooks.123/", r"a name ending in a number"),
        ("http://[::127.0.0.1]/", r"IPv4-compatible IPv6 address: write the IPv4 address itself \(127\.0\.0\.1\)"),
        ("http://[::ffff:169.254.169.254]/", r"IPv4-mapped IPv6 address: write the IPv4 address itself"),
        ("http://[::ffff:8.8.8.8]/", r"IPv4-mapped IPv6 address: write the IPv4 address itself \(8\.8\.8\.8\)"),
        ("http://hooks.example.com\\@127.0.0.1/", r"host part holds '\\\\'"),
        ("http://a@b@hooks.example.com/", r"host part holds '@'"),
        ("http://hooks.example.com\t/", r"space or control character"),
        ("http://hooks.example.com:99999/secret-path", r"'hooks\.example\.com:99999' is not a host and port"),
        ("ftp://hooks.example.com/", r"needs http:// or https://"),
    ],
)
def test_hosts_not_every_reader_reads_alike_are_refused_with_the_reason(url: str, why: str) -> None:
    """Issue 37: these reached a 500 (a urllib3 parse error) or were refused only when a notification was sent.
    Refused even where alerts.allowed_targets names the address: the form is the fault. The path never shows."""
    for policy in (TargetPolicy(), TargetPolicy.parse("127.0.0.0/8, 169.254.0.0/16, 8.8.8.8")):
        with pytest.raises(AlertConfigError, match=why) as caught:
            policy.check_url(url)
        assert "\n" not in str(caught.value) and "secret" not in str(caught.value)


def test_a_delivery_to_a_receiver_made_before_the_checks_fails_for_good() -> None:
    for url in ("http://2130706433/x", "http://127.0.0.1%09:1/"):
        result = HttpSender("http://x", timeout_s=1.0)(_delivery(), Receiver("webhook", url=url))
        assert not result.ok and not result.retry and result.error.startswith("target refused: receiver URL")


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/x",
        "http://user:pw@hooks.example.com./x",
        "http://xn--bcher-kva.example/",
        "http://10.1.2.3:9000/hook",
        "http://192.168.7.7/",
        "http://[2001:db8::1]/",
        "http://[64:ff9b::808:808]/",
    ],
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
