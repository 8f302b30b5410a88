"""Words every part of hermeneut reads and writes the same way: durations, NVML's clock-event reasons, and idle.

**Durations** (every CLI flag, HTTP parameter, subscription, silence and config entry that takes one): one or more
``<number><unit>`` parts, units ``ns us ms s m h d w``, e.g. ``90s``, ``15m``, ``1h30m``, ``1.5h``, ``7d``,
``2w``. :func:`parse_duration` returns whole nanoseconds and refuses zero, negative, and anything longer than
``max_ns`` (ten years unless said), so ``99999999999h`` is an input error, not an overflow further down.

**Clock-event ("throttle") reasons**: NVML reports why clocks are held as a bitmask (``nvmlClocksEventReason*``,
formerly ``nvmlClocksThrottleReason*``); the mask travels as the metric ``throttle_reasons_mask`` and is decoded
here. :data:`CLOCK_REASONS` is the one table of bits: NVML's name, what it means for a person, and whether it
slows a busy GPU (idle, application clocks, sync boost and display clocks do not; every other reason, and any bit
NVML adds later, does).

**Idle** (:data:`IDLE_UTIL_PERCENT`): a GPU a workload holds is idle below 5% utilization. The one definition of
waste: the idle-capacity finding, ``top wasted`` and right-sizing's idle GPU-hours all count the same time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Final

from pipeline.errors import InvalidInput

NS_PER_S: Final = 1_000_000_000
_UNITS: Final = {
    "ns": 1,
    "us": 1_000,
    "ms": 1_000_000,
    "s": NS_PER_S,
    "m": 60 * NS_PER_S,
    "h": 3600 * NS_PER_S,
    "d": 86_400 * NS_PER_S,
    "w": 7 * 86_400 * NS_PER_S,
}
_DURATION: Final = re.compile(r"^(?:[0-9]{1,12}(?:\.[0-9]{1,9})?(?:ns|us|ms|s|m|h|d|w))+$")
_PART: Final = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h|d|w)")
#: the longest duration anything accepts unless it says otherwise
MAX_DURATION_NS: Final = 10 * 366 * _UNITS["d"]
DURATION_EXAMPLES: Final = "90s, 15m, 1h30m, 1.5h, 7d, 2w"


def parse_duration(
    text: str,
    what: str = "duration",
    *,
    max_ns: int = MAX_DURATION_NS,
    error: type[InvalidInput] = InvalidInput,
    zero: bool = False,
) -> int:
    """``text`` in whole nanoseconds; ``error`` (one readable line; the caller's kind of :class:`InvalidInput`) when
    it is not a positive duration (or zero, where ``zero`` allows it: "do not wait") of at most ``max_ns``."""
    cleaned = text.strip()
    if not _DURATION.match(cleaned):
        raise error(f"{what} {text!r} is not a duration like {DURATION_EXAMPLES}")
    # exact arithmetic: floats lose nanoseconds beyond 2**53 ns (104 days)
    ns = round(sum(Fraction(n) * _UNITS[unit] for n, unit in _PART.findall(cleaned)))
    if ns < 0 or (ns == 0 and not zero):
        raise error(f"{what} {text!r} must be longer than zero")
    if ns > max_ns:
        raise error(f"{what} {text!r} is longer than the {format_duration(max_ns)} allowed")
    return ns


def parse_seconds(
    text: str,
    what: str = "duration",
    *,
    max_ns: int = MAX_DURATION_NS,
    error: type[InvalidInput] = InvalidInput,
    zero: bool = False,
) -> float:
    """:func:`parse_duration` in seconds."""
    return parse_duration(text, what, max_ns=max_ns, error=error, zero=zero) / NS_PER_S


def format_duration(ns: int) -> str:
    """The shortest ``1h30m``-style spelling, which parses back to ``ns``: whole weeks down to seconds, then what is
    left below a second in the largest unit that is exact (``1s500ms``, ``250us``)."""
    seconds, rest = divmod(ns, NS_PER_S)
    out = []
    for unit in ("w", "d", "h", "m", "s"):
        n, seconds = divmod(seconds, _UNITS[unit] // NS_PER_S)
        if n:
            out.append(f"{n}{unit}")
    if rest:
        unit = next(u for u in ("ms", "us", "ns") if rest % _UNITS[u] == 0)
        out.append(f"{rest // _UNITS[unit]}{unit}")
    return "".join(out) or "0s"


@dataclass(frozen=True, slots=True)
class ClockReason:
    """One bit of NVML's clock-event reasons mask."""

    bit: int
    #: NVML's name (``nvmlClocksEventReason<name>``), as its documentation spells it
    name: str
    #: what it means, in a person's words
    words: str
    #: whether it holds a busy GPU below the clocks it could run at
    throttles: bool


#: an allocated GPU below this utilization (%) is idle: its time is wasted capacity
IDLE_UTIL_PERCENT: Final = 5.0

#: every bit nvml.h defines, in bit order (the same values in pynvml)
CLOCK_REASONS: Final[tuple[ClockReason, ...]] = (
    ClockReason(0x0001, "GpuIdle", "idle", False),
    ClockReason(0x0002, "ApplicationsClocksSetting", "application clocks setting", False),
    ClockReason(0x0004, "SwPowerCap", "SW power cap", True),
    ClockReason(0x0008, "HwSlowdown", "HW slowdown", True),
    ClockReason(0x0010, "SyncBoost", "sync boost", False),
    ClockReason(0x0020, "SwThermalSlowdown", "SW thermal slowdown", True),
    ClockReason(0x0040, "HwThermalSlowdown", "HW thermal slowdown", True),
    ClockReason(0x0080, "HwPowerBrakeSlowdown", "HW power brake slowdown", True),
    ClockReason(0x0100, "DisplayClockSetting", "display clock setting", False),
    ClockReason(0x0200, "BoardLimit", "board limit", True),
    ClockReason(0x0400, "Reliability", "reliability limit", True),
)
_BY_NAME: Final = {r.name: r.bit for r in CLOCK_REASONS}
GPU_IDLE: Final = _BY_NAME["GpuIdle"]
SW_POWER_CAP: Final = _BY_NAME["SwPowerCap"]
HW_SLOWDOWN: Final = _BY_NAME["HwSlowdown"]
SW_THERMAL: Final = _BY_NAME["SwThermalSlowdown"]
HW_THERMAL: Final = _BY_NAME["HwThermalSlowdown"]
HW_POWER_BRAKE: Final = _BY_NAME["HwPowerBrakeSlowdown"]
#: the reasons that do not slow a busy GPU down, as one mask
BENIGN_REASONS: Final = sum(r.bit for r in CLOCK_REASONS if not r.throttles)
_KNOWN: Final = sum(r.bit for r in CLOCK_REASONS)


def decode_clock_reasons(mask: int) -> list[str]:
    """NVML's names of the bits set in ``mask`` (``0x24`` -> ``["SwPowerCap", "SwThermalSlowdown"]``); bits NVML
    has not named yet come out as ``Unknown(0x...)``."""
    if mask < 0:
        raise ValueError(f"a reasons mask is never negative, got {mask}")
    names = [r.name for r in CLOCK_REASONS if mask & r.bit]
    rest = mask & ~_KNOWN
    if rest:
        names.append(f"Unknown({rest:#x})")
    return names


def clock_reason_words(mask: int) -> list[str]:
    """The reasons in ``mask`` that slow a busy GPU, in a person's words (``0x24`` -> SW power cap, SW thermal...)."""
    words = [r.words for r in CLOCK_REASONS if r.throttles and mask & r.bit]
    rest = mask & ~_KNOWN
    if rest:
        words.append(f"unknown reason {rest:#x}")
    return words


def utc_text(ns: int) -> str:
    """A time as people and the Kubernetes API read it: RFC 3339 in UTC to the second (``2026-12-07T19:30:00Z``)."""
    return datetime.fromtimestamp(ns / NS_PER_S, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
