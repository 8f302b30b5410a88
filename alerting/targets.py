"""Where a webhook or Slack receiver may point: the alert manager must not become a proxy into its own host or
its cloud's metadata service (SSRF).

Self-service subscriptions are made over the API by anyone who can reach it, and the manager POSTs to whatever URL
they name. Refused unless ``alerts.allowed_targets`` names them: loopback (127.0.0.0/8, ::1, ``localhost``),
link-local (169.254.0.0/16, fe80::/10, where AWS, GCP, Azure and OpenStack serve instance metadata and
credentials), the unspecified address (0.0.0.0, ::, which reach the local host), the other metadata addresses
(AWS's IPv6 fd00:ec2::254, Alibaba's 100.100.100.200) and metadata host names. Private ranges (10/8, 192.168/16,
...) are allowed: on-premises chat servers and incident tools live there.

Two checks, both with the same :class:`TargetPolicy`: the URL as written when a subscription is made
(:meth:`TargetPolicy.check_url`, a 400 for the API), and every address its name resolves to when a notification
is sent (:meth:`TargetPolicy.resolve`): the request then goes to the address that was checked, so a name that
resolves elsewhere a moment later (DNS rebinding) cannot redirect it.

The URL as written must also be one every reader reads alike (:func:`url_host`), else it is refused when it is
made, with the reason: the host is an ASCII name of letters, digits, hyphens and dots (an internationalized name in
its ``xn--`` form: Python's resolver maps ``127。0。0。1``, with ideographic full stops, to 127.0.0.1), a dotted quad
``a.b.c.d`` or a bracketed IPv6 address; numeric hosts in other forms (``2130706433``, ``0x7f.1``, ``127.1``,
``0177.0.0.1``), which resolvers read as addresses each their own way, and IPv4-mapped or -compatible IPv6
addresses (``[::ffff:a.b.c.d]``, ``[::a.b.c.d]``) are refused with the address to write instead; so are control
characters, spaces and percent-escapes that a URL parser rejects (``127.0.0.1%09``). An address that carries an
IPv4 address inside (mapped, compatible, NAT64 ``64:ff9b::/96``, 6to4, Teredo) is judged by that address too.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Final

import urllib3
from urllib3.exceptions import LocationValueError

from pipeline.errors import AlertConfigError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: metadata services outside the link-local range
METADATA_ADDRESSES: Final = frozenset(ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200"))
METADATA_NAMES: Final = frozenset(
    {"metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"}
)


#: IPv6 prefixes whose addresses carry an IPv4 address in their last 32 bits
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_COMPATIBLE: Final = ipaddress.IPv6Network("::/96")
#: 0.0.0.0/8, "this network": connecting to one of them reaches the local host on some systems
_THIS_NETWORK: Final = ipaddress.IPv4Network("0.0.0.0/8")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo client), or None."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if (ip in _COMPATIBLE and int(ip) > 1) or ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    return ip.teredo[1] if ip.teredo is not None else None


def refused_address(ip: IPAddress) -> str | None:
    """Why an address may not be a target (None: it may)."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        why = refused_address(inner) if inner is not None else None
        if why is not None:
            return f"{why[0].lower()}{why[1:]} ({inner}) inside an IPv6 address"
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "link-local (where clouds serve instance metadata)"
    if ip.is_unspecified or (isinstance(ip, ipaddress.IPv4Address) and ip in _THIS_NETWORK):
        return "the unspecified address or this network (this host)"
    if ip.is_multicast or ip == ipaddress.IPv4Address("255.255.255.255"):
        return "not a unicast address"
    return None


#: a character the authority of a URL (``user@host:port``) may hold (RFC 3986): no backslash, space or other character a
#: parser may read as the end of the host
_AUTHORITY: Final = re.compile(r"[A-Za-z0-9\-._~%!$&'()*+,;=:@\[\]]")
#: a host name's label: letters, digits, hyphens (and underscores, which some internal names carry)
_LABEL: Final = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
#: a label a URL reader takes as a number (WHATWG: a host whose last label is one is an IPv4 address)
_NUMBER: Final = re.compile(r"0x[0-9a-f]*|[0-9]+")
#: a dotted quad with no leading zeros (``010`` is 8 to some resolvers, 10 to others)
_OCTET: Final = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_QUAD: Final = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")


def host_form(host: str) -> str | None:
    """Why a host as urllib3 parsed it (lower case, brackets kept) is not one every reader reads alike; None if
    it is (an LDH name, a dotted quad, a bracketed IPv6 address other than an IPv4-mapped or -compatible one)."""
    if not host:
        return "missing"
    if host.startswith("[") and host.endswith("]"):
        try:
            ip = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return "not an IPv6 address"
        if ip.ipv4_mapped is not None:
            return f"an IPv4-mapped IPv6 address: write the IPv4 address itself ({ip.ipv4_mapped})"
        if ip in _COMPATIBLE and int(ip) > 1:
            return f"an IPv4-compatible IPv6 address: write the IPv4 address itself ({embedded_ipv4(ip)})"
        return None
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if _NUMBER.fullmatch(labels[-1]):
        if _QUAD.fullmatch(host):
            return None
        try:
            reading = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return "a name ending in a number, which URL readers take for an address: refused"
        return f"a number, not a dotted quad (some resolvers read it as {reading}): write the address as a.b.c.d"
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return "not a host name (letters, digits, hyphens and dots)"
    return None


