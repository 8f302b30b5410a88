"""What the detectors know about every GPU whatever its faults, and the view of one GPU a finding's wording gets.

Per GPU: its latest reading and relative values (a finding started on a row describes that row), the newest value
of each error counter, when it last reported and when its node last did (data time), what runs on it, and until
when a finding that slows it down held (which explains a straggler). A family's wording never sees more than a
:class:`GpuView`: who the GPU is, what runs there, and those latest values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.events import METRIC_INDEX, METRIC_NAMES, RELATIVE_FIELDS, Workload
from processors.detectors.names import EXPLAINS_SLOWNESS
from processors.state import GpuSlots, column

#: error counters whose rises the detectors judge (the newest value of each is kept per GPU)
COUNTERS: Final = (
    "ecc_uncorrected_total",
    "row_remap_uncorrectable_total",
    "retired_pages_dbe_total",
    "row_remap_correctable_total",
    "nvlink_crc_errors_total",
    "nvlink_recovery_errors_total",
    "pcie_replay_total",
    "ecc_corrected_total",
    "pcie_aer_correctable_total",
    "pcie_aer_uncorrectable_total",
)
COUNTER: Final = {name: i for i, name in enumerate(COUNTERS)}
_COUNTER_COLS: Final = [METRIC_INDEX[name] for name in COUNTERS]
_FOREVER: Final = int(np.iinfo(np.int64).max)
#: one bit per finding that explains a slow GPU (Latest.explained_by)
_CAUSE_BIT: Final = {name: 1 << i for i, name in enumerate(EXPLAINS_SLOWNESS)}


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as a finding's wording sees it: who it is, what runs there, its latest reading (absent fields left
    out), its latest relative values (likewise) and its error counters (NaN where unknown)."""

    slot: int
    cluster: str
    node: str
    uuid: str
    index: int
    model: str
    workload: Workload | None
    row: dict[str, float]
    rel: dict[str, float]
    counters: dict[str, float]

    def who(self) -> str:
        """``GPU 3 (NVIDIA H100 80GB HBM3) on node-7, job 42 (llm-pretraining)``: how a summary names the GPU."""
        wl = self.workload
        gpu = f"GPU {self.index} ({self.model or 'unknown model'}) on {self.node}"
        if wl is None:
            return gpu
        if wl.job_id:
            return f"{gpu}, job {wl.job_id} ({wl.application})"
        return f"{gpu}, {wl.application}" + (" (inferred)" if wl.source == "inferred" else "")


@dataclass(eq=False)
class Latest:
    """Per GPU (see module docstring)."""

    ts: np.ndarray = column(-1, dtype=np.int64)
    row: np.ndarray = column(np.nan, len(METRIC_NAMES))
    rel: np.ndarray = column(np.nan, len(RELATIVE_FIELDS))
    counters: np.ndarray = column(np.nan, len(COUNTERS))
    workload: np.ndarray = column(None)
    #: until when a finding that slows the GPU down (thermal, a power cap, its links...) held: it explains a straggler
    explained_until: np.ndarray = column(-1, dtype=np.int64)
    #: which of those findings are open on the GPU now (a bit each): one clearing while another still holds (an XID
    #: gone quiet under its node's power cap) leaves the GPU explained
    explained_by: np.ndarray = column(0, dtype=np.int64)

    def explained(self, slot: int | np.ndarray, holds: bool, ts_ns: int, cause: str) -> None:
        """A finding ``cause`` (one of EXPLAINS_SLOWNESS; a node's power cap is its GPUs' POWER) that slows the GPU
        (or GPUs) down started (``holds``) or cleared at ``ts_ns``: explained until the last open one clears."""
        slots = np.atleast_1d(np.asarray(slot, dtype=np.int64))
        bit = _CAUSE_BIT[cause]
        held = self.explained_by[slots]
        now = held | bit if holds else held & ~bit
        self.explained_by[slots] = now
        ended = (held != 0) & (now == 0)
        self.explained_until[slots] = np.where(now != 0, _FOREVER, np.where(ended, ts_ns, self.explained_until[slots]))

    def explains(self, slot: np.ndarray, ts_ns: np.ndarray) -> np.ndarray:
        """Per GPU: whether a finding that slows it down was open at ``ts_ns`` (the GPU's slowness is told)."""
        out: np.ndarray = self.explained_until[slot] >= ts_ns
        return out

    def counter_deltas(
        self, s: np.ndarray, first: np.ndarray, m: np.ndarray, late: np.ndarray | None = None
    ) -> np.ndarray:
        """Per row (sorted by slot, then time; ``first``: a slot's first row), how much each error counter rose since
        its last known value (an earlier row of the batch, else the GPU's kept one): a counter absent from some rows
        (a costly NVML reading read every n-th round) rises by what it gained over the gap, however the rows are
        batched. 0 on a reset (the counter fell) or where it is unknown; the newest value of each becomes the GPU's.
        A ``late`` row (older than the GPU's latest) says nothing about its counters: read back lower and then
        higher again, a counter would look reset and then risen."""
        values = m[:, _COUNTER_COLS]
        if late is not None and late.any():
            values = np.where(late[:, None], np.nan, values)
        n = len(values)
        rows = np.arange(n)
        start = np.maximum.accumulate(np.where(first, rows, 0))  # each row's slot's first row
        known_at = np.maximum.accumulate(np.where(np.isnan(values), -1, rows[:, None]), axis=0)
        before = np.vstack([np.full((1, len(COUNTERS)), -1), known_at[:-1]])  # the last known row before each row
        in_batch = before >= start[:, None]
        earlier = np.take_along_axis(values, np.maximum(before, 0), axis=0)
        prev = np.where(in_batch, earlier, self.counters[s])
        with np.errstate(invalid="ignore"):
            delta = np.where(np.isnan(prev) | np.isnan(values), 0.0, np.maximum(values - prev, 0.0))
        last = np.r_[s[1:] != s[:-1], True]
        newest = known_at[last]  # per GPU and counter: its last known row in the batch
        kept = newest >= start[last][:, None]
        latest = np.take_along_axis(values, np.maximum(newest, 0), axis=0)
        self.counters[s[last]] = np.where(kept, latest, self.counters[s[last]])
        return np.asarray(delta)

    def view(self, slots: GpuSlots, slot: int) -> GpuView:
        cluster, node, uuid = slots.key(slot)
        row = {n: float(v) for n, v in zip(METRIC_NAMES, self.row[slot].tolist(), strict=True) if v == v}  # noqa: PLR0124
        rel = {n: float(v) for n, v in zip(RELATIVE_FIELDS, self.rel[slot].tolist(), strict=True) if v == v}  # noqa: PLR0124
        counters = dict(zip(COUNTERS, self.counters[slot].tolist(), strict=True))
        workload = self.workload[slot]
        return GpuView(slot, cluster, node, uuid, slots.index(slot), slots.model(slot), workload, row, rel, counters)


@dataclass(eq=False)
class NodeClock:
    """Per node: the newest sample or event time any of its GPUs reported (data time)."""

    latest: np.ndarray = column(-1, dtype=np.int64)
