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
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Final

import urllib3

from pipeline.errors import AlertConfigError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: metadata services outside the link-local range
METADATA_ADDRESSES: Final = frozenset(ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200"))
METADATA_NAMES: Final = frozenset(
    {"metadata", "metadata.google.internal", "instance-data", "instance-data.ec2.internal"}
)


def refused_address(ip: IPAddress) -> str | None:
    """Why an address may not be a target (None: it may)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return refused_address(ip.ipv4_mapped)
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "link-local (where clouds serve instance metadata)"
    if ip.is_unspecified:
        return "the unspecified address (this host)"
    return None


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
        """AlertConfigError (one line) when the URL's host is refused as written."""
        host = urllib3.util.parse_url(url).host or ""
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
