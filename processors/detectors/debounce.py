"""Debouncing of level conditions: per GPU, an exponentially weighted score in data time with hysteresis.

Thermal throttling, a link down or trained low, and an allocated GPU left idle are *levels*: true or false on every
row. Each row moves the GPU's score towards 1 (condition true) with the level's time constant and towards 0
(condition false) with its clearing time constant, by the time since the GPU's previous row; a row that cannot
judge the condition leaves it. The finding starts when the score reaches ``on`` and clears when it falls to
``off``. Clearing is slower than starting: a GPU its controller holds at the slowdown threshold throttles on and off
from one sample to the next, and that is one finding, not one per dip, at a 1 s or a 60 s sampling interval alike:
where the condition is such a snapshot (``Level.snapshot_s``), a row without it counts for at most a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from processors.state import GpuSlots, column


@dataclass(frozen=True, slots=True)
class Level:
    """A level condition's finding, its time constants (s: rising, and falling while the condition is false) and its
    start and clear thresholds."""

    name: str
    tau_s: float
    on: float
    off: float
    clear_tau_s: float | None = None
    #: a row without the condition stands for at most this long of its absence (None: for the time since the GPU's
    #: previous row). For a condition read off a snapshot that comes and goes within seconds (NVML's clocks-event
    #: reasons under a controller that holds a temperature), three rows a minute apart that miss it are three
    #: instants, not three minutes without it: clearing then takes as many rows at 30 or 60 s as at 10 s
    snapshot_s: float | None = None

    @property
    def falling_tau_s(self) -> float:
        return self.tau_s if self.clear_tau_s is None else self.clear_tau_s


@dataclass(eq=False)
class _Scores:
    score: np.ndarray = column(0.0)


class Debounce:
    """The scores of some levels for every GPU (one column per level, in the order given)."""

    def __init__(self, slots: GpuSlots, levels: tuple[Level, ...]) -> None:
        self.levels = levels
        self._tau = np.array([level.tau_s for level in levels])
        self._clear_tau = np.array([level.falling_tau_s for level in levels])
        self._snapshot = np.array([np.inf if level.snapshot_s is None else level.snapshot_s for level in levels])
        self._on = np.array([level.on for level in levels])
        self._off = np.array([level.off for level in levels])
        self._scores = slots.attach(_Scores(np.zeros((0, len(levels)))))

    def step(
        self, g: np.ndarray, cond: np.ndarray, seen: np.ndarray, dt_s: np.ndarray, active: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One row per GPU ``g`` (conditions and whether each could be judged, seconds since the GPU's previous row,
        which levels have an open finding): per GPU and level, whether its finding starts, and whether it clears."""
        tau = np.where(cond, self._tau[None, :], self._clear_tau[None, :])
        span = np.where(cond, dt_s[:, None], np.minimum(dt_s[:, None], self._snapshot[None, :]))
        alpha = 1.0 - np.exp(-span / tau)
        score = self._scores.score[g]
        new = np.where(seen, score + alpha * (cond - score), score)
        self._scores.score[g] = new
        return ~active & (new >= self._on), active & (new <= self._off)
