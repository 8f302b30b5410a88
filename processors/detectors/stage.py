"""Domain detectors: GPU faults recognised by their physical signatures, each with evidence and an action.

The :class:`Detectors` stage (last in the interpretation chain) emits :class:`pipeline.events.Finding` s named
after the fault classes (``thermal-throttling``, ``power-capping``, ``nvlink-down``, ``pcie-link-degraded``,
``memory-leak``, ``straggler``, ``xid-storm``, ``ecc-uncorrectable``, ``fallen-off-bus``) plus ``xid`` (single XIDs
below storm level), ``row-remap`` (a remap/retirement waiting for a reset) and ``idle-capacity`` (allocated but
unused). A finding is sent when its condition starts, again every ``repeat_s`` while it holds, and once with
``active=False`` when it clears; the summary of every active finding is appended to the ``explanation`` of the
GPU's rows. A power cap that lowers several GPUs of a node at once (a failed power supply, a rack's budget) is one
*node-level* finding (``gpu_uuid`` None) naming the GPUs; each of their rows carries its summary.

Everything runs on *data time* (the samples' ``ts_ns``), never the wall clock, so a replay or a fast-forwarded
history gives the findings a live stream would have given, at the same timestamps.

State is per GPU in numpy arrays indexed by a slot table (GPU -> slot). A batch is sorted by (slot, time) and
walked in *levels*: level k holds the k-th row of every GPU in the batch, so each level is one vectorized update
of all GPUs at once (one level per sampling round; a live batch has one, a fast-forward batch a few dozen).
Level conditions are debounced by an exponentially weighted score in data time with hysteresis (start above
0.6, clear below 0.15), so noise and short dips neither start nor end a finding. How each detector tells a fault
from healthy behaviour that looks alike (idle PCIe downshift, checkpoint dips, KV-cache growth, an operator's power
cap) is in docs/detectors.md. Job boundaries come from the context (a change of job id) and from the telemetry
itself (a change of the GPU's compute processes), so a rule that needs them works without a context source too.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np

from pipeline.config import DetectorSettings
from pipeline.events import (
    METRIC_INDEX,
    METRIC_NAMES,
    RELATIVE_FIELDS,
    EventKind,
    Finding,
    GpuEvent,
    GpuProcess,
    InterpretedBatch,
    NodeTopology,
    NvLinkSample,
    Severity,
    Workload,
)
from pipeline.vocab import HW_SLOWDOWN, HW_THERMAL, SW_POWER_CAP, SW_THERMAL
from processors.detectors.hard_errors import LOST, UNCORRECTABLE, describe
from processors.detectors.stragglers import PeerState, StragglerParams, peer_step

TopologyOf = Callable[[str, str], NodeTopology | None]

THERMAL: Final = "thermal-throttling"
POWER: Final = "power-capping"
NVLINK: Final = "nvlink-down"
PCIE: Final = "pcie-link-degraded"
LEAK: Final = "memory-leak"
STRAGGLER: Final = "straggler"
STORM: Final = "xid-storm"
ECC: Final = "ecc-uncorrectable"
LOST_BUS: Final = "fallen-off-bus"
XID: Final = "xid"
REMAP: Final = "row-remap"
IDLE: Final = "idle-capacity"
DETECTORS: Final = (THERMAL, POWER, NVLINK, PCIE, LEAK, STRAGGLER, STORM, ECC, LOST_BUS, XID, REMAP, IDLE)
_D: Final = {name: i for i, name in enumerate(DETECTORS)}
#: the level conditions debounced by a score (column order of the score matrix) and their time constants (s)
_DEBOUNCED: Final = (THERMAL, NVLINK, PCIE, IDLE)
_TAU_S: Final = np.array([10.0, 5.0, 15.0, 300.0])
_ON: Final = np.array([0.6, 0.6, 0.6, 0.9])
_OFF: Final = np.array([0.15, 0.15, 0.15, 0.3])
#: a straggler whose GPU already has one of these findings is explained by it and not reported twice
_EXPLAINS_SLOWNESS: Final = (THERMAL, POWER, NVLINK, PCIE, LEAK, STORM, ECC, LOST_BUS)

# NVML clocks-event (throttle) reason bits

_COUNTERS: Final = (
    "ecc_uncorrected_total",
    "row_remap_uncorrectable_total",
    "retired_pages_dbe_total",
    "row_remap_correctable_total",
    "nvlink_crc_errors_total",
    "nvlink_recovery_errors_total",
    "pcie_replay_total",
)
_C: Final = {name: i for i, name in enumerate(_COUNTERS)}
_REL: Final = {name: i for i, name in enumerate(RELATIVE_FIELDS)}
_S: Final = 1_000_000_000
#: memory-leak trend: 9 per-minute means (two 4-minute growths), at least 0.2% of the GPU's memory per minute
_MEM_RING: Final = 9
_LEAK_MIN_SLOPE: Final = 0.002 / 60
#: fast leaks: 12 means of 10 s (a 2-minute straight line), at least 1% of the GPU's memory per minute
_FAST_BUCKET_S: Final = 10
_FAST_RING: Final = 12
_FAST_MIN_SLOPE: Final = 0.01 / 60
#: the line must explain the growth (R^2), the second minute must grow at >= 0.95x the first (a cache filling
#: towards a plateau with a time constant under ~20 minutes slows down more than that; one with a longer time
#: constant is never projected full within 10 minutes), and no 10 s may fall
_FAST_R2: Final = 0.98
_FAST_KEEP_PACE: Final = 0.95
_FAST_MAX_DIP: Final = 0.002
#: the first minute after a job starts (or the GPU is first seen) is start-up: its allocations are not judged
_FAST_STARTUP_S: Final = 60
#: completed straggler windows kept per GPU (a fast-forward batch spans a few windows; judging lags by two)
_RING: Final = 8
_BUSY_UTIL: Final = 20.0
#: an idle or lightly loaded GPU may train its link at a lower generation: only judged above this
_PCIE_BUSY_UTIL: Final = 40.0
_CONTAINED_ECC: Final = 94
_NO_PROCS: Final = -(2**63)
#: process signatures of a GPU without compute processes (an empty list, a process count of 0); with _NO_PROCS
_NO_WORK: Final = (_NO_PROCS, hash(()), 0)
_IDLE_UTIL: Final = 5.0


@dataclass(slots=True)
class _Episode:
    """An active finding: when it started, when it was last sent, and how it was last described."""

    since_ns: int
    last_sent_ns: int
    severity: Severity
    summary: str
    action: str
    evidence: dict[str, float]
    detail: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Peers:
    """One job's GPUs (slots, in the order they joined; ``members``: those still in it) and its straggler history."""

    slots: list[int]
    members: set[int]
    state: PeerState
    evaluated: int = -1  # last window index judged


def _col(m: np.ndarray, name: str) -> np.ndarray:
    return m[:, METRIC_INDEX[name]]


def _bits(mask: np.ndarray, bits: int) -> np.ndarray:
    ok = ~np.isnan(mask)
    out = np.zeros(mask.shape, dtype=bool)
    out[ok] = (mask[ok].astype(np.int64) & bits) != 0
    return out


