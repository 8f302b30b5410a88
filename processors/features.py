"""Features for baselines and classification: relative values comparable across GPU generations, and the phase
of each row. Pure functions over the columns of an :class:`InterpretedBatch`; no I/O, no per-row Python.

Every feature is a reading made relative to something the GPU cannot exceed (its own limit, the link's capacity,
100%), so an H100 and a 1080 Ti running the same job land in the same range. A feature a GPU does not report
is NaN (masked by the scorer), never zero. Where a sample lacks a limit (dcgm-exporter sends no power limit,
vGPUs report N/A) the limit is taken from the GPU catalogue before the ratio is computed
(:func:`fill_relative`); the sample's own metrics are left as reported, so the sink never stores a made-up
limit.

Phase (:func:`infer_phase`) is a small rule set over the same features: idle = no kernels, little power, quiet
links; checkpoint = SMs starved while the GPU sends over PCIe with memory held; data-loading = SMs starved
while the GPU receives over PCIe; otherwise compute. "Starved" reads SM active (DCGM) where reported: NVML's
utilization counts any kernel in the interval and stays high while the SMs wait for data. ``eval`` cannot be
told from one sample (it looks like a lighter compute) and is only taken from a phase a framework reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np

from pipeline.catalogue import lookup
from pipeline.events import METRIC_INDEX, PHASES, RELATIVE_FIELDS, InterpretedBatch, relative_values

#: usable bytes/s per lane and direction for PCIe generation 1..7 (after line encoding)
_PCIE_LANE_BYTES: Final = np.array([np.nan, 0.25e9, 0.5e9, 0.985e9, 1.969e9, 3.938e9, 7.563e9, 15.125e9])


@dataclass(frozen=True, slots=True)
class Feature:
    """A feature: ``floor`` is the smallest spread the baseline assumes (in the feature's units), so a value that
    never moved in training does not make every tiny wobble an anomaly; ``unit`` says how to show it."""

    name: str
    label: str
    floor: float
    #: "percent" (0..100 as stored) or "ratio" (0..1, shown as %)
    unit: str


FEATURES: Final[tuple[Feature, ...]] = (
    Feature("utilization_gpu_percent", "GPU utilization", 3.0, "percent"),
    Feature("utilization_memory_percent", "memory bandwidth utilization", 3.0, "percent"),
    Feature("sm_active_percent", "SM active", 3.0, "percent"),
    Feature("tensor_active_percent", "tensor active", 3.0, "percent"),
    Feature("dram_active_percent", "DRAM active", 3.0, "percent"),
    Feature("power_ratio_of_limit", "power", 0.02, "ratio"),
    Feature("memory_used_ratio", "memory", 0.01, "ratio"),
    Feature("sm_clock_ratio_of_max", "SM clock", 0.02, "ratio"),
    Feature("temperature_ratio_of_slowdown", "temperature", 0.02, "ratio"),
    Feature("pcie_rx_ratio_of_capacity", "PCIe receive", 0.005, "ratio"),
    Feature("pcie_tx_ratio_of_capacity", "PCIe send", 0.005, "ratio"),
    Feature("nvlink_rx_ratio_of_capacity", "NVLink receive", 0.005, "ratio"),
    Feature("nvlink_tx_ratio_of_capacity", "NVLink send", 0.005, "ratio"),
)
FEATURE_NAMES: Final[tuple[str, ...]] = tuple(f.name for f in FEATURES)
FEATURE_INDEX: Final[dict[str, int]] = {name: i for i, name in enumerate(FEATURE_NAMES)}
FEATURE_FLOOR: Final = np.array([f.floor for f in FEATURES])
#: the metric each link-capacity feature is a ratio of (the baseline band is stored in the metric's units)
LINK_METRIC: Final[dict[str, str]] = {
    "pcie_rx_ratio_of_capacity": "pcie_rx_bytes_per_second",
    "pcie_tx_ratio_of_capacity": "pcie_tx_bytes_per_second",
    "nvlink_rx_ratio_of_capacity": "nvlink_rx_bytes_per_second",
    "nvlink_tx_ratio_of_capacity": "nvlink_tx_bytes_per_second",
}
PHASE_INDEX: Final[dict[str, int]] = {p: i for i, p in enumerate(PHASES)}

_LIMIT_NAMES: Final = (
    "memory_total_bytes",
    "power_limit_watts",
    "sm_clock_max_mhz",
    "temperature_slowdown_celsius",
    "pcie_link_gen_max",
    "pcie_link_width_max",
)
_LIMIT_COLS: Final = np.array([METRIC_INDEX[n] for n in _LIMIT_NAMES])


@lru_cache(maxsize=1024)
def catalogue_limits(gpu_model: str) -> tuple[np.ndarray, float, float]:
    """(limits in _LIMIT_NAMES order, NaN where unknown; NVLink links; bytes/s per link and direction, NaN
    when the model has no NVLink)."""
    spec = lookup(gpu_model)
    if spec is None:
        return np.full(len(_LIMIT_NAMES), np.nan), np.nan, np.nan
    known = spec.limit_metrics()
    limits = np.array([known.get(n, np.nan) for n in _LIMIT_NAMES], dtype=np.float64)
    per_link = spec.nvlink_gbytes_per_second * 1e9
    return limits, float(spec.nvlink_links), per_link if per_link > 0 else np.nan


@lru_cache(maxsize=8)
def _model_table(models: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the catalogue's limits, NVLink links and bytes/s per link, looked up once per distinct model
    (and once per batch: filling the relative values and the features see the same ``gpu_model`` column)."""
    names, inverse = np.unique(np.asarray(models, dtype=object), return_inverse=True)
    looked = [catalogue_limits(str(n)) for n in names]
    limits = np.array([lim for lim, _, _ in looked]).reshape(len(names), len(_LIMIT_NAMES))
    links = np.array([n for _, n, _ in looked], dtype=np.float64)
    per_link = np.array([b for _, _, b in looked], dtype=np.float64)
    out = (limits[inverse], links[inverse], per_link[inverse])
    for array in out:
        array.setflags(write=False)  # cached: shared by every caller with the same column
    return out


def fill_relative(metrics: np.ndarray, relative: np.ndarray, models: tuple[str, ...]) -> np.ndarray:
    """Relative values with the gaps a missing limit left filled from the catalogue (the sample's own limits win).

    Only the rows with a gap are computed again: the others keep the values the normalizer computed."""
    gaps = np.flatnonzero(np.isnan(relative).any(axis=1))
    if not len(gaps):
        return relative
    limits, _, _ = _model_table(models)
    filled = metrics[gaps]
    current = filled[:, _LIMIT_COLS]
    filled[:, _LIMIT_COLS] = np.where(np.isnan(current), limits[gaps], current)
    out = relative.copy()
    out[gaps] = np.where(np.isnan(relative[gaps]), relative_values(filled), relative[gaps])
    return out


def features_of(batch: InterpretedBatch) -> np.ndarray:
    """The batch's FEATURES matrix: the one the enrichment computed, else (a batch it never saw) computed now."""
    if batch.features is not None:
        return batch.features
    return features(batch.metrics, batch.relative, batch.gpu_model)


def features(metrics: np.ndarray, relative: np.ndarray, models: tuple[str, ...]) -> np.ndarray:
    """The FEATURES matrix (rows x len(FEATURES)), NaN where a GPU does not report what a feature needs."""
    n = metrics.shape[0]
    out = np.full((n, len(FEATURES)), np.nan)
    if n == 0:
        return out

    def m(name: str) -> np.ndarray:
        return metrics[:, METRIC_INDEX[name]]

    for feature in FEATURES:
        if feature.unit == "percent":
            out[:, FEATURE_INDEX[feature.name]] = m(feature.name)
    rel = {name: relative[:, i] for i, name in enumerate(RELATIVE_FIELDS)}
    for name in ("power_ratio_of_limit", "memory_used_ratio", "sm_clock_ratio_of_max", "temperature_ratio_of_slowdown"):
        out[:, FEATURE_INDEX[name]] = rel[name]
    limits, catalogue_links, per_link = _model_table(models)
    # the links the GPU says it has (an H100 PCIe card has none, the SXM board 18) win over the catalogue's
    links = np.where(np.isnan(m("nvlink_links_max")), catalogue_links, m("nvlink_links_max"))
    nvlink_capacity = links * per_link
    gen = np.where(np.isnan(m("pcie_link_gen_max")), limits[:, 4], m("pcie_link_gen_max"))
    width = np.where(np.isnan(m("pcie_link_width_max")), limits[:, 5], m("pcie_link_width_max"))
    gen_index = np.clip(np.nan_to_num(gen, nan=0.0), 0, 7).astype(np.int64)
    pcie_capacity = _PCIE_LANE_BYTES[gen_index] * width
    with np.errstate(invalid="ignore", divide="ignore"):
        out[:, FEATURE_INDEX["pcie_rx_ratio_of_capacity"]] = m("pcie_rx_bytes_per_second") / pcie_capacity
        out[:, FEATURE_INDEX["pcie_tx_ratio_of_capacity"]] = m("pcie_tx_bytes_per_second") / pcie_capacity
        out[:, FEATURE_INDEX["nvlink_rx_ratio_of_capacity"]] = m("nvlink_rx_bytes_per_second") / nvlink_capacity
        out[:, FEATURE_INDEX["nvlink_tx_ratio_of_capacity"]] = m("nvlink_tx_bytes_per_second") / nvlink_capacity
    out[~np.isfinite(out)] = np.nan
    return out


def link_capacity(gpu_model: str, feature: str) -> float:
    """Bytes/s per direction behind a link-capacity feature for a model (NaN when the catalogue does not know)."""
    limits, links, per_link = catalogue_limits(gpu_model)
    if feature.startswith("nvlink"):
        return links * per_link if links > 0 else float("nan")
    gen, width = limits[4], limits[5]
    if np.isnan(gen) or np.isnan(width):
        return float("nan")
    return float(_PCIE_LANE_BYTES[int(gen)] * width)


# phase rules, thresholds in feature units (see module docstring)
IDLE_ACTIVITY_PERCENT: Final = 5.0
IDLE_POWER_RATIO: Final = 0.3
#: below this the GPU is waiting on something: SM active (DCGM) where reported, else NVML utilization, which
#: counts a kernel running at any time in the interval and so stays high while SMs starve
STALLED_SM_ACTIVE_PERCENT: Final = 15.0
STALLED_UTIL_PERCENT: Final = 40.0
#: host -> device traffic (data-loading) and device -> host traffic (checkpoint), share of the link
LOADING_LINK_RATIO: Final = 0.03
CHECKPOINT_LINK_RATIO: Final = 0.1
HELD_MEMORY_RATIO: Final = 0.2


def infer_phase(f: np.ndarray) -> np.ndarray:
    """Phase index (into PHASES) per row of a FEATURES matrix."""
    util = f[:, FEATURE_INDEX["utilization_gpu_percent"]]
    sm = f[:, FEATURE_INDEX["sm_active_percent"]]
    power = f[:, FEATURE_INDEX["power_ratio_of_limit"]]
    rx = np.nan_to_num(f[:, FEATURE_INDEX["pcie_rx_ratio_of_capacity"]])
    tx = np.nan_to_num(f[:, FEATURE_INDEX["pcie_tx_ratio_of_capacity"]])
    memory = f[:, FEATURE_INDEX["memory_used_ratio"]]
    phase = np.full(f.shape[0], PHASE_INDEX["compute"], dtype=np.int64)
    with np.errstate(invalid="ignore"):
        stalled = np.where(np.isnan(sm), util < STALLED_UTIL_PERCENT, sm < STALLED_SM_ACTIVE_PERCENT)
        loading = stalled & (rx > LOADING_LINK_RATIO) & (rx > tx)
        checkpoint = stalled & (tx > CHECKPOINT_LINK_RATIO) & (tx >= rx) & (memory > HELD_MEMORY_RATIO)
        activity = np.where(np.isnan(sm), util, np.fmax(sm, util))
        quiet_links = (rx <= LOADING_LINK_RATIO) & (tx <= LOADING_LINK_RATIO)
        idle = (activity < IDLE_ACTIVITY_PERCENT) & ~(power > IDLE_POWER_RATIO) & quiet_links
    phase[loading] = PHASE_INDEX["data-loading"]
    phase[checkpoint] = PHASE_INDEX["checkpoint"]
    phase[idle] = PHASE_INDEX["idle"]
    return phase
