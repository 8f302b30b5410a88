"""A clock a test sets by hand (``clock.now = ...``): seconds or nanoseconds, whatever the code under test reads."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class NsClock:
    """The same in integer nanoseconds (``time.time_ns`` stand-in)."""

    def __init__(self, now_ns: int) -> None:
        self.now_ns = now_ns

    def __call__(self) -> int:
        return self.now_ns