def url_host(url: str) -> str:
    """The host of a receiver URL as the sender will connect to it (urllib3's reading, lower case, brackets kept),
    or AlertConfigError (one line, never the URL's path or credentials) when the URL is not one every reader reads
    alike: see the module docstring."""
    scheme, sep, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    # what an error may show: the host, and the port only when it is a number (``user:password#@host`` reads as
    # host ``user`` and port ``password``: credentials are never repeated)
    host_port = authority.rsplit("@", 1)[-1]
    if host_port.startswith("["):
        host_part, _, port = host_port.partition("]")
        host_part, port = host_part + "]", port.removeprefix(":")
    else:
        host_part, _, port = host_port.partition(":")
    shown = host_part[:100] + (f":{port}" if port.isdigit() else "")
    if not sep or scheme.lower() not in ("http", "https"):
        raise AlertConfigError("receiver URL needs http:// or https://")
    bad = next((ch for ch in url if ord(ch) < 0x21 or ord(ch) == 0x7F), None)
    if bad is not None:
        raise AlertConfigError(f"receiver URL holds a space or control character ({bad!r}): refused")
    if not authority.isascii():
        raise AlertConfigError(
            f"receiver URL host {shown!r} is not ASCII: write a name in its xn-- form (IDNA), an address as a.b.c.d"
        )
    odd = next((ch for ch in authority if not _AUTHORITY.fullmatch(ch)), "@" if authority.count("@") > 1 else None)
    if odd is not None:
        raise AlertConfigError(f"receiver URL's host part holds {odd!r}, which a host and port cannot: refused")
    try:
        host = urllib3.util.parse_url(url).host or ""
    except LocationValueError:
        raise AlertConfigError(f"receiver URL's {shown!r} is not a host and port (a bad escape or port)") from None
    why = host_form(host)
    if why is not None:
        raise AlertConfigError(f"receiver URL host {host[:100]!r} is {why}")
    return host


def refused_name(name: str) -> str | None:
    """Why a host name may not be a target, before it is resolved (None: resolve it and check the addresses)."""
    lowered = name.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost"):
        return "a loopback name"
    if lowered in METADATA_NAMES:
        return "a cloud metadata name"
    return None


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """Targets allowed although refused by default: host names (exact, any case) and networks."""

    names: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, allowed: str) -> TargetPolicy:
        """From ``alerts.allowed_targets``: comma-separated host names, addresses and networks (validated there)."""
        names: set[str] = set()
        networks: list[IPNetwork] = []
        for entry in (e.strip() for e in allowed.split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(entry.lower().rstrip("."))
        return cls(frozenset(names), tuple(networks))

    def _allowed(self, ip: IPAddress) -> bool:
        return any(ip.version == net.version and ip in net for net in self.networks)

    def refusal(self, host: str) -> str | None:
        """Why ``host`` (a name or an address literal, as in a URL) is refused before resolving; None if not."""
        bare = host.strip("[]")
        if bare.lower().rstrip(".") in self.names:
            return None
        try:
            ip = ipaddress.ip_address(bare)
        except ValueError:
            return refused_name(bare)
        return None if self._allowed(ip) else refused_address(ip)

    def check_url(self, url: str) -> None:
        """AlertConfigError (one line) when the URL is not read alike by every reader (:func:`url_host`) or its
        host is refused as written."""
        host = url_host(url)
        why = self.refusal(host)
        if why is not None:
            raise AlertConfigError(
                f"receiver URL host {host!r} is {why}: refused unless alerts.allowed_targets names it"
            )

    def resolve(self, host: str, port: int) -> str:
        """The address to connect to for ``host``: every address it resolves to must be allowed (one refused
        address refuses the name: which one a client picks is not ours to know). Raises AlertConfigError (a
        permanent failure of that delivery), or OSError when the name does not resolve."""
        why = self.refusal(host)
        if why is not None:
            raise AlertConfigError(f"{host} is {why}")
        bare = host.strip("[]")
        addresses = [str(info[4][0]) for info in socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)]
        if bare.lower().rstrip(".") not in self.names:
            for address in addresses:
                ip = ipaddress.ip_address(address.split("%", 1)[0])
                reason = None if self._allowed(ip) else refused_address(ip)
                if reason is not None:
                    raise AlertConfigError(f"{host} resolves to {address}, {reason}")
        return addresses[0]
