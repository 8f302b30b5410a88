"""Cell values as importers read them: numbers with units, "no value" markers, and times in the formats traces
use. Pure; a value that cannot be read raises :class:`BadValue` with the reason a person needs.

Units are converted to the canonical field's (``MiB`` -> bytes, ``mW`` -> W, a 0..1 ratio -> percent, ...): the
meaning is clear, so the value is converted rather than rejected.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime, tzinfo
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pipeline.codec import INT64_MAX
from pipeline.errors import ConfigError

#: what nvidia-smi, DCGM and traces print where there is no value: the field is absent, never zero
NO_VALUE: Final = frozenset(
    {
        "",
        "n/a",
        "[n/a]",
        "na",
        "nan",
        "none",
        "null",
        "-",
        "[not supported]",
        "not supported",
        "[unknown error]",
        "[requested functionality has been deprecated]",
        "[insufficient permissions]",
        "[gpu is lost]",
        "[no data]",
        "unknown error",
    }
)

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
        if math.isfinite(plain * factor):
            return plain * factor
    cell = text.strip()
    if cell.lower() in NO_VALUE:
        return math.nan
    if cell[:2].lower() == "0x":
        try:
            return float(int(cell, 16))
        except ValueError:
            raise BadValue(f"{_short(cell)!r} is not a hex number") from None
        except OverflowError:  # a float holds 256 hex digits at most
            raise BadValue(f"{_short(cell)!r} is too large a number") from None
    if len(cell) > 1 and cell[0] in "Pp" and cell[1:].isascii() and cell[1:].isdigit():
        if len(cell) > 3:  # nvidia-smi's performance states are P0 .. P15 (P32 unknown)
            raise BadValue(f"{_short(cell)!r} is not a performance state")
        return float(cell[1:])
    if len(cell) > _LONGEST:
        raise BadValue(f"{_short(cell)!r} is too long for a number")
    match = _NUMBER.match(cell)
    if match is None:
        raise BadValue(f"{_short(cell)!r} is not a number")
    value, unit = float(match.group(1)), match.group(2)
    if unit:
        known = UNITS.get(unit.lower())
        if known is None:
            raise BadValue(f"{_short(cell)!r} has a unit this importer does not know ({_short(unit)})")
        factor = known
    if not math.isfinite(value * factor):
        raise BadValue(f"{_short(cell)!r} is not a finite number")
    return value * factor


#: the longest cell read as a number: a float's 17 digits, an exponent, a sign and a unit fit many times over
_LONGEST: Final = 100
#: how much of a cell a dead letter's reason quotes (the whole cell is in the dead letter's bytes)
_QUOTED: Final = 60


def _short(cell: str) -> str:
    """A cell as a reason quotes it: at most :data:`_QUOTED` characters, the length said when it is cut."""
    return cell if len(cell) <= _QUOTED else f"{cell[:_QUOTED]}... ({len(cell)} characters)"


#: a GPU index the pipeline takes (MIG instances included): the processor's bound
INDEX_MAX: Final = 2**31 - 1


def gpu_index(text: str, column: str = "index") -> int:
    """A GPU index cell as an int: ASCII digits only (``"²".isdigit()`` is true, ``int("²")`` fails), at most
    :data:`INDEX_MAX` (a 5,000-digit cell is a BadValue, not Python's digit limit)."""
    cell = text.strip()
    if not (cell.isascii() and cell.isdigit()) or len(cell) > 10 or int(cell) > INDEX_MAX:
        raise BadValue(f"{column} {_short(cell)!r} is not a GPU index")
    return int(cell)


def csv_records(text: str) -> Iterator[tuple[int, list[str] | None, str]]:
    r"""``(first line number, cells, the record's text)`` per record of a CSV text, read by :mod:`csv` alone.

    Lines end only at ``\n``, ``\r\n`` or ``\r`` (``str.splitlines`` also splits at a form feed, a vertical tab
    and other separators a cell may hold: ``30\x0c0`` was one cell read as two rows); a quoted field may hold a
    line break (one record over several lines), also after the space nvidia-smi writes after each comma
    (``skipinitialspace``: cells are read stripped anyway). A record the reader refuses (a field over
    ``csv.field_size_limit()``, a NUL byte on Python 3.11, a quote left open at the end) comes back with cells
    None, and the reader goes on with the next line: one bad record never costs the rest of the file."""
    consumed: list[str] = []

    def lines() -> Iterator[str]:
        for line in io.StringIO(text, newline=""):
            consumed.append(line)
            yield line

    reader = csv.reader(lines(), skipinitialspace=True)
    first = 1
    while True:
        try:
            cells: list[str] | None = next(reader)
        except StopIteration:
            break
        except csv.Error:
            cells = None
        record = "".join(consumed)
        consumed.clear()
        yield first, cells, record
        first = reader.line_num + 1


def csv_refusal(text: str) -> str:
    """Why :mod:`csv` refused a record, in one line (the reader's own message is not kept with the record)."""
    if len(text) > csv.field_size_limit():
        return f"a field over {csv.field_size_limit():,} characters (the CSV reader's limit)"
    if "\x00" in text:
        return "a NUL byte"
    return "not CSV (a quote left open, or a character after a closing quote)"


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
            value = float(cell) * _EPOCH_NS[fmt] if len(cell) <= _LONGEST else math.nan
        except ValueError:
            raise BadValue(f"{_short(cell)!r} is not an epoch time ({fmt})") from None
        if not 0 <= value <= INT64_MAX:  # NaN and the infinities too
            raise BadValue(f"{_short(cell)!r} is not an epoch time within 1970..2262 ({fmt})")
        return min(round(value), INT64_MAX)
    try:
        if len(cell) > _LONGEST:
            raise ValueError(cell)
        if fmt == "iso8601":
            parsed = datetime.fromisoformat(re.sub(r"^(\d{4})/(\d\d)/(\d\d)", r"\1-\2-\3", cell))
        else:
            parsed = datetime.strptime(cell, fmt)
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=tz)
        seconds = parsed.timestamp()
    except (ValueError, OverflowError):  # OverflowError: year 1 in a zone east of UTC
        raise BadValue(f"{_short(cell)!r} is not a time ({fmt})") from None
    ns = int(seconds) * 1_000_000_000 + parsed.microsecond * 1000 if seconds >= 0 else round(seconds * 1e9)
    if not 0 <= ns <= INT64_MAX:  # what an int64 of epoch ns holds
        raise BadValue(f"{_short(cell)!r} is not a time within 1970..2262")
    return ns
