"""What an identity may be (cluster, node, GPU uuid, GPU model, application, NIC device): one rule, so the
processor refuses what the sink could not store, and the sink refuses what still reaches it (the interpreted topic
may have other writers than our processor).

Identities become InfluxDB tag values. Line protocol escapes ``,``, ``=`` and space in a tag value with a
backslash and has no line breaks (the sink removes them); it cannot carry:

- a value that ends in a backslash: it escapes the separator written after it, and InfluxDB refuses the whole
  request (HTTP 400), whatever the number of backslashes (measured on influxd 2.7: ``a\\``, ``a\\\\`` and
  ``a\\\\\\`` refused; ``a\\,b``, ``a\\ b``, ``a\\=b``, ``a\\\\,b`` stored as they were sent);
- a value that is empty once its line breaks are removed (an empty tag value is a parse error too);
- a value longer than :data:`IDENTITY_MAX_BYTES`. InfluxDB's own bound is 64 KiB, but every point repeats its
  tags, so a far smaller bound is kept: a DNS name has at most 253 characters, a GPU UUID 40, a Kubernetes label
  63.

An optional identity (a GPU model nobody named) may be empty; one made only of line breaks is refused all the same.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

#: the longest identity stored, in UTF-8 bytes (see the module docstring)
IDENTITY_MAX_BYTES: Final = 256
#: the dead-letter reason of an identity this rule refuses
BAD_IDENTITY: Final = "bad_identity"
_LINE_BREAKS: Final = str.maketrans("", "", "\r\n")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


@lru_cache(maxsize=65_536)
def identity_problem(value: str, what: str, optional: bool = False) -> str | None:
    """Why ``value`` cannot be stored as the identity ``what`` (a detail for a dead letter), None when it can.
    Cached: a fleet has a few thousand distinct identities, seen every second."""
    if optional and not value:
        return None
    size = len(value.encode(errors="replace"))
    if size > IDENTITY_MAX_BYTES:
        return f"{what} is {size} bytes long, beyond the {IDENTITY_MAX_BYTES} an identity may have"
    cleaned = value.translate(_LINE_BREAKS)
    if not cleaned:
        return f"{what} {_shown(value)} is empty once its line breaks are removed"
    if cleaned.endswith("\\"):
        return f"{what} {_shown(value)} ends in a backslash, which InfluxDB's line protocol cannot carry"
    return None