def _gt(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(a > b)


def _lt(a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.asarray(a < b)


def level_conditions(
    m: np.ndarray, rel: np.ndarray, allocated: np.ndarray, expected_links: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the debounced detectors' condition and whether it can be judged from this row (columns: _DEBOUNCED).

    Pure: a table of rows in, two bool matrices out.
    """
    n = m.shape[0]
    util = _col(m, "utilization_gpu_percent")
    mask = _col(m, "throttle_reasons_mask")
    temp, slowdown = _col(m, "temperature_gpu_celsius"), _col(m, "temperature_slowdown_celsius")
    clock = rel[:, _REL["sm_clock_ratio_of_max"]]
    thermal_bits = _bits(mask, HW_THERMAL | SW_THERMAL)
    hot = ~_lt(temp, slowdown - 3.0)
    # HW slowdown alone can be a power brake; with the GPU at its slowdown temperature it is thermal
    thermal = thermal_bits | (_bits(mask, HW_SLOWDOWN) & hot)
    # without the reasons mask (some exporters), the temperature at slowdown with clocks pulled down says it
    thermal |= np.isnan(mask) & ~_lt(temp, slowdown) & _lt(clock, 0.9)
    thermal_seen = ~np.isnan(mask) | ~np.isnan(temp)

    active, links_max = _col(m, "nvlink_links_active"), _col(m, "nvlink_links_max")
    expected = np.where(expected_links > 0, expected_links, links_max)
    nvlink = _lt(active, expected)
    nvlink_seen = ~np.isnan(active) & _gt(expected, 0)

    gen, gen_max = _col(m, "pcie_link_gen"), _col(m, "pcie_link_gen_max")
    width, width_max = _col(m, "pcie_link_width"), _col(m, "pcie_link_width_max")
    narrow = _lt(width, width_max)
    # an idle GPU downshifts its link generation to save power (gen 1 at idle is normal); width never changes
    loaded = _gt(util, _PCIE_BUSY_UTIL)
    pcie = narrow | (loaded & _lt(gen, gen_max))
    pcie_seen = narrow | (loaded & ~np.isnan(gen) & ~np.isnan(gen_max))

    idle = allocated & _lt(util, _IDLE_UTIL)
    idle_seen = ~np.isnan(util)
    cond = np.column_stack([thermal, nvlink, pcie, idle]).reshape(n, len(_DEBOUNCED))
    seen = np.column_stack([thermal_seen, nvlink_seen, pcie_seen, idle_seen]).reshape(n, len(_DEBOUNCED))
    return cond, seen


def fast_leak(
    ring: np.ndarray, full: np.ndarray, min_slope: float, max_full_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU, whether its memory is leaking fast: the 10-s means of the memory used ratio in ``ring`` (oldest
    first, the window complete) rise along a straight line that does not slow down and reaches ``full`` within
    ``max_full_s``. Returns (leaking, slope per second, projected seconds to full).

    Pure: a table of windows in, three arrays out.
    """
    k = ring.shape[1]
    x = np.arange(k, dtype=np.float64) * _FAST_BUCKET_S
    complete = ~np.isnan(ring).any(axis=1)
    y = np.where(complete[:, None], ring, 0.0)

    def slopes(part: np.ndarray, xs: np.ndarray) -> np.ndarray:
        xc = xs - xs.mean()
        return np.asarray((part - part.mean(axis=1, keepdims=True)) @ xc / (xc @ xc))

    slope = slopes(y, x)
    fitted = y.mean(axis=1, keepdims=True) + slope[:, None] * (x - x.mean())
    ss_tot = ((y - y.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    ss_res = ((y - fitted) ** 2).sum(axis=1)
    half = k // 2
    first, second = slopes(y[:, :half], x[:half]), slopes(y[:, half:], x[half:])
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = np.where(ss_tot > 0, 1.0 - ss_res / ss_tot, 0.0)
        to_full = np.where(slope > 0, (full - y[:, -1]) / slope, np.inf)
    leaking = (
        complete
        & (slope >= min_slope)
        & (r2 >= _FAST_R2)
        & (second >= _FAST_KEEP_PACE * first)
        & (np.diff(y, axis=1) > -_FAST_MAX_DIP).all(axis=1)
        & (to_full > 0)
        & (to_full <= max_full_s)
    )
    return leaking, np.where(complete, slope, np.nan), to_full


def _links_from_samples(m: np.ndarray, links: list[tuple[NvLinkSample, ...] | None]) -> None:
    """Where a source reports per-link NVLink state but not the totals, count the links (in place)."""
    active, most = METRIC_INDEX["nvlink_links_active"], METRIC_INDEX["nvlink_links_max"]
    for i in np.flatnonzero(np.isnan(m[:, active])).tolist():
        per_link = links[i]
        if per_link:
            m[i, active] = sum(1 for link in per_link if link.active)
            if np.isnan(m[i, most]):
                m[i, most] = len(per_link)


def _usable_ratio(m: np.ndarray) -> np.ndarray:
    """The share of each GPU's memory that processes can use (the driver reserves the rest; 1 where unknown)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        usable = 1.0 - _col(m, "memory_reserved_bytes") / _col(m, "memory_total_bytes")
    return np.where(np.isnan(usable), 1.0, usable)


def _process_signature(processes: tuple[GpuProcess, ...] | None, count: float) -> int:
    """Which compute processes use a GPU, as one number: a hash of their pids, else the process count."""
    if processes is not None:
        return hash(tuple(sorted(p.pid for p in processes if p.kind == "compute")))
    return _NO_PROCS if count != count else int(count)  # noqa: PLR0124 (NaN test)


def _fmt(value: float, unit: str = "", digits: int = 0) -> str:
    return "?" if value != value else f"{value:.{digits}f}{unit}"  # noqa: PLR0124


class Detectors:
    """The detectors stage (see module docstring)."""

    # per-GPU state, one row per slot (allocated and grown together by _alloc)
    last_ts: np.ndarray
    last_row: np.ndarray
    last_rel: np.ndarray
    node_of: np.ndarray
    score: np.ndarray
    active: np.ndarray
    counters: np.ndarray
    expected_links: np.ndarray
    job_code: np.ndarray
    boundary_ts: np.ndarray
    app_boundary_ts: np.ndarray
    ref_limit: np.ndarray
    drop_since: np.ndarray
    drop_from: np.ndarray
    mem_ring: np.ndarray
    mem_acc: np.ndarray
    mem_minute: np.ndarray
    leak_rate: np.ndarray
    leak_origin: np.ndarray
    leak_since: np.ndarray
    leak_false_since: np.ndarray
    leak_peak: np.ndarray
    fast_ring: np.ndarray
    fast_acc: np.ndarray
    fast_bucket: np.ndarray
    proc_sig: np.ndarray
    power_by_node: np.ndarray
    win_idx: np.ndarray
    win_sums: np.ndarray
    win_done: np.ndarray
    ecc_ts: np.ndarray
    remap_ts: np.ndarray
    explained_until: np.ndarray
    back_since: np.ndarray
    node_latest: np.ndarray

    def __init__(self, settings: DetectorSettings | None = None, topology_of: TopologyOf | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.topology_of: TopologyOf = topology_of or (lambda _cluster, _node: None)
        self.straggler_params = StragglerParams(acute=2)
        self._slot: dict[tuple[str, str, str], int] = {}
        self._cluster: list[str] = []
        self._node: list[str] = []
        self._uuid: list[str] = []
        self._index: list[int] = []
        self._model: list[str] = []
        self._workload: list[Workload | None] = []
        self._group: list[str | None] = []
        self._node_id: dict[tuple[str, str], int] = {}
        self.node_latest = np.full(0, -1, np.int64)
        self._cap = 0
        self._alloc(64)
        self._episodes: dict[tuple[int, int], _Episode] = {}
        #: node-level findings, by (node id, detector): a power cap on several GPUs of a node at once
        self._node_episodes: dict[tuple[int, int], _Episode] = {}
        self._xids: dict[int, deque[tuple[int, int]]] = {}
        self._jobs: dict[str, _Peers] = {}
        self._job_codes: dict[str, int] = {}
        self._touched: set[str] = set()
        self._wl_codes: dict[tuple[str | None, str] | None, tuple[int, int]] = {}
        self._topology_asked: dict[tuple[str, str], int] = {}

    # ----------------------------------------------------------------------------------------------- state
    def _alloc(self, cap: int) -> None:
        old, self._cap = self._cap, cap
        nan, d = np.nan, len(DETECTORS)

        def grow(name: str, fill: float | int | bool, dtype: type, *tail: int) -> None:
            fresh: np.ndarray = np.full((cap, *tail), fill, dtype=dtype)
            if old:
                fresh[:old] = getattr(self, name)
            setattr(self, name, fresh)

        grow("last_ts", -1, np.int64)
        grow("last_row", nan, np.float64, len(METRIC_NAMES))
        grow("last_rel", nan, np.float64, len(RELATIVE_FIELDS))
        grow("node_of", -1, np.int64)
        grow("score", 0.0, np.float64, len(_DEBOUNCED))
        grow("active", False, bool, d)
        grow("counters", nan, np.float64, len(_COUNTERS))
        grow("expected_links", 0.0, np.float64)
        grow("job_code", -1, np.int64, 2)  # codes of the job id and of the application
        grow("boundary_ts", -(2**62), np.int64)
        grow("app_boundary_ts", -(2**62), np.int64)
        # power capping: the accepted limit, and a drop from it waiting for confirmation
        grow("ref_limit", nan, np.float64)
        grow("drop_since", -1, np.int64)
        grow("drop_from", nan, np.float64)
        # the GPU's lowered limit is reported by its node's finding (several GPUs of the node lowered together)
        grow("power_by_node", False, bool)
        # memory leak: per-minute means of the memory used ratio (oldest first) and the minute being summed
        grow("mem_ring", nan, np.float64, _MEM_RING)
        grow("mem_acc", 0.0, np.float64, 2)
        grow("mem_minute", -1, np.int64)
        grow("leak_rate", nan, np.float64)
        grow("leak_origin", -1, np.int64)
        grow("leak_since", -1, np.int64)
        grow("leak_false_since", -1, np.int64)
        grow("leak_peak", 0.0, np.float64)
        # fast leaks: 10-s means of the memory used ratio (oldest first) and the 10 s being summed
        grow("fast_ring", nan, np.float64, _FAST_RING)
        grow("fast_acc", 0.0, np.float64, 2)
        grow("fast_bucket", -1, np.int64)
        # the GPU's compute processes as last seen (a hash of their pids; _NO_PROCS: not reported)
        grow("proc_sig", _NO_PROCS, np.int64)
        # straggler windows: sums of util, busy sm-clock ratio and their counts for the current window
        grow("win_idx", -1, np.int64)
        grow("win_sums", 0.0, np.float64, 4)
        grow("win_done", nan, np.float64, _RING, 3)  # completed windows, oldest first: (index, util, clock)
        # ECC and row remap: last time new evidence came in
        grow("ecc_ts", -1, np.int64)
        grow("remap_ts", -1, np.int64)
        # until when a finding that slows a GPU down (thermal, power cap, links...) held: it explains a straggler
        grow("explained_until", -1, np.int64)
        # first sample after a silence (a GPU back on the bus)
        grow("back_since", -1, np.int64)

    def _slots_of(self, b: InterpretedBatch) -> np.ndarray:
        out = np.empty(len(b), dtype=np.int64)
        for i, key in enumerate(zip(b.cluster, b.node, b.gpu_uuid, strict=True)):
            slot = self._slot.get(key)
            if slot is None:
                slot = self._new_slot(key, b.gpu_index[i], b.gpu_model[i])
            out[i] = slot
        return out

    def _new_slot(self, key: tuple[str, str, str], index: int, model: str) -> int:
        slot = len(self._uuid)
        if slot >= self._cap:
            self._alloc(self._cap * 2)
        self._slot[key] = slot
        cluster, node, uuid = key
        self._cluster.append(cluster)
        self._node.append(node)
        self._uuid.append(uuid)
        self._index.append(index)
        self._model.append(model)
        self._workload.append(None)
        self._group.append(None)
        node_key = (cluster, node)
        if node_key not in self._node_id:
            self._node_id[node_key] = len(self._node_id)
            self.node_latest = np.append(self.node_latest, -1)
        self.node_of[slot] = self._node_id[node_key]
        return slot

    # ----------------------------------------------------------------------------------------------- apply
    def apply(self, batch: InterpretedBatch, now_ns: int) -> tuple[InterpretedBatch, list[Finding]]:
        if not self.settings.enabled:
            return batch, []
        out: list[Finding] = []
        if len(batch):
            slots = self._slots_of(batch)
            self._refresh_context(batch, slots, out)
            self._samples(batch, slots, out)
        if batch.gpu_events:
            self._events(batch.gpu_events, out)
        self._post(out)
        if len(batch) and (self._episodes or self._node_episodes):
            batch = self._explain(batch)
        return batch, out

    def tick(self, now_ns: int) -> list[Finding]:
        """Time-based conclusions on data time: GPUs gone silent while their node reports, and repeats."""
        out: list[Finding] = []
        if self.settings.enabled and self._uuid:
            self._post(out)
        return out

    def _code(self, key: str) -> int:
        code = self._job_codes.get(key)
        if code is None:
            code = self._job_codes[key] = len(self._job_codes)
        return code

    def _codes_of(self, wl: Workload | None) -> tuple[int, int]:
        key = None if wl is None else (wl.job_id, wl.application)  # hashing two strings beats the whole record
        codes = self._wl_codes.get(key)
        if codes is None:
            job = "" if wl is None else wl.job_id or ""
            app = "" if wl is None else wl.application
            codes = self._wl_codes[key] = (self._code(f"job:{job}"), self._code(f"app:{app}"))
        return codes

    def _refresh_context(self, b: InterpretedBatch, slots: np.ndarray, out: list[Finding]) -> None:
        """Latest workload per GPU, job boundaries and topology-expected NVLinks.

        A *job* boundary is a change of job id (a context source said so); an *application* boundary also counts
        a change of the (possibly inferred) application, which can flicker, so only the power-cap rule uses it.
        """
        order = np.lexsort((b.ts_ns, slots))
        s, ts = slots[order], b.ts_ns[order]
        wls = [b.workload[i] for i in order.tolist()]
        codes = np.array([self._codes_of(wl) for wl in wls], dtype=np.int64).reshape(len(s), 2)
        first = np.r_[True, s[1:] != s[:-1]]
        prev = np.where(first[:, None], self.job_code[s], np.vstack([codes[:1], codes[:-1]]))
        changed = (prev >= 0) & (prev != codes)
        for col, target in ((0, self.boundary_ts), (1, self.app_boundary_ts)):
            rows = np.flatnonzero(changed[:, col] | (col == 1) & changed[:, 0])
            np.maximum.at(target, s[rows], ts[rows])
        last = np.r_[s[1:] != s[:-1], True]
        moved = last & ((self.job_code[s] != codes).any(axis=1) | changed.any(axis=1))
        self.job_code[s[last]] = codes[last]
        for i in np.flatnonzero(last).tolist():
            slot = int(s[i])
            self._workload[slot] = wls[i]
            if moved[i] or (self._group[slot] is None and wls[i] is not None):
                self._regroup(slot, int(ts[i]), out)
            elif (key := self._group[slot]) is not None:
                self._touched.add(key)
        # 0: no topology seen yet (asked again a minute of data later); -1: the topology says no NVLink
        now = int(ts[-1])
        fresh = np.unique(slots[self.expected_links[slots] == 0])
        for node_key in {(self._cluster[x], self._node[x]) for x in fresh.tolist()}:
            if now - self._topology_asked.get(node_key, -(2**62)) < 60 * _S:
                continue
            self._topology_asked[node_key] = now
            topo = self.topology_of(*node_key)
            if topo is None:
                continue
            for gpu in topo.gpus:
                known = self._slot.get((node_key[0], node_key[1], gpu.uuid))
                if known is not None:
                    self.expected_links[known] = gpu.nvlink_links if gpu.nvlink_links > 0 else -1

    def _job_starts(self, b: InterpretedBatch, order: np.ndarray, s: np.ndarray) -> np.ndarray:
        """Per row (sorted by slot, time), whether the GPU's compute processes changed to a new, non-empty set
        (other pids; without a process list, another process count above 0): a job start the telemetry shows by
        itself, with or without a context source. Processes going away are not: a job's end restores limits
        (accepted anyway) and its memory falls (which restarts the leak history by itself). Applied level by
        level, so a replay batch does not see a start before the row that shows it."""
        counts = b.metrics[order, METRIC_INDEX["process_count"]].tolist()
        sig = np.fromiter(
            (_process_signature(b.processes[i], c) for i, c in zip(order.tolist(), counts, strict=True)),
            dtype=np.int64,
            count=len(order),
        )
        first = np.r_[True, s[1:] != s[:-1]]
        prev = np.where(first, self.proc_sig[s], np.r_[_NO_PROCS, sig[:-1]])
        known = np.flatnonzero(sig != _NO_PROCS)
        last = known[np.r_[s[known][1:] != s[known][:-1], True]] if len(known) else known
        self.proc_sig[s[last]] = sig[last]
        return np.asarray((prev != _NO_PROCS) & (prev != sig) & ~np.isin(sig, _NO_WORK))

    def _regroup(self, slot: int, ts: int, out: list[Finding]) -> None:
        """Keep the GPU in the peer group of its current job (or none); a GPU that leaves its job is no longer
        that job's straggler (its finding clears with the job, not at the end of the next job)."""
        key = self._job_key(slot)
        old = self._group[slot]
        if key == old:
            if key is not None:
                self._touched.add(key)
            return
        self._group[slot] = key
        if old is not None and old in self._jobs:
            self._jobs[old].members.discard(slot)
        if self.active[slot, _D[STRAGGLER]]:
            self._transition(slot, STRAGGLER, False, ts, out)
        if key is not None:
            peers = self._jobs.get(key)
            if peers is None:
                peers = self._jobs[key] = _Peers([], set(), PeerState.empty(0, self.straggler_params))
            if slot not in peers.slots:
                peers.slots.append(slot)
                peers.state = _grown(peers.state, self.straggler_params)
            peers.members.add(slot)
            self._touched.add(key)

    def _samples(self, b: InterpretedBatch, slots: np.ndarray, out: list[Finding]) -> None:
        order = np.lexsort((b.ts_ns, slots))
        s, ts = slots[order], b.ts_ns[order]
        m, rel = b.metrics[order], b.relative[order]
        n = len(s)
        _links_from_samples(m, [b.links[i] for i in order.tolist()])
        first = np.r_[True, s[1:] != s[:-1]]
        start_idx = np.maximum.accumulate(np.where(first, np.arange(n), 0))
        rank = np.arange(n) - start_idx
        prev_ts = np.where(first, self.last_ts[s], np.r_[0, ts[:-1]])
        dt_s = np.where(prev_ts < 0, 1.0, np.clip((ts - prev_ts) / _S, 0.0, 60.0))

        allocated = np.array(
            [wl is not None and wl.job_id is not None and wl.application not in ("idle", "unknown")
             for wl in (b.workload[i] for i in order.tolist())],
            dtype=bool,
        )  # fmt: skip
        cond, seen = level_conditions(m, rel, allocated, self.expected_links[s])
        deltas = self._counter_deltas(s, first, m)

        job_start = self._job_starts(b, order, s)
        for k in range(int(rank.max()) + 1):
            rows = np.flatnonzero(rank == k)
            g = s[rows]
            started = rows[job_start[rows]]
            if len(started):
                np.maximum.at(self.boundary_ts, s[started], ts[started])
                np.maximum.at(self.app_boundary_ts, s[started], ts[started])
            # a finding started on this row describes this row, so it is the GPU's latest before any detector runs
            self.last_row[g] = m[rows]
            self.last_rel[g] = rel[rows]
            self._debounce(g, rows, ts, dt_s, cond, seen, out)
            self._power(g, ts[rows], m[rows], out)
            self._leak(g, ts[rows], m[rows], rel[rows], out)
            self._windows(g, ts[rows], m[rows], rel[rows])
            gap = (self.last_ts[g] >= 0) & (ts[rows] - self.last_ts[g] >= self.settings.lost_after_s * _S)
            self.back_since[g[gap]] = ts[rows][gap]
            self.last_ts[g] = ts[rows]
            self._memory_errors(g, ts[rows], m[rows], deltas[rows], out)
        np.maximum.at(self.node_latest, self.node_of[s], ts)
        self._stragglers(out)

    # ------------------------------------------------------------------------------------ level detectors
    def _debounce(
        self,
        g: np.ndarray,
        rows: np.ndarray,
        ts: np.ndarray,
        dt_s: np.ndarray,
        cond: np.ndarray,
        seen: np.ndarray,
        out: list[Finding],
    ) -> None:
        alpha = 1.0 - np.exp(-dt_s[rows, None] / _TAU_S[None, :])
        score = self.score[g]
        new = np.where(seen[rows], score + alpha * (cond[rows] - score), score)
        self.score[g] = new
        cols = [_D[name] for name in _DEBOUNCED]
        active = self.active[g][:, cols]
        starts = ~active & (new >= _ON)
        clears = active & (new <= _OFF)
        for r, c in zip(*np.nonzero(starts | clears), strict=True):
            name = _DEBOUNCED[c]
            self._transition(int(g[r]), name, bool(starts[r, c]), int(ts[rows[r]]), out)

    def _power(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, out: list[Finding]) -> None:
        """A power limit lowered below the one accepted for this job, away from a job boundary, is a fault.

        A limit seen from a GPU's first sample, or changed within ``job_boundary_s`` of a job starting or
        changing (a new job id in the context or new compute processes on the GPU; before or after: a prolog can
        set the limit before the job's process starts, and context can lag), is the operator's setting: it becomes
        the accepted limit and never a finding. A drop is confirmed after ``power_confirm_s``; it clears when the
        limit is back. Several GPUs of a node confirmed together make one node-level finding (_power_starts).
        """
        cfg = self.settings
        limit = _col(m, "power_limit_watts")
        ok = ~np.isnan(limit)
        g, ts, limit = g[ok], ts[ok], limit[ok]
        ref = self.ref_limit[g]
        ref = np.where(np.isnan(ref), limit, ref)
        boundary = self.app_boundary_ts[g]
        since = self.drop_since[g]
        active = self.active[g, _D[POWER]]
        pending = since >= 0
        dropped = limit < ref * 0.97
        window = cfg.job_boundary_s * _S
        setting = ~active & dropped & ((ts - boundary <= window) | (pending & (boundary >= since - window)))
        begin = ~active & dropped & ~setting & ~pending
        start = ~active & dropped & ~setting & pending & (ts - since >= cfg.power_confirm_s * _S)
        back = ~active & pending & ~dropped
        restored = active & (limit >= self.drop_from[g] * 0.97)
        ref = np.where(setting | restored | (~active & ~dropped & (limit > ref)), limit, ref)
        self.ref_limit[g] = ref
        self.drop_from[g[begin]] = ref[begin]
        self.drop_since[g] = np.where(begin, ts, np.where(setting | back | start, -1, since))
        if start.any():
            self._power_starts(g[start], ts[start], out)
        for i in np.flatnonzero(restored).tolist():
            slot, t = int(g[i]), int(ts[i])
            if self.power_by_node[slot]:
                self._power_leaves_node(slot, t, out)
            else:
                self._transition(slot, POWER, False, t, out)

    def _power_starts(self, g: np.ndarray, ts: np.ndarray, out: list[Finding]) -> None:
        """Confirmed lowered limits: one node-level finding when two or more GPUs of the node are lowered at once
        (confirmed together, or others still waiting for confirmation): one cause, one finding; else per GPU."""
        used = len(self._uuid)
        nodes = self.node_of[g]
        for node in dict.fromkeys(nodes.tolist()):
            mine, t = g[nodes == node], int(ts[nodes == node].min())
            key = (node, _D[POWER])
            if key not in self._node_episodes:
                peers = np.flatnonzero(self.node_of[:used] == node)
                others = peers[~np.isin(peers, mine)]
                lowered = (self.drop_since[others] >= 0) | (
                    self.active[others, _D[POWER]] & ~self.power_by_node[others]
                )
                if len(mine) == 1 and not lowered.any():
                    self._transition(int(mine[0]), POWER, True, t, out)
                    continue
            self.active[mine, _D[POWER]] = True
            self.power_by_node[mine] = True
            self.explained_until[mine] = np.iinfo(np.int64).max
            if key not in self._node_episodes:
                self._node_episodes[key] = _Episode(t, t, Severity.WARNING, "", "", {}, {})
                self._send_node(node, _D[POWER], True, t, out)

    def _power_leaves_node(self, slot: int, ts: int, out: list[Finding]) -> None:
        node = int(self.node_of[slot])
        self.active[slot, _D[POWER]] = False
        self.power_by_node[slot] = False
        self.explained_until[slot] = ts
        if not self.power_by_node[: len(self._uuid)][self.node_of[: len(self._uuid)] == node].any():
            self._send_node(node, _D[POWER], False, ts, out)
            del self._node_episodes[(node, _D[POWER])]

    def _leak(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, rel: np.ndarray, out: list[Finding]) -> None:
        """Memory that keeps growing at the same pace, by two routes (docs/detectors.md gives the numbers):

        - *slow*: per-minute means, the growth of the last 4 minutes against the 4 before (a cache filling towards
          a plateau decelerates; a leak does not), held for ``leak_confirm_s``;
        - *fast*: 10-s means on a straight line for 2 minutes, not slowing down, full within ``leak_fast_full_s``
          (at that pace the process runs out of memory before the slow route could confirm).
        """
        y = rel[:, _REL["memory_used_ratio"]]
        ok = ~np.isnan(y)
        g, ts, y, m = g[ok], ts[ok], y[ok], m[ok]
        if not len(g):
            return
        # a job change or an OOM restart (memory falls well below its peak) starts a new history
        reset = (self.boundary_ts[g] > self.leak_origin[g]) | (y < self.leak_peak[g] - 0.1)
        self.leak_origin[g] = np.where(reset | (self.leak_origin[g] < 0), ts, self.leak_origin[g])
        self.mem_ring[g[reset]] = np.nan
        self.mem_acc[g[reset]] = 0.0
        self.fast_ring[g[reset]] = np.nan
        self.fast_acc[g[reset]] = 0.0
        self.leak_since[g[reset]] = -1
        self.leak_peak[g] = np.where(reset, y, np.maximum(self.leak_peak[g], y))
        rolled = self._accumulate(self.mem_ring, self.mem_acc, self.mem_minute, g, ts // (60 * _S), y, reset)
        fast = self._accumulate(
            self.fast_ring, self.fast_acc, self.fast_bucket, g, ts // (_FAST_BUCKET_S * _S), y, reset
        )
        active = self.active[g, _D[LEAK]]
        clear = active & reset
        start = np.zeros(len(g), dtype=bool)
        rate = np.full(len(g), np.nan)  # growth per minute, of the route that found it
        since = np.full(len(g), -1, dtype=np.int64)  # when the growth it saw began
        if rolled.any():
            r = self.mem_ring[g[rolled]]
            recent, before = r[:, 8] - r[:, 4], r[:, 4] - r[:, 0]
            floor = 4 * _LEAK_MIN_SLOPE * 60
            # the last minute of 10-s means still grew: a fast leak found early keeps its finding
            last_minute = self.fast_ring[g[rolled]]
            with np.errstate(invalid="ignore"):
                steady = (np.diff(r[:, 4:], axis=1) > -0.005).all(axis=1)
                growing = (recent >= floor) & (before >= floor) & (recent >= 0.8 * before) & steady & (r[:, 8] >= 0.15)
                still = growing | (last_minute[:, -1] - last_minute[:, -7] >= floor / 4)
            rg, rts = g[rolled], ts[rolled]
            leak_since = self.leak_since[rg]
            self.leak_since[rg] = np.where(growing, np.where(leak_since < 0, rts, leak_since), -1)
            false_since = self.leak_false_since[rg]
            self.leak_false_since[rg] = np.where(still, -1, np.where(false_since < 0, rts, false_since))
            self.leak_rate[rg] = recent / 4
            confirmed = growing & (rts - self.leak_since[rg] >= self.settings.leak_confirm_s * _S)
            stopped = ~still & (rts - self.leak_false_since[rg] >= 120 * _S)
            idx = np.flatnonzero(rolled)
            start[idx] = confirmed
            rate[idx] = recent / 4
            # the trend needs 8 minutes of growth before it holds
            since[idx] = self.leak_since[rg] - 8 * 60 * _S
            clear[idx] |= stopped & active[rolled]
        if fast.any():
            fg = fast
            hit, slope, _to_full = fast_leak(
                self.fast_ring[g[fg]], _usable_ratio(m[fg]), _FAST_MIN_SLOPE, self.settings.leak_fast_full_s
            )
            window_start = ts[fg] - (_FAST_RING + 1) * _FAST_BUCKET_S * _S
            hit &= window_start - self.leak_origin[g[fg]] >= _FAST_STARTUP_S * _S
            idx = np.flatnonzero(fg)[hit]
            start[idx] = True
            rate[idx] = slope[hit] * 60
            since[idx] = window_start[hit]
        start &= ~active
        for i in np.flatnonzero(start | clear).tolist():
            slot = int(g[i])
            detail = {"slope_per_min": float(rate[i]), "growing_since_ns": float(since[i])} if start[i] else {}
            self._transition(slot, LEAK, bool(start[i]), int(ts[i]), out, detail)

    @staticmethod
    def _accumulate(
        ring: np.ndarray,
        acc: np.ndarray,
        period: np.ndarray,
        g: np.ndarray,
        now: np.ndarray,
        y: np.ndarray,
        reset: np.ndarray,
    ) -> np.ndarray:
        """Add ``y`` to each GPU's sum for its current period (a minute, 10 s); a GPU entering a new period first
        closes its previous one into ``ring`` (missing periods as NaN). Returns which rows closed a period."""
        rolled = (period[g] >= 0) & (now > period[g]) & ~reset
        if rolled.any():
            rg = g[rolled]
            with np.errstate(invalid="ignore", divide="ignore"):
                mean = acc[rg, 0] / acc[rg, 1]
            size = ring.shape[1]
            steps = np.clip(now[rolled] - period[rg], 1, size)
            window = ring[rg]
            for k in np.unique(steps).tolist():
                rows = steps == k
                shifted = np.full((int(rows.sum()), size), np.nan)
                keep = size - k
                shifted[:, :keep] = window[rows, k:]
                shifted[:, keep] = mean[rows]
                window[rows] = shifted
            ring[rg] = window
            acc[rg] = 0.0
        period[g] = now
        acc[g] += np.column_stack([y, np.ones_like(y)])
        return np.asarray(rolled)

    def _counter_deltas(self, s: np.ndarray, first: np.ndarray, m: np.ndarray) -> np.ndarray:
        """Per row, how much each error counter rose since the GPU's previous sample (0 on a reset or a gap)."""
        cols = [METRIC_INDEX[name] for name in _COUNTERS]
        values = m[:, cols]
        prev = np.where(first[:, None], self.counters[s], np.vstack([np.full((1, len(cols)), np.nan), values[:-1]]))
        with np.errstate(invalid="ignore"):
            delta = np.where(np.isnan(prev) | np.isnan(values), 0.0, np.maximum(values - prev, 0.0))
        # remember the newest value of each counter per GPU (rows are sorted by slot, then time)
        last = np.r_[s[1:] != s[:-1], True]
        known = ~np.isnan(values[last])
        current = self.counters[s[last]]
        self.counters[s[last]] = np.where(known, values[last], current)
        return np.asarray(delta)

    def _memory_errors(
        self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, deltas: np.ndarray, out: list[Finding]
    ) -> None:
        uncorrectable = (
            (deltas[:, _C["ecc_uncorrected_total"]] > 0)
            | (deltas[:, _C["row_remap_uncorrectable_total"]] > 0)
            | (deltas[:, _C["retired_pages_dbe_total"]] > 0)
            | (_col(m, "row_remap_failure") == 1)
        )
        pending = (_col(m, "row_remap_pending") == 1) | (_col(m, "retired_pages_pending") == 1)
        remapped = pending | (deltas[:, _C["row_remap_correctable_total"]] > 0)
        for i in np.flatnonzero(uncorrectable).tolist():
            self._memory_evidence(int(g[i]), int(ts[i]), ECC, {"ecc_uncorrected_delta": float(deltas[i, 0])}, out)
        for i in np.flatnonzero(remapped & ~uncorrectable).tolist():
            self._memory_evidence(int(g[i]), int(ts[i]), REMAP, {}, out)

    def _memory_evidence(self, slot: int, ts: int, name: str, detail: dict[str, float], out: list[Finding]) -> None:
        if name == ECC:
            self.ecc_ts[slot] = ts
            if self.active[slot, _D[REMAP]]:
                self._transition(slot, REMAP, False, ts, out)
        else:
            self.remap_ts[slot] = ts
            if self.active[slot, _D[ECC]]:
                return  # the remap is part of the uncorrectable error already reported
        if not self.active[slot, _D[name]]:
            self._transition(slot, name, True, ts, out, detail)
        else:
            episode = self._episodes[(slot, _D[name])]
            for key, value in detail.items():
                episode.detail[key] = episode.detail.get(key, 0.0) + value

    # ------------------------------------------------------------------------------------------ stragglers
    def _windows(self, g: np.ndarray, ts: np.ndarray, m: np.ndarray, rel: np.ndarray) -> None:
        """Per-GPU sums for the current straggler window; a GPU entering a new window closes its previous one."""
        win_ns = int(self.settings.straggler_window_s * _S)
        idx = ts // win_ns
        moved = (self.win_idx[g] >= 0) & (idx > self.win_idx[g])
        if moved.any():
            mg = g[moved]
            sums = self.win_sums[mg]
            with np.errstate(invalid="ignore", divide="ignore"):
                util = sums[:, 0] / sums[:, 1]
                clock = sums[:, 2] / sums[:, 3]
            ring = np.roll(self.win_done[mg], -1, axis=1)
            ring[:, -1] = np.column_stack([self.win_idx[mg], util, clock])
            self.win_done[mg] = ring
            self.win_sums[mg] = 0.0
        self.win_idx[g] = idx
        util = _col(m, "utilization_gpu_percent")
        clock = rel[:, _REL["sm_clock_ratio_of_max"]]
        busy = _gt(util, _BUSY_UTIL) & ~np.isnan(clock)
        self.win_sums[g] += np.column_stack([
            np.nan_to_num(util), ~np.isnan(util), np.where(busy, clock, 0.0), busy
        ])  # fmt: skip

    def _job_key(self, slot: int) -> str | None:
        wl = self._workload[slot]
        # peers are the GPUs of one job, which only a context source knows: GPUs of a node running the same
        # (inferred) application are as often independent replicas or renders, each at its own pace (in the
        # evaluation every straggler found on such a guess was a false alarm)
        if wl is None or wl.job_id is None or wl.application in ("idle", "unknown"):
            return None
        if wl.job_gpus is not None and wl.job_gpus < 2:
            return None
        # job ids are unique within one cluster (a scheduler's own sequence), not across clusters
        return f"job:{self._cluster[slot]}/{wl.job_id}"

    def _stragglers(self, out: list[Finding]) -> None:
        """Judge the jobs seen in this batch, window by window: a window once every live GPU of the job is past it.

        A GPU more than 4 windows behind the job's newest (silent, or its partition lagging in a replay) does not
        hold the others back; its value is simply missing from the windows it has not completed.
        """
        for key in sorted(self._touched):
            peers = self._jobs[key]
            if not peers.members:
                continue
            idx = self.win_idx[list(peers.members)]
            newest = int(idx.max())
            ready = int(idx[idx >= newest - 4].min()) - 1
            for k in range(max(peers.evaluated + 1, newest - _RING + 1), ready + 1):
                self._judge(peers, k, out)
                peers.evaluated = k
        self._touched.clear()

    def _judge(self, peers: _Peers, k: int, out: list[Finding]) -> None:
        slots = np.array(peers.slots)
        ring = self.win_done[slots]
        hit = ring[:, :, 0] == k
        found = hit.any(axis=1)
        util = np.where(found, np.where(hit, ring[:, :, 1], 0.0).sum(axis=1), np.nan)
        clock = np.where(found, np.where(hit, ring[:, :, 2], 0.0).sum(axis=1), np.nan)
        util[[s not in peers.members for s in peers.slots]] = np.nan
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            # a window where no peer was busy has an all-NaN median: it is simply not judged
            warnings.simplefilter("ignore", RuntimeWarning)
            # step-time proxy: slower clocks, and a duty cycle below the job's, both stretch a step
            duty = np.minimum(1.0, util / np.nanmedian(util))
            step = 1.0 / (clock * duty)
        step[~np.isfinite(step)] = np.nan
        if np.count_nonzero(~np.isnan(step)) == 2:
            # two GPUs wait for each other, so their duty cycles cannot say which one is slow: the clock can
            with np.errstate(divide="ignore"):
                step = np.where(np.isnan(step), np.nan, 1.0 / clock)
        peers.state, verdict = peer_step(peers.state, step, self.straggler_params)
        if not verdict.judged:
            return
        win_ns = int(self.settings.straggler_window_s * _S)
        ts = (k + 1) * win_ns
        slots_now = np.asarray(peers.slots)
        was_all = self.active[slots_now, _D[STRAGGLER]]
        # only GPUs flagged now or before need a decision (most windows: none)
        for i in np.flatnonzero(verdict.active | was_all).tolist():
            slot = peers.slots[i]
            now, was = bool(verdict.active[i]), bool(was_all[i])
            # the history behind the verdict reaches `persist` windows back: a cause active in it explains it
            # (a lowered power limit still waiting for its confirmation explains it too)
            explained = (
                self.explained_until[slot] >= ts - self.straggler_params.persist * win_ns or self.drop_since[slot] >= 0
            )
            detail = {
                "slower_than_median": float(verdict.rel[i]),
                "robust_z": float(verdict.z[i]),
                "median_slower": float(verdict.median_rel[i]),
                "peers": float(np.count_nonzero(~np.isnan(step))),
                "window_s": self.settings.straggler_window_s,
            }
            if now and not was and not explained:
                self._transition(slot, STRAGGLER, True, ts, out, detail)
            elif was and (not now or explained):
                self._transition(slot, STRAGGLER, False, ts, out, detail)
            elif was:
                self._episodes[(slot, _D[STRAGGLER])].detail.update(detail)

    # ---------------------------------------------------------------------------------------------- events
    def _events(self, events: tuple[GpuEvent, ...], out: list[Finding]) -> None:
        cfg = self.settings
        for e in sorted(events, key=lambda ev: ev.ts_ns):
            slot = self._slot.get((e.cluster, e.node, e.gpu_uuid))
            if slot is None:
                slot = self._new_slot((e.cluster, e.node, e.gpu_uuid), e.gpu_index, "")
            np.maximum.at(self.node_latest, [self.node_of[slot]], [e.ts_ns])
            if e.kind is EventKind.GPU_LOST or (e.kind is EventKind.XID and e.code in LOST):
                if not self.active[slot, _D[LOST_BUS]]:
                    self._transition(slot, LOST_BUS, True, e.ts_ns, out, {"xid": float(e.code), "event": 1.0})
                continue
            if e.kind is EventKind.ECC_DOUBLE_BIT or (e.kind is EventKind.XID and self._ecc_xid(slot, e)):
                self._memory_evidence(slot, e.ts_ns, ECC, {"xid": float(e.code)}, out)
                continue
            if e.kind is EventKind.ROW_REMAP or (
                e.kind is EventKind.XID and describe(e.code).memory and e.code != _CONTAINED_ECC
            ):
                self._memory_evidence(slot, e.ts_ns, REMAP, {"xid": float(e.code)}, out)
                continue
            if e.kind is not EventKind.XID:
                continue
            window = self._xids.setdefault(slot, deque())
            window.append((e.ts_ns, e.code))
            while window and window[0][0] < e.ts_ns - cfg.storm_window_s * _S:
                window.popleft()
            if len(window) >= cfg.storm_count and not self.active[slot, _D[STORM]]:
                if self.active[slot, _D[XID]]:
                    self._transition(slot, XID, False, e.ts_ns, out)
                self._transition(slot, STORM, True, e.ts_ns, out, {"xid": float(e.code)})
            elif not self.active[slot, _D[STORM]] and not self.active[slot, _D[XID]]:
                self._transition(slot, XID, True, e.ts_ns, out, {"xid": float(e.code)})
            else:
                name = STORM if self.active[slot, _D[STORM]] else XID
                self._episodes[(slot, _D[name])].detail["xid"] = float(e.code)

    def _ecc_xid(self, slot: int, e: GpuEvent) -> bool:
        """Whether an XID reports an uncorrectable memory error. 94 (contained ECC error) also shows up in storms
        of application errors, so it counts as memory evidence only when the GPU's ECC counters rose within 2
        minutes or an ECC finding is open; alone it is one more XID."""
        if e.code not in UNCORRECTABLE:
            return False
        if e.code != _CONTAINED_ECC:
            return True
        return bool(self.active[slot, _D[ECC]]) or abs(e.ts_ns - int(self.ecc_ts[slot])) <= 120 * _S

    # -------------------------------------------------------------------------- clears, silence and repeats
    def _post(self, out: list[Finding]) -> None:
        cfg = self.settings
        used = len(self._uuid)
        if not used:
            return
        node_now = self.node_latest[self.node_of[:used]]
        now = np.maximum(self.last_ts[:used], node_now)
        # a GPU silent while its node still reports has fallen off the bus; it is back once it reports for 30 s
        silent = (self.last_ts[:used] >= 0) & (node_now - self.last_ts[:used] >= cfg.lost_after_s * _S)
        lost = self.active[:used, _D[LOST_BUS]]
        lost_after = int(cfg.lost_after_s * _S)
        for slot in np.flatnonzero(silent & ~lost).tolist():
            # dated when the silence became evident, whatever the batching: a replay finds the same time
            self._transition(slot, LOST_BUS, True, int(self.last_ts[slot]) + lost_after, out)
        for slot in np.flatnonzero(lost & ~silent).tolist():
            back = max(int(self.back_since[slot]), self._episodes[(slot, _D[LOST_BUS])].since_ns)
            if self.last_ts[slot] - back >= 30 * _S:
                self._transition(slot, LOST_BUS, False, back + 30 * _S, out)
        for (slot, d), episode in list(self._episodes.items()):
            name = DETECTORS[d]
            t = int(now[slot])
            quiet_since = {
                STORM: self._xids[slot][-1][0] if self._xids.get(slot) else episode.since_ns,
                XID: self._xids[slot][-1][0] if self._xids.get(slot) else episode.since_ns,
                ECC: int(self.ecc_ts[slot]),
                REMAP: int(self.remap_ts[slot]),
            }.get(name)
            quiet_for = {STORM: cfg.storm_window_s, XID: cfg.storm_window_s, ECC: 600.0, REMAP: 600.0}.get(name, 0.0)
            # a remap waiting for a reset keeps a memory finding open: the GPU still needs that reset
            pending = (self.last_row[slot, METRIC_INDEX["row_remap_pending"]] == 1) and name in (ECC, REMAP)
            if quiet_since is not None and t - quiet_since >= quiet_for * _S and not pending:
                self._transition(slot, name, False, t, out)
            elif t - episode.last_sent_ns >= cfg.repeat_s * _S:
                self._send(slot, d, True, t, out)
        for (node, d), episode in list(self._node_episodes.items()):
            t = int(self.node_latest[node])
            if t - episode.last_sent_ns >= cfg.repeat_s * _S:
                self._send_node(node, d, True, t, out)

    # ----------------------------------------------------------------------------------------- findings
    def _transition(
        self, slot: int, name: str, start: bool, ts: int, out: list[Finding], detail: dict[str, float] | None = None
    ) -> None:
        d = _D[name]
        if name in _EXPLAINS_SLOWNESS:
            self.explained_until[slot] = np.iinfo(np.int64).max if start else ts
        if start:
            self.active[slot, d] = True
            self._episodes[(slot, d)] = _Episode(ts, ts, Severity.WARNING, "", "", {}, dict(detail or {}))
            self._send(slot, d, True, ts, out)
        elif self.active[slot, d]:
            episode = self._episodes[(slot, d)]
            episode.detail.update(detail or {})
            self._send(slot, d, False, ts, out)
            self.active[slot, d] = False
            del self._episodes[(slot, d)]

    def _send(self, slot: int, d: int, active: bool, ts: int, out: list[Finding]) -> None:
        episode = self._episodes[(slot, d)]
        severity, summary, action, evidence = self._describe(slot, DETECTORS[d], episode, ts)
        if active:
            episode.severity, episode.summary, episode.action, episode.evidence = severity, summary, action, evidence
        else:
            summary = f"cleared: {summary}"
        episode.last_sent_ns = ts
        out.append(
            Finding(
                DETECTORS[d], severity, active, self._cluster[slot], self._node[slot], self._uuid[slot],
                self._model[slot], ts, episode.since_ns, summary, action, evidence, self._workload[slot],
                self._index[slot],
            )
        )  # fmt: skip

    def _send_node(self, node: int, d: int, active: bool, ts: int, out: list[Finding]) -> None:
        """Send a node-level finding (``gpu_uuid`` None); a clear repeats the last description."""
        episode = self._node_episodes[(node, d)]
        slots = np.flatnonzero(self.node_of[: len(self._uuid)] == node)
        first = int(slots[0])
        if active:
            # GPUs whose lowered limit is still being confirmed are named too: the same cause lowered them
            lowered = self.power_by_node[slots] | (self.drop_since[slots] >= 0)
            severity, what, action, evidence = _power_node(self, slots, slots[lowered])
            evidence = {k: v for k, v in evidence.items() if v == v}  # noqa: PLR0124
            episode.severity, episode.summary, episode.action = severity, f"{self._node[first]}: {what}", action
            episode.evidence = evidence
        summary = episode.summary if active else f"cleared: {episode.summary}"
        episode.last_sent_ns = ts
        models = {self._model[s] for s in slots.tolist()}
        out.append(
            Finding(
                DETECTORS[d], episode.severity, active, self._cluster[first], self._node[first], None,
                models.pop() if len(models) == 1 else "", ts, episode.since_ns, summary, episode.action,
                episode.evidence,
            )
        )  # fmt: skip

    def _explain(self, b: InterpretedBatch) -> InterpretedBatch:
        """Append the summary of every finding active on a row's GPU (from its start on) to its explanation."""
        by_slot: dict[int, list[_Episode]] = {}
        for (slot, _d), episode in self._episodes.items():
            by_slot.setdefault(slot, []).append(episode)
        for slot in np.flatnonzero(self.power_by_node[: len(self._uuid)]).tolist():
            by_slot.setdefault(slot, []).append(self._node_episodes[(int(self.node_of[slot]), _D[POWER])])
        explanation = list(b.explanation)
        changed = False
        for i, key in enumerate(zip(b.cluster, b.node, b.gpu_uuid, strict=True)):
            episodes = by_slot.get(self._slot[key])
            if not episodes:
                continue
            text = "; ".join(e.summary for e in episodes if e.since_ns <= b.ts_ns[i] and e.summary)
            if text:
                explanation[i] = f"{explanation[i]} | {text}" if explanation[i] else text
                changed = True
        if not changed:
            return b
        return replace(b, explanation=tuple(explanation))

    # ----------------------------------------------------------------------------------------- wording
    def _who(self, slot: int) -> str:
        wl = self._workload[slot]
        gpu = f"GPU {self._index[slot]} ({self._model[slot] or 'unknown model'}) on {self._node[slot]}"
        if wl is None:
            return gpu
        if wl.job_id:
            return f"{gpu}, job {wl.job_id} ({wl.application})"
        return f"{gpu}, {wl.application}" + (" (inferred)" if wl.source == "inferred" else "")

    def _describe(self, slot: int, name: str, ep: _Episode, ts: int) -> tuple[Severity, str, str, dict[str, float]]:
        row = {n: float(v) for n, v in zip(METRIC_NAMES, self.last_row[slot].tolist(), strict=True) if v == v}  # noqa: PLR0124
        rel = {n: float(v) for n, v in zip(RELATIVE_FIELDS, self.last_rel[slot].tolist(), strict=True) if v == v}  # noqa: PLR0124
        who = self._who(slot)
        describe_fn = _WORDING[name]
        severity, what, action, evidence = describe_fn(self, slot, row, rel, ep, ts)
        evidence = {k: v for k, v in evidence.items() if v == v}  # noqa: PLR0124
        return severity, f"{who}: {what}", action, evidence


def _grown(state: PeerState, params: StragglerParams) -> PeerState:
    """The job's history with one more worker (a GPU that joined), whose history starts empty."""
    extra = PeerState.empty(1, params)
    return PeerState(
        np.vstack([state.rel, extra.rel]),
        np.vstack([state.z, extra.z]),
        np.r_[state.acute_run, extra.acute_run],
        np.r_[state.quiet, extra.quiet],
        np.r_[state.active, extra.active],
        state.windows,
    )


# ----------------------------------------------------------------------------------------------- wording
Wording = Callable[
    [Detectors, int, dict[str, float], dict[str, float], _Episode, int], tuple[Severity, str, str, dict[str, float]]
]


def _thermal(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    temp, slowdown = row.get("temperature_gpu_celsius", nan), row.get("temperature_slowdown_celsius", nan)
    shutdown = row.get("temperature_shutdown_celsius", nan)
    clock = rel.get("sm_clock_ratio_of_max", nan)
    mask = int(row.get("throttle_reasons_mask", 0))
    why = "HW thermal slowdown" if mask & (HW_THERMAL | HW_SLOWDOWN) else "SW thermal slowdown" if mask else "heat"
    severity = Severity.CRITICAL if temp >= shutdown - 3 else Severity.WARNING
    what = (
        f"thermal throttling: SM clock at {_fmt(clock * 100, '%')} of max by {why} at {_fmt(temp, ' C')} "
        f"(slowdown {_fmt(slowdown, ' C')}), power {_fmt(rel.get('power_ratio_of_limit', nan) * 100, '%')} of limit, "
        f"util {_fmt(row.get('utilization_gpu_percent', nan), '%')}"
    )
    fan = row.get("fan_speed_percent")
    action = (
        f"check cooling and fans ({f'fan {fan:.0f}%, ' if fan is not None else ''}inlet air, airflow); clocks held "
        f"at {_fmt(clock * 100, '%')} by {why} at {_fmt(temp, ' C')}"
    )
    evidence = {
        "temperature_c": temp,
        "slowdown_c": slowdown,
        "sm_clock_ratio": clock,
        "power_ratio": rel.get("power_ratio_of_limit", nan),
        "utilization_percent": row.get("utilization_gpu_percent", nan),
        "throttle_reasons_mask": float(mask),
    }
    return severity, what, action, evidence


def _power(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    limit, before = row.get("power_limit_watts", nan), float(det.drop_from[slot])
    default = row.get("power_default_limit_watts", nan)
    capped = bool(int(row.get("throttle_reasons_mask", 0)) & SW_POWER_CAP)
    what = (
        f"power limit lowered to {_fmt(limit, ' W')} from {_fmt(before, ' W')} mid-job (default {_fmt(default, ' W')})"
        f"{', clocks held by the SW power cap' if capped else ''}: SM clock "
        f"{_fmt(rel.get('sm_clock_ratio_of_max', nan) * 100, '%')}"
        f" of max, drawing {_fmt(row.get('power_watts', nan), ' W')}"
    )
    action = (
        "find who lowered the power limit (nvidia-smi -pl, a power-capping policy, the rack's power budget) "
        "and restore it"
    )
    busy = row.get("utilization_gpu_percent", 0.0) > _BUSY_UTIL
    return (
        (Severity.WARNING if busy else Severity.INFO),
        what,
        action,
        {
            "power_limit_w": limit,
            "previous_limit_w": before,
            "default_limit_w": default,
            "power_w": row.get("power_watts", nan),
            "sm_clock_ratio": rel.get("sm_clock_ratio_of_max", nan),
            "sw_power_cap": float(capped),
        },
    )


def _power_node(det: Detectors, slots: np.ndarray, members: np.ndarray) -> tuple[Severity, str, str, dict[str, float]]:
    """A node's GPUs whose limits were lowered together (``members`` of the node's ``slots``)."""
    rows = det.last_row[members]
    limit = _col(rows, "power_limit_watts")
    default = _col(rows, "power_default_limit_watts")
    before = det.drop_from[members]
    busy = _gt(_col(rows, "utilization_gpu_percent"), _BUSY_UTIL)
    capped = busy & _bits(_col(rows, "throttle_reasons_mask"), SW_POWER_CAP)
    clock = det.last_rel[members, _REL["sm_clock_ratio_of_max"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: shown as "?"
        lo, hi = float(np.nanmin(limit)), float(np.nanmax(limit))
        share = float(np.nanmedian(limit / default))
        was = float(np.nanmedian(before))
        busy_clock = float(np.nanmedian(clock[busy])) if busy.any() else math.nan
    indexes = ", ".join(str(det._index[s]) for s in members.tolist())
    watts = _fmt(lo, " W") if hi - lo < 1 else f"{_fmt(lo)}-{_fmt(hi, ' W')}"
    what = (
        f"power capping on {len(members)} of {len(slots)} GPUs at once (GPU {indexes}): limit lowered mid-job to "
        f"{watts} from {_fmt(was, ' W')} ({_fmt(share * 100, '%')} of default)"
        + (f"; {int(capped.sum())} busy GPUs held by the SW power cap, SM clock {_fmt(busy_clock * 100, '%')} of max"
           if capped.any() else "")
    )  # fmt: skip
    action = (
        "one cause for the node: check its power supplies (BMC / ipmitool sdr: a failed or degraded PSU), the PDU "
        "or rack power budget, or a node-wide power policy; restore the limits once it is fixed"
    )
    return (
        (Severity.WARNING if busy.any() else Severity.INFO),
        what,
        action,
        {
            "gpus_capped": float(len(members)),
            "gpus_on_node": float(len(slots)),
            "busy_gpus_capped": float(capped.sum()),
            "power_limit_w": lo,
            "previous_limit_w": was,
            "limit_ratio_of_default": share,
            "sm_clock_ratio": busy_clock,
        },
    )


def _nvlink(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    active = row.get("nvlink_links_active", nan)
    expected = float(det.expected_links[slot]) or row.get("nvlink_links_max", nan)
    pcie = row.get("pcie_tx_bytes_per_second", nan) + row.get("pcie_rx_bytes_per_second", nan)
    nvl = row.get("nvlink_tx_bytes_per_second", nan) + row.get("nvlink_rx_bytes_per_second", nan)
    peers = _nvlink_peers(det, slot)
    crc = float(det.counters[slot, _C["nvlink_crc_errors_total"]])
    recovery = float(det.counters[slot, _C["nvlink_recovery_errors_total"]])
    what = (
        f"NVLink down: {_fmt(active)} of {_fmt(expected)} links active, NVLink {_fmt(nvl / 1e9, ' GB/s', 1)}, "
        f"PCIe {_fmt(pcie / 1e9, ' GB/s', 1)}{peers} (CRC errors {_fmt(crc)}, recoveries {_fmt(recovery)})"
    )
    action = (
        "drain the GPU's jobs, reset the GPU; if links stay down check the NVLink bridge / NVSwitch tray and "
        "report to support"
    )
    return (
        Severity.CRITICAL,
        what,
        action,
        {
            "links_active": active,
            "links_expected": expected,
            "nvlink_bytes_per_second": nvl,
            "pcie_bytes_per_second": pcie,
            "nvlink_crc_errors_total": crc,
            "nvlink_recovery_errors_total": recovery,
        },
    )


def _nvlink_peers(det: Detectors, slot: int) -> str:
    """Which peers lost their NVLink path to this GPU and what their traffic crosses now (from the topology)."""
    topo = det.topology_of(det._cluster[slot], det._node[slot])
    if topo is None:
        return ""
    me = next((g for g in topo.gpus if g.uuid == det._uuid[slot]), None)
    if me is None:
        return ""
    paths: list[str] = []
    for link in topo.links:
        if det._uuid[slot] not in (link.a, link.b) or not link.kind.startswith("NV"):
            continue
        other_uuid = link.b if link.a == det._uuid[slot] else link.a
        other = next((g for g in topo.gpus if g.uuid == other_uuid), None)
        if other is None:
            continue
        pcie_kind = next(
            (x.kind for x in topo.links if {x.a, x.b} == {me.uuid, other.uuid} and not x.kind.startswith("NV")),
            None,
        )
        if pcie_kind is None:
            same_numa = me.numa_node is not None and me.numa_node == other.numa_node
            pcie_kind = "NODE" if same_numa else "SYS" if me.numa_node is not None else "PCIe"
        paths.append(f"GPU {other.index} ({pcie_kind})")
    if not paths:
        return ""
    return "; traffic to " + ", ".join(paths) + " now crosses PCIe"


def _pcie(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    gen, gen_max = row.get("pcie_link_gen", nan), row.get("pcie_link_gen_max", nan)
    width, width_max = row.get("pcie_link_width", nan), row.get("pcie_link_width_max", nan)
    share = (2 ** (gen - gen_max)) * width / width_max
    replay = float(det.counters[slot, _C["pcie_replay_total"]])
    what = (
        f"PCIe link trained at Gen{_fmt(gen)} x{_fmt(width)} of Gen{_fmt(gen_max)} x{_fmt(width_max)} while busy "
        f"({_fmt(share * 100, '%')} of its bandwidth), replay counter {_fmt(replay)}"
    )
    action = "reseat the GPU and check the riser/slot and its retimer; a link that keeps retraining low needs service"
    return Severity.WARNING, what, action, {
        "pcie_gen": gen, "pcie_gen_max": gen_max, "pcie_width": width, "pcie_width_max": width_max,
        "bandwidth_share": share, "pcie_replay_total": replay,
        "utilization_percent": row.get("utilization_gpu_percent", nan),
    }  # fmt: skip


def _leak(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    used = rel.get("memory_used_ratio", nan)
    total = row.get("memory_total_bytes", nan)
    full = 1.0 - row.get("memory_reserved_bytes", 0.0) / total if total > 0 else 1.0
    slope = ep.detail.get("slope_per_min", nan)
    minutes_left = max(full - used, 0.0) / slope if slope > 0 else nan
    grown_for = (ts - ep.detail.get("growing_since_ns", ts)) / _S / 60
    what = (
        f"memory leak: memory used grows {_fmt(slope * 100, '%', 2)} of {_fmt(total / 2**30, ' GiB')} per minute "
        f"({_fmt(slope * total / 60 / 2**20, ' MiB/s', 1)}), steadily for {_fmt(grown_for, ' min', 1)}, now "
        f"{_fmt(used * 100, '%')}; full in ~{_fmt(minutes_left, ' min', 1)}"
    )
    action = (
        "tell the job's owner: the process keeps allocating without freeing (caches, tensors kept alive); "
        "it will hit OOM"
    )
    severity = Severity.CRITICAL if minutes_left < 15 else Severity.WARNING
    return severity, what, action, {
        "memory_used_ratio": used, "growth_per_min": slope, "minutes_to_full": minutes_left, "growing_min": grown_for,
    }  # fmt: skip


def _straggler(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    d = ep.detail
    than = (
        "its one peer per step (a 2-GPU job: judged by its SM clock)"
        if d.get("peers") == 2
        else f"the median of its {_fmt(d.get('peers', nan))} peers per step (robust z "
        f"{_fmt(d.get('robust_z', nan), '', 1)})"
    )
    what = (
        f"straggler: {_fmt(d.get('slower_than_median', nan) * 100, '%')} slower than {than}, SM clock "
        f"{_fmt(rel.get('sm_clock_ratio_of_max', nan) * 100, '%')} of max, util "
        f"{_fmt(row.get('utilization_gpu_percent', nan), '%')}"
    )
    action = "the whole job runs at this GPU's pace: check its clocks, cooling and PCIe/NVLink, or move the rank off it"
    return Severity.WARNING, what, action, {
        "slower_than_median": d.get("slower_than_median", nan), "median_slower": d.get("median_slower", nan),
        "robust_z": d.get("robust_z", nan),
        "peers": d.get("peers", nan), "sm_clock_ratio": rel.get("sm_clock_ratio_of_max", nan),
        "utilization_percent": row.get("utilization_gpu_percent", nan),
    }  # fmt: skip


def _xid_words(
    det: Detectors, slot: int, storm: bool, ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    recent = det._xids.get(slot, deque())
    window = det.settings.storm_window_s
    count = sum(1 for t, _ in recent if t >= ts - window * _S)
    codes = sorted({c for t, c in recent if t >= ts - window * _S})
    last = describe(int(ep.detail.get("xid", codes[-1] if codes else 0)))
    if storm:
        kinds = ", ".join(f"{c} ({describe(c).meaning})" for c in codes[:5])
        hardware = any(describe(c).cause != "app" for c in codes)
        what = f"XID storm: {count} XIDs in {window / 60:.0f} min: {kinds}"
        action = (
            "drain the GPU and reset it; if the storm returns, report it to support"
            if hardware
            else "the job keeps crashing on this GPU: stop it and check the application; reset the GPU if it persists"
        )
        return Severity.CRITICAL, what, action, {"xids_in_window": float(count), "distinct_xids": float(len(codes)),
                                                 "last_xid": float(last.code)}  # fmt: skip
    what = f"XID {last.code}: {last.meaning} ({last.cause} error)"
    return last.severity, what, last.action, {"xid": float(last.code), "xids_in_window": float(count)}


def _storm(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    return _xid_words(det, slot, True, ep, ts)


def _single_xid(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    return _xid_words(det, slot, False, ep, ts)


def _ecc(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    xid = ep.detail.get("xid")
    c = det.counters[slot]
    pending = row.get("row_remap_pending", row.get("retired_pages_pending", nan))
    what = (
        f"uncorrectable ECC error{f' (XID {int(xid)}: {describe(int(xid)).meaning})' if xid else ''}: "
        f"{_fmt(c[_C['ecc_uncorrected_total']])} uncorrected in total, rows remapped for uncorrectable errors "
        f"{_fmt(c[_C['row_remap_uncorrectable_total']])}, remap pending {_fmt(pending)}"
    )
    action = (
        "drain the GPU and reset it to apply the row remap / page retirement; replace it if errors recur or the "
        "remap failed"
    )
    return Severity.CRITICAL, what, action, {
        "ecc_uncorrected_total": float(c[_C["ecc_uncorrected_total"]]),
        "row_remap_uncorrectable_total": float(c[_C["row_remap_uncorrectable_total"]]),
        "retired_pages_dbe_total": float(c[_C["retired_pages_dbe_total"]]),
        "remap_pending": pending, "remap_failure": row.get("row_remap_failure", nan), "xid": xid or nan,
    }  # fmt: skip


def _remap(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    nan = math.nan
    c = det.counters[slot]
    what = (
        f"memory row remap / page retirement waiting for a GPU reset (correctable remaps "
        f"{_fmt(c[_C['row_remap_correctable_total']])})"
    )
    return (
        Severity.WARNING,
        what,
        "reset the GPU at its next drain to activate the remap",
        {
            "row_remap_correctable_total": float(c[_C["row_remap_correctable_total"]]),
            "remap_pending": row.get("row_remap_pending", row.get("retired_pages_pending", nan)),
            "xid": ep.detail.get("xid", nan),
        },
    )


def _lost(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    node_now = int(det.node_latest[det.node_of[slot]])
    silent = max(0.0, (node_now - int(det.last_ts[slot])) / _S)
    how = "XID 79 / GPU lost" if ep.detail.get("event") else "no samples"
    what = f"fallen off the bus: {how}; silent for {silent:.0f} s while the node's other GPUs keep reporting"
    action = "drain the node and reboot it; reseat the GPU and check its power cables and riser if it happens again"
    return Severity.CRITICAL, what, action, {"silent_s": silent, "xid": ep.detail.get("xid", math.nan)}


def _idle(
    det: Detectors, slot: int, row: dict[str, float], rel: dict[str, float], ep: _Episode, ts: int
) -> tuple[Severity, str, str, dict[str, float]]:
    # the score needs ~2.3 time constants (11.5 min) of idleness to start the finding: count them in
    hours = (ts - ep.since_ns) / _S / 3600 + 2.3 * _TAU_S[_DEBOUNCED.index(IDLE)] / 3600
    what = (
        f"allocated but idle: util {_fmt(row.get('utilization_gpu_percent', math.nan), '%')}, memory "
        f"{_fmt(rel.get('memory_used_ratio', math.nan) * 100, '%')} for the last {hours * 60:.0f}+ min"
    )
    action = "release the GPU or give the job work: it holds a GPU that others could use"
    return (
        Severity.INFO,
        what,
        action,
        {
            "utilization_percent": row.get("utilization_gpu_percent", math.nan),
            "memory_used_ratio": rel.get("memory_used_ratio", math.nan),
            "idle_gpu_hours": hours,
        },
    )


_WORDING: Final[dict[str, Wording]] = {
    THERMAL: _thermal,
    POWER: _power,
    NVLINK: _nvlink,
    PCIE: _pcie,
    LEAK: _leak,
    STRAGGLER: _straggler,
    STORM: _storm,
    ECC: _ecc,
    LOST_BUS: _lost,
    XID: _single_xid,
    REMAP: _remap,
    IDLE: _idle,
}
