"""Per-second rates from monotonic counters, computed from the delta between two readings.

A rate needs two readings, so the first reading of a counter gives no rate (absent, never zero). A counter that
went backwards (driver reload, device reset, a 32-bit counter that wrapped) gives no rate for that round either:
the true delta is unknowable, and a huge negative or wrapped value would be a lie.
"""

from __future__ import annotations

from collections.abc import Hashable


class CounterRates:
    """Remembers the last (value, time) per counter key; :meth:`rate` returns units per second, or None."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[float, int]] = {}

    def rate(self, key: Hashable, value: float, ts_ns: int, scale: float = 1.0) -> float | None:
        """``scale`` converts the counter's unit (e.g. 4 for InfiniBand's 4-byte words, 1024 for KiB)."""
        last = self._last.get(key)
        self._last[key] = (value, ts_ns)
        if last is None:
            return None
        previous, previous_ns = last
        if ts_ns <= previous_ns or value < previous:
            return None
        return (value - previous) * scale * 1e9 / (ts_ns - previous_ns)

    def forget(self, prefix: Hashable) -> None:
        """Drop every counter whose key is a tuple starting with ``prefix`` (a device that went away)."""
        for key in [k for k in self._last if isinstance(k, tuple) and k and k[0] == prefix]:
            del self._last[key]
