"""The simulated GPUs' NVLinks as NVML reads them per link: state and error counters, the remote end each link is
wired to. Throughput per link is left None: the GPU's totals carry it (building 18 link objects per GPU per round
would cost more than the rest of the round, and the sink stores link points only on change)."""

from __future__ import annotations

import numpy as np

from pipeline.events import NvLinkSample
from producers.simulator.effects import Effects


class NvLinkRows:
    """Per GPU, its links' samples; the tuples are rebuilt only for GPUs where something changed."""

    def __init__(self, remote: list[list[str | None]], has_nvlink: np.ndarray) -> None:
        """``remote``: per GPU, the remote end of each of its links (as the node kind wires them)."""
        self._remote, self._has = remote, has_nvlink
        self._state: np.ndarray | None = None
        self._cache: list[tuple[NvLinkSample, ...] | None] = [None] * len(remote)

    def samples(self, e: Effects) -> list[tuple[NvLinkSample, ...] | None]:
        """This round's link samples of every GPU (None: a GPU without NVLink), from the faults' effects."""
        if not e.links:
            return [None] * len(self._remote)
        state = np.concatenate([e.link_up & e.link_exists, e.nvl_crc, e.nvl_replay, e.nvl_recovery], axis=1)
        if self._state is None or self._state.shape != state.shape:
            dirty = np.flatnonzero(self._has)
        else:
            dirty = np.flatnonzero((state != self._state).any(axis=1) & self._has)
        self._state = state
        if len(dirty):
            up = e.link_up[dirty].tolist()
            crc, replay, recovery = (
                a[dirty].astype(np.int64).tolist() for a in (e.nvl_crc, e.nvl_replay, e.nvl_recovery)
            )
            for row, g in enumerate(dirty.tolist()):
                self._cache[g] = tuple(
                    NvLinkSample(k, up[row][k], None, None, crc[row][k], replay[row][k], recovery[row][k], end)
                    for k, end in enumerate(self._remote[g])
                )
        return self._cache
