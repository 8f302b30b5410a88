"""Small helpers every detector family uses: a metric column by name, NVML reason bits, comparisons that stay quiet
about NaN (an absent reading), and how a number is shown in a finding ("?" when unknown)."""

from __future__ import annotations

from typing import Final

import numpy as np

from pipeline.events import METRIC_INDEX, RELATIVE_FIELDS
from pipeline.vocab import NS_PER_S

S: Final = NS_PER_S
#: column of each relative value in a batch's ``relative`` matrix
REL: Final = {name: i for i, name in enumerate(RELATIVE_FIELDS)}


def col(m: np.ndarray, name: str) -> np.ndarray:
    """The column of metric ``name`` in a metrics matrix (rows x METRIC_NAMES)."""
    return m[:, METRIC_INDEX[name]]


def bits(mask: np.ndarray, which: int) -> np.ndarray:
    """Per row, whether any of ``which`` is set in a bitmask column (False where the mask is absent)."""
    ok = ~np.isnan(mask)
    out = np.zeros(mask.shape, dtype=bool)
    out[ok] = (mask[ok].astype(np.int64) & which) != 0
    return out


def gt(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(a > b)


def lt(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(a < b)


def fmt(value: float, unit: str = "", digits: int = 0) -> str:
    return "?" if value != value else f"{value:.{digits}f}{unit}"  # noqa: PLR0124
