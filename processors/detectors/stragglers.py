"""Straggler detection by peer comparison: which workers of one distributed job are persistently slower.

One pure function over windows serves both the stream (per-GPU step-time proxies per 30 s window, in
:mod:`processors.detectors`) and the Alibaba PAI step-time traces (tests/unit/test_straggler.py).

Per window, each worker's step time is compared with the job's median: ``rel`` is how much slower it is
(0.10 = 10% slower) and ``z`` how far that is against the peers' spread, robustly (the median absolute
deviation, scaled to a standard deviation, with a floor of 1% of the median so that identical peers do not
make a tiny difference infinitely significant). Only slower counts: a faster worker is never a straggler.

A worker becomes a straggler by one of two routes:

- *persistent*: over the last ``persist`` windows, its median ``z`` is at least ``z_min`` and its median
  ``rel`` at least ``rel_min``. The median over windows is what tells a real straggler (PAI job 3: two workers
  ~10% slower window after window, well outside a tight peer group) from persistent small per-worker
  differences (job 2: a continuum of speeds, so no worker is far outside the spread) and from a group of
  workers whose lead is within each window's noise (job 1, workers 0-2).
- *acute*: at least ``rel_acute`` slower (30%) for ``acute`` consecutive windows. A slowdown this large is a
  straggler even when several workers share it and the MAD is wide (PAI job 4: half the workers at 2-4x).

It stays a straggler until neither route has held for ``clear`` consecutive windows (hysteresis), so a
fluctuating straggler is one episode, not many. Jobs with fewer than ``min_workers`` reporting workers are not
judged: with two workers there is no telling which one is the slow one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class StragglerParams:
    rel_min: float = 0.07
    z_min: float = 3.0
    rel_acute: float = 0.30
    persist: int = 8
    acute: int = 1
    clear: int = 3
    min_workers: int = 3
    #: two workers have no median to be slower than: the slower one is judged by its excess over the faster one,
    #: this much counting as the robust z's ``z_min`` (0 turns pairs off)
    pair_rel: float = 0.15
    #: the MAD's floor as a fraction of the median
    mad_floor: float = 0.01


@dataclass(slots=True)
class PeerState:
    """Per-worker history of one job: the last ``persist`` windows of rel and z, and the hysteresis state."""

    rel: np.ndarray  # (workers, persist), NaN where a window is missing
    z: np.ndarray
    acute_run: np.ndarray  # consecutive acute windows
    quiet: np.ndarray  # consecutive windows without either route
    active: np.ndarray
    windows: int = 0

    @classmethod
    def empty(cls, workers: int, params: StragglerParams) -> PeerState:
        nan = np.full((workers, params.persist), np.nan)
        zeros = np.zeros(workers, dtype=np.int64)
        return cls(nan, nan.copy(), zeros, zeros.copy(), np.zeros(workers, dtype=bool))


@dataclass(frozen=True, slots=True)
class PeerVerdict:
    """The outcome of one window: per worker, whether it is a straggler now and the numbers behind it."""

    active: np.ndarray
    rel: np.ndarray
    z: np.ndarray
    median_rel: np.ndarray
    median_z: np.ndarray
    peer_median: float
    judged: bool = field(default=True)


def window_scores(step_times: np.ndarray, mad_floor: float = 0.01) -> tuple[np.ndarray, np.ndarray, float]:
    """For one window: each worker's relative excess over the median and its robust z (NaN where missing)."""
    med = float(np.nanmedian(step_times))
    mad = float(np.nanmedian(np.abs(step_times - med)))
    rel = (step_times - med) / med
    z = (step_times - med) / (1.4826 * mad + mad_floor * abs(med))
    return rel, z, med


def pair_scores(step_times: np.ndarray, params: StragglerParams) -> tuple[np.ndarray, np.ndarray, float]:
    """For a window of exactly two workers: each one's excess over the faster one, and that excess on the robust
    z's scale (``pair_rel`` maps to ``z_min``), so the same persistence rules apply."""
    fastest = float(np.nanmin(step_times))
    rel = step_times / fastest - 1.0
    return rel, rel / params.pair_rel * params.z_min, fastest


def peer_step(state: PeerState, step_times: np.ndarray, params: StragglerParams) -> tuple[PeerState, PeerVerdict]:
    """Advance one job by one window of per-worker step times (NaN: the worker did not report)."""
    n = int(np.count_nonzero(~np.isnan(step_times)))
    workers = step_times.shape[0]
    pair = n == 2 and params.pair_rel > 0
    if n < params.min_workers and not pair:
        nan = np.full(workers, np.nan)
        return state, PeerVerdict(state.active.copy(), nan, nan, nan, nan, float("nan"), judged=False)
    rel, z, med = pair_scores(step_times, params) if pair else window_scores(step_times, params.mad_floor)
    rel_hist = np.roll(state.rel, -1, axis=1)
    z_hist = np.roll(state.z, -1, axis=1)
    rel_hist[:, -1], z_hist[:, -1] = rel, z
    windows = state.windows + 1
    seen = np.count_nonzero(~np.isnan(rel_hist), axis=1)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        # a worker with no windows yet is an all-NaN row: expected, numpy's warning about it is noise here
        warnings.simplefilter("ignore", RuntimeWarning)
        median_rel = np.nanmedian(rel_hist, axis=1)
        median_z = np.nanmedian(z_hist, axis=1)
        # the persistent route needs most of its windows: a straggler is judged on a history, not one window
        persistent = (seen >= max(3, params.persist // 2)) & (median_z >= params.z_min) & (median_rel >= params.rel_min)
        acute_now = rel >= params.rel_acute
    acute_run = np.where(acute_now, state.acute_run + 1, 0)
    holds = persistent | (acute_run >= params.acute)
    quiet = np.where(holds, 0, state.quiet + 1)
    active = holds | (state.active & (quiet < params.clear))
    new = PeerState(rel_hist, z_hist, acute_run, quiet, active, windows)
    return new, PeerVerdict(active.copy(), rel, z, median_rel, median_z, med)


def scan(step_times: np.ndarray, params: StragglerParams) -> np.ndarray:
    """Straggler flags for a whole history: ``step_times`` is (workers, windows); returns a bool matrix alike."""
    state = PeerState.empty(step_times.shape[0], params)
    flags = np.zeros(step_times.shape, dtype=bool)
    for k in range(step_times.shape[1]):
        state, verdict = peer_step(state, step_times[:, k], params)
        flags[:, k] = verdict.active
    return flags
