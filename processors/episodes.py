"""Episodes: which findings are open, per GPU (or node) and detector, since when, and when each was last sent.

A rule says when its condition starts and when it clears; what happens in between is the same for every rule, so it
is kept here once, for the domain detectors (per GPU, and per node for a fault shared by a node's GPUs) and for the
baselines' anomaly tracker. An open episode knows since when it holds, when it was last sent (a finding is sent when
it starts, again every ``repeat_s`` while it holds, and once when it clears), how it was last described and the workload
it was last told with: its clear carries that workload, as a resolved Alertmanager alert keeps the labels it fired
with (a clear dated where an episode went quiet may be sent after another job took the GPU). Rows are
the slots of a :class:`processors.state.GpuSlots` (or its node ids), so whether an episode is open and when it was
last sent are arrays a rule reads for a whole batch at once; episodes are listed in the order they opened. The
episodes of a freed lane's slots (node ids) are dropped without a message (processors.state says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pipeline.events import Finding, Severity, Workload
from processors.state import GpuSlots, Per, column


class Description(NamedTuple):
    """How a finding reads: its severity, one line saying what is wrong, what to do, and the numbers behind it."""

    severity: Severity
    summary: str
    action: str
    evidence: dict[str, float]


#: where a finding is: cluster, node, GPU uuid (None for a node) and GPU model
Where = tuple[str, str, str | None, str]


@dataclass(slots=True)
class Episode:
    """One open finding: when it started, when it was last sent, and how it was last described."""

    since_ns: int
    last_sent_ns: int
    said: Description = field(default_factory=lambda: Description(Severity.WARNING, "", "", {}))
    #: what the rule noted for its wording (an XID number, a slope, ...)
    detail: dict[str, float] = field(default_factory=dict)
    #: the workload its last start or repeat was told with (its clear is told with it too)
    workload: Workload | None = None


@dataclass(eq=False)
class _Rows:
    """Per row (GPU slot or node) and detector: whether an episode is open, and when it was last sent."""

    open: np.ndarray = column(False)
    last_sent: np.ndarray = column(-1, dtype=np.int64)


class Episodes:
    """The open episodes of some detectors, per GPU slot (or per node with ``per="node"``): see module docstring."""

    def __init__(self, slots: GpuSlots, detectors: tuple[str, ...], per: Per = "gpu") -> None:
        self.detectors = detectors
        self._col = {name: i for i, name in enumerate(detectors)}
        k = len(detectors)
        self._rows = slots.attach(_Rows(np.zeros((0, k), dtype=bool), np.full((0, k), -1, dtype=np.int64)), per)
        self._open: dict[tuple[int, int], Episode] = {}
        self._per = per
        slots.on_free(self._forget)

    def _forget(self, gpus: np.ndarray, nodes: np.ndarray) -> None:
        """The slots (or node ids) of a freed lane go to other GPUs (nodes): their open episodes go, unsent (a
        freed lane's findings are history: processors.state)."""
        freed = set((gpus if self._per == "gpu" else nodes).tolist())
        if freed:
            self._open = {key: e for key, e in self._open.items() if key[0] not in freed}
            self._rows.open[list(freed)] = False  # (the table refills them too, after every forget)

    def __bool__(self) -> bool:
        return bool(self._open)

    def active(self, rows: np.ndarray, detector: str) -> np.ndarray:
        """Per row, whether ``detector`` has an open episode there."""
        return np.asarray(self._rows.open[rows, self._col[detector]])

    def is_open(self, row: int, detector: str) -> bool:
        return bool(self._rows.open[row, self._col[detector]])

    def last_sent(self, rows: np.ndarray, detector: str) -> np.ndarray:
        """Per row, when ``detector`` 's episode there was last sent (meaningful where one is open)."""
        return np.asarray(self._rows.last_sent[rows, self._col[detector]])

    def get(self, row: int, detector: str) -> Episode:
        return self._open[(row, self._col[detector])]

    def listed(self) -> list[tuple[int, str, Episode]]:
        """Every open episode as (row, detector, episode), in the order they opened (a copy: closing is fine)."""
        return [(row, self.detectors[col], episode) for (row, col), episode in self._open.items()]

    def open(self, row: int, detector: str, since_ns: int, detail: dict[str, float] | None = None) -> Episode:
        """Open (or restart) ``detector`` 's episode at ``row``, since ``since_ns`` (and counted as sent then)."""
        col = self._col[detector]
        episode = self._open[(row, col)] = Episode(since_ns, since_ns, detail=dict(detail or {}))
        self._rows.open[row, col] = True
        self._rows.last_sent[row, col] = since_ns
        return episode

    def close(self, row: int, detector: str) -> Episode:
        """Close ``detector`` 's open episode at ``row`` and return it."""
        col = self._col[detector]
        self._rows.open[row, col] = False
        return self._open.pop((row, col))

    def send(
        self,
        row: int,
        detector: str,
        active: bool,
        ts_ns: int,
        where: Where,
        said: Description,
        workload: Workload | None = None,
        gpu_index: int | None = None,
    ) -> Finding:
        """The finding of ``detector`` 's open episode at ``row`` as of ``ts_ns`` (a start or a repeat when
        ``active``, with ``workload``; else its clear, with the workload it was last told with), reading as
        ``said``; the episode counts as sent then."""
        col = self._col[detector]
        episode = self._open[(row, col)]
        if active:
            episode.workload = workload
        else:
            workload = episode.workload
        episode.last_sent_ns = ts_ns
        self._rows.last_sent[row, col] = ts_ns
        cluster, node, uuid, model = where
        return Finding(
            detector,
            said.severity,
            active,
            cluster,
            node,
            uuid,
            model,
            ts_ns,
            episode.since_ns,
            said.summary,
            said.action,
            said.evidence,
            workload,
            gpu_index,
        )
