"""The webhook URL check is total and safe on any text: it accepts a URL or refuses it with one AlertConfigError
line (never a urllib3 parse error, which the API answered with a 500), and no URL it accepts names, as any reader
would read it without DNS, an address it refuses: urllib3 (what the sender uses) and Python's ``urllib.parse``
each give a host, and that host read as an IP literal, as ``inet_aton`` numbers (``2130706433``, ``0x7f.1``,
``127.1``) or through the IDNA codec ``getaddrinfo`` applies (``127。0。0。1``) must not be loopback, link-local,
metadata or this host (issue 37)."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import urllib.parse

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st

from alerting.targets import IPAddress, TargetPolicy, refused_address
from pipeline.errors import AlertConfigError
from tests.fuzzing import SEEDS, count, text_mutations

_V4 = st.integers(min_value=0, max_value=2**32 - 1).map(ipaddress.IPv4Address)
_RISKY_V4 = st.sampled_from(["127.0.0.1", "169.254.169.254", "0.0.0.0", "100.100.100.200", "127.9.9.9"]).map(
    ipaddress.IPv4Address
)


def _numeric_forms(ip: ipaddress.IPv4Address, form: int) -> str:
    """One of the ways resolvers read an IPv4 address: dotted, one number, hex, octal, short forms, IPv6 wraps."""
    n, parts = int(ip), str(ip).split(".")
    short = f"{parts[0]}.{n & 0xFFFFFF}"
    forms = [
        str(ip), str(n), hex(n), "0" + oct(n)[2:], short, ".".join(hex(int(p)) for p in parts),
        ".".join("0" + p for p in parts), f"[::ffff:{ip}]", f"[::{ip}]", f"[64:ff9b::{ip}]",
        f"[2002:{n >> 16:x}:{n & 0xFFFF:x}::]", "\u3002".join(parts), "\uff0e".join(parts), str(ip) + ".",
        str(ip) + "%09", str(ip) + "%2500",
    ]  # fmt: skip
    return forms[form % len(forms)]


_FULLWIDTH_LOCALHOST = "".join(chr(ord(c) + 0xFEE0) for c in "localhost")
_NAMES = [
    "localhost", "LOCALHOST.", "api.localhost", "metadata.google.internal", "hooks.example.com", "[::1]",
    "[fe80::1%25eth0]", "[fd00:ec2::254]", "%6c%6fcalhost", _FULLWIDTH_LOCALHOST, "xn--bcher-kva.example",
    "10.1.2.3", "[2001:db8::1]", "a_b.example", "hooks.123", "",
]  # fmt: skip
_HOSTS = (
    st.builds(_numeric_forms, _RISKY_V4 | _V4, st.integers(min_value=0, max_value=63))
    | st.sampled_from(_NAMES)
    | st.text(max_size=24)
)
_URLS = st.builds(
    lambda scheme, user, host, port, path: f"{scheme}://{user}{host}{port}{path}",
    st.sampled_from(["http", "https", "HTTP", "ftp", ""]),
    st.sampled_from(["", "u@", "u:secret@", "a@b@", "hooks.example.com\\@", "@"]),
    _HOSTS,
    st.sampled_from(["", ":80", ":8080", ":0", ":99999", ":-1", ":", ":x"]),
    st.sampled_from(["", "/", "/hook?x=1", "/services/T000/B000/secret", "#frag", "\\x"]) | st.text(max_size=12),
)


def _readings(url: str) -> list[IPAddress]:
    """Every address a reader of ``url`` could connect to without DNS (see the module docstring)."""
    hosts = []
    with contextlib.suppress(ValueError):
        hosts.append(urllib3.util.parse_url(url).host or "")
    with contextlib.suppress(ValueError):
        hosts.append(urllib.parse.urlsplit(url).hostname or "")
    found: list[IPAddress] = []
    for host in hosts:
        bare = host.strip("[]")
        try:
            variants = {bare, bare.encode("idna").decode()}
        except UnicodeError:
            variants = {bare}
        for text in variants:
            with contextlib.suppress(ValueError):
                found.append(ipaddress.ip_address(text))
            with contextlib.suppress(OSError, ValueError):
                found.append(ipaddress.IPv4Address(socket.inet_aton(text)))
            if text.lower().rstrip(".") == "localhost":
                found.append(ipaddress.IPv4Address("127.0.0.1"))
    return found


@pytest.mark.fuzz
@given(_URLS | st.text(max_size=60), SEEDS)
def test_a_url_is_accepted_or_refused_in_one_line_and_nothing_accepted_reaches_a_refused_address(
    url: str, seed: int
) -> None:
    policy = TargetPolicy()
    for variant in text_mutations(url, seed):
        count()
        try:
            policy.check_url(variant)
        except AlertConfigError as exc:
            assert str(exc) and "\n" not in str(exc)
            with contextlib.suppress(ValueError):  # neither a password nor a path is repeated
                parts = urllib.parse.urlsplit(variant)
                said = [x for x in (parts.password or "", parts.path) if parts.netloc and len(x) > 3 and x in str(exc)]
                assert not said, (variant, str(exc))
            continue
        urllib3.util.parse_url(variant)  # what the sender does with it parses
        refused = [(ip, why) for ip in _readings(variant) if (why := refused_address(ip)) is not None]
        assert not refused, (variant, refused)
