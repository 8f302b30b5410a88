"""The Alibaba PAI 2020 mini-batch stragglers (tests/testdata/alibaba-pai2020-minibatch-stragglers): the step
times of each worker in windows of 10 steps, and the stragglers the trace's README names per job, against which
the straggler rule's flags are compared (``hermeneut evaluate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

#: the stragglers the Alibaba PAI 2020 mini-batch README names, per job (every other worker must stay unflagged)
PAI_LABELS: Final[dict[int, frozenset[int]]] = {
    1: frozenset({6}),
    2: frozenset(),
    3: frozenset({0, 1}),
    4: frozenset({0, 5, 6, 7, 8}),
}
#: time-index units per window: 10 steps (the index advances by 10 per step)
PAI_WINDOW: Final = 100


def pai_step_windows(csv: Path) -> np.ndarray:
    """Per worker, the median mini-batch time of each window of 10 steps: (10 workers, windows), NaN if missing."""
    data = np.genfromtxt(csv, delimiter=",", skip_header=1)
    worker, time, step = data[:, 0].astype(int), data[:, 2], data[:, 3]
    k = ((time - 1) // PAI_WINDOW).astype(int)
    out = np.full((int(worker.max()) + 1, int(k.max()) + 1), np.nan)
    for w in np.unique(worker).tolist():
        for window in np.unique(k[worker == w]).tolist():
            out[w, window] = np.median(step[(worker == w) & (k == window)])
    return out


@dataclass(frozen=True, slots=True)
class PaiResult:
    job: int
    flagged: frozenset[int]
    expected: frozenset[int]

    @property
    def ok(self) -> bool:
        return self.flagged == self.expected


def pai_result(job: int, flags: np.ndarray) -> PaiResult:
    """Compare a (workers, windows) flag matrix for a PAI job with its labels."""
    return PaiResult(job, frozenset(int(w) for w in np.flatnonzero(flags.any(axis=1))), PAI_LABELS[job])
