"""Cell values as importers read them: numbers with units, "no value" markers, and times in the formats traces
use. Pure; a value that cannot be read raises :class:`BadValue` with the reason a person needs.

Units are converted to the canonical field's (``MiB`` -> bytes, ``mW`` -> W, a 0..1 ratio -> percent, ...): the
meaning is clear, so the value is converted rather than rejected.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, tzinfo
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pipeline.errors import ConfigError

#: what nvidia-smi, DCGM and traces print where there is no value: the field is absent, never zero
NO_VALUE: Final = frozenset(
    {
        "", "n/a", "[n/a]", "na", "nan", "none", "null", "-", "[not supported]", "not supported", "[unknown error]",
        "[requested functionality has been deprecated]", "[insufficient permissions]", "[gpu is lost]",
        "[no data]", "unknown error",
    }
)  # fmt: skip

#: unit -> factor to the canonical unit of its kind (bytes, W, %, MHz, Celsius, seconds, J)
UNITS: Final[dict[str, float]] = {
    "b": 1.0, "byte": 1.0, "bytes": 1.0,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40,
    "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "w": 1.0, "mw": 1e-3, "kw": 1e3,
    "%": 1.0, "percent": 1.0, "ratio": 100.0,
    "mhz": 1.0, "ghz": 1e3, "khz": 1e-3, "hz": 1e-6,
    "c": 1.0, "celsius": 1.0,
    "s": 1.0, "ms": 1e-3, "us": 1e-6,
    "j": 1.0, "mj": 1e-3, "kj": 1e3,
    "": 1.0,
}  # fmt: skip
_NUMBER: Final = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)\s*$")


class BadValue(ValueError):
    """A cell that cannot be read; ``str()`` says why in one line."""


def unit_factor(unit: str, what: str) -> float:
    """The factor of a unit name (case-insensitive); a ConfigError naming the known ones otherwise."""
    factor = UNITS.get(unit.strip().lower())
    if factor is None:
        raise ConfigError(f"invalid configuration: {what}: unknown unit {unit!r} (known: {', '.join(sorted(UNITS))})")
    return factor


def number(text: str, factor: float = 1.0) -> float:
    """A number, with an optional unit after it (``81559 MiB``: the unit says the factor, overriding ``factor``),
    hex (``0x1F``) or a P-state (``P8``); NaN for a no-value marker."""
    try:  # most cells are plain numbers: the fast path (~4x the regex)
        plain = float(text)
    except ValueError:
        pass
    else:
        if math.isfinite(plain):
            return plain * factor
    cell = text.strip()
    if cell.lower() in NO_VALUE:
        return math.nan
    if cell[:2].lower() == "0x":
        try:
            return float(int(cell, 16))
        except ValueError:
            raise BadValue(f"{text.strip()!r} is not a hex number") from None
    if len(cell) > 1 and cell[0] in "Pp" and cell[1:].isdigit():
        return float(cell[1:])
    match = _NUMBER.match(cell)
    if match is None:
        raise BadValue(f"{text.strip()!r} is not a number")
    value, unit = float(match.group(1)), match.group(2)
    if unit:
        known = UNITS.get(unit.lower())
        if known is None:
            raise BadValue(f"{text.strip()!r} has a unit this importer does not know ({unit})")
        factor = known
    if not math.isfinite(value):
        raise BadValue(f"{text.strip()!r} is not a finite number")
    return value * factor


def flag(text: str) -> float:
    """Yes/No, Active/Not Active, Enabled/Disabled as 1/0; NaN for a no-value marker."""
    cell = text.strip().lower()
    if cell in NO_VALUE:
        return math.nan
    if cell in ("yes", "active", "enabled", "true", "1"):
        return 1.0
    if cell in ("no", "not active", "disabled", "false", "0"):
        return 0.0
    raise BadValue(f"{text.strip()!r} is not yes/no")


def zone(name: str) -> tzinfo:
    """A time zone by IANA name (``UTC``, ``Europe/Paris``); a ConfigError otherwise."""
    if name.upper() in ("UTC", "Z"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"invalid configuration: unknown time zone {name!r} (an IANA name like UTC, Europe/Paris)"
        ) from None


#: how traces spell a time: ISO 8601 (nvidia-smi writes ``2026/07/14 08:12:38.696``), or epoch numbers
TIME_FORMATS: Final = ("iso8601", "unix_s", "unix_ms", "unix_us", "unix_ns")
_EPOCH_NS: Final = {"unix_s": 1e9, "unix_ms": 1e6, "unix_us": 1e3, "unix_ns": 1.0}


def timestamp_ns(text: str, fmt: str = "iso8601", tz: tzinfo = UTC) -> int:
    """A cell as UTC epoch ns: ``iso8601`` (also with ``/`` between date parts and a space before the time, as
    nvidia-smi prints it; a time without a zone is in ``tz``), an epoch number (``unix_s`` .. ``unix_ns``), or a
    ``strftime`` pattern."""
    cell = text.strip()
    if not cell:
        raise BadValue("the time is empty")
    if fmt in _EPOCH_NS:
        try:
            return round(float(cell) * _EPOCH_NS[fmt])
        except ValueError:
            raise BadValue(f"{cell!r} is not an epoch time ({fmt})") from None
    try:
        if fmt == "iso8601":
            parsed = datetime.fromisoformat(re.sub(r"^(\d{4})/(\d\d)/(\d\d)", r"\1-\2-\3", cell))
        else:
            parsed = datetime.strptime(cell, fmt)
    except ValueError:
        raise BadValue(f"{cell!r} is not a time ({fmt})") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=tz)
    seconds = parsed.timestamp()
    return int(seconds) * 1_000_000_000 + parsed.microsecond * 1000 if seconds >= 0 else round(seconds * 1e9)
