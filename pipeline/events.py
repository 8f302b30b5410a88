"""THE event schema: every hop of the pipeline speaks these types and nothing else.

A *GPU sample* is one reading of one GPU at one instant: identity (cluster, node, GPU uuid/index/model),
``ts_ns`` (UTC epoch nanoseconds) and metric fields whose names carry their units. A field a GPU does not
support is absent, never zero. Samples travel in a :class:`SampleBatch`: every GPU of one node read in one
sampling round goes into one Kafka message (see README "Message granularity" for the measurement behind this).

An *interpreted event* is a sample after the processor has validated and normalized it: the canonical
metrics, values relative to the GPU's own limits, and the interpretation later stages fill in (workload,
score, verdict, explanation).

``SCHEMA_VERSION`` is carried by every batch; a processor rejects versions it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

import numpy as np

SCHEMA_VERSION: Final = 1


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """A metric field: its plausible range and whether it is a whole number (counters, states, masks)."""

    name: str
    low: float
    high: float
    integer: bool = False
    help: str = ""
    #: a limit of the GPU (capacity, threshold, maximum) rather than a reading: changes rarely, if ever
    limit: bool = False


_TIB = float(2**40)
_GB_PER_S = 1e9

#: Canonical metric fields, in the order of the columns of :func:`metric_matrix`.
METRIC_FIELDS: Final[tuple[FieldSpec, ...]] = (
    FieldSpec("utilization_gpu_percent", 0, 100, help="time a kernel was running, NVML utilization.gpu"),
    FieldSpec("utilization_memory_percent", 0, 100, help="time device memory was read/written"),
    FieldSpec("memory_used_bytes", 0, _TIB, True),
    FieldSpec("memory_total_bytes", 1, _TIB, True, limit=True),
    FieldSpec("sm_clock_mhz", 0, 10_000),
    FieldSpec("sm_clock_max_mhz", 1, 10_000, limit=True),
    FieldSpec("memory_clock_mhz", 0, 40_000),
    FieldSpec("temperature_gpu_celsius", 0, 150),
    FieldSpec("temperature_memory_celsius", 0, 150),
    FieldSpec("temperature_slowdown_celsius", 1, 150, limit=True),
    FieldSpec("temperature_shutdown_celsius", 1, 150, limit=True),
    FieldSpec("power_watts", 0, 5_000),
    FieldSpec("power_limit_watts", 1, 5_000, limit=True),
    FieldSpec("energy_joules", 0, 1e15, help="total energy since the driver loaded"),
    FieldSpec("fan_speed_percent", 0, 100),
    FieldSpec("performance_state", 0, 15, True, help="P-state, 0 is the fastest"),
    FieldSpec("throttle_reasons_mask", 0, 2**63 - 1, True, help="NVML clocks-event reasons bitmask"),
    FieldSpec("pcie_link_gen", 1, 7, True),
    FieldSpec("pcie_link_gen_max", 1, 7, True, limit=True),
    FieldSpec("pcie_link_width", 1, 32, True),
    FieldSpec("pcie_link_width_max", 1, 32, True, limit=True),
    FieldSpec("pcie_tx_bytes_per_second", 0, 512 * _GB_PER_S),
    FieldSpec("pcie_rx_bytes_per_second", 0, 512 * _GB_PER_S),
    FieldSpec("nvlink_tx_bytes_per_second", 0, 8_000 * _GB_PER_S),
    FieldSpec("nvlink_rx_bytes_per_second", 0, 8_000 * _GB_PER_S),
    FieldSpec("ecc_corrected_total", 0, 2**63 - 1, True),
    FieldSpec("ecc_uncorrected_total", 0, 2**63 - 1, True),
)
METRIC_NAMES: Final[tuple[str, ...]] = tuple(f.name for f in METRIC_FIELDS)
METRIC_INDEX: Final[dict[str, int]] = {name: i for i, name in enumerate(METRIC_NAMES)}
METRIC_LOW: Final = np.array([f.low for f in METRIC_FIELDS], dtype=np.float64)
METRIC_HIGH: Final = np.array([f.high for f in METRIC_FIELDS], dtype=np.float64)
METRIC_INTEGER: Final = np.array([f.integer for f in METRIC_FIELDS], dtype=bool)
METRIC_LIMIT: Final = np.array([f.limit for f in METRIC_FIELDS], dtype=bool)

#: Other units a source may send, converted to the canonical field by the processor: alias -> (field, factor).
UNIT_ALIASES: Final[dict[str, tuple[str, float]]] = {
    "memory_used_mib": ("memory_used_bytes", 2.0**20),
    "memory_total_mib": ("memory_total_bytes", 2.0**20),
    "power_milliwatts": ("power_watts", 1e-3),
    "power_limit_milliwatts": ("power_limit_watts", 1e-3),
    "energy_millijoules": ("energy_joules", 1e-3),
    "pcie_tx_kib_per_second": ("pcie_tx_bytes_per_second", 1024.0),
    "pcie_rx_kib_per_second": ("pcie_rx_bytes_per_second", 1024.0),
}

#: Values made relative to the GPU's own limits by the processor (all dimensionless, 0..1 nominal).
RELATIVE_FIELDS: Final[tuple[str, ...]] = (
    "power_ratio_of_limit",
    "memory_used_ratio",
    "sm_clock_ratio_of_max",
    "temperature_ratio_of_slowdown",
    "pcie_link_gen_ratio_of_max",
    "pcie_link_width_ratio_of_max",
)


class Verdict(StrEnum):
    """How an interpreted event judges its sample; ``unscored`` until a baseline exists for it."""

    UNSCORED = "unscored"
    NORMAL = "normal"
    UNUSUAL = "unusual"
    ANOMALOUS = "anomalous"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU. ``metrics`` holds only the fields the GPU supports (see METRIC_FIELDS)."""

    cluster: str
    node: str
    gpu_uuid: str
    gpu_index: int
    gpu_model: str
    ts_ns: int
    metrics: dict[str, float]

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.cluster, self.node, self.gpu_uuid)


@dataclass(frozen=True, slots=True)
class SampleBatch:
    """Every GPU of one node from one sampling round: the unit that travels as one Kafka message."""

    cluster: str
    node: str
    samples: tuple[GpuSample, ...]
    schema_version: int = SCHEMA_VERSION

    @property
    def kafka_key(self) -> bytes:
        """Keyed by node, so all samples of one GPU land in one partition, in order."""
        return node_key(self.cluster, self.node)


@dataclass(frozen=True, slots=True)
class Workload:
    """What runs on a GPU, as far as a context source (or the classifier) knows."""

    application: str
    job_id: str | None = None
    user: str | None = None
    source: str = "unknown"
    confidence: float = 0.0


@dataclass(frozen=True, slots=True)
class InterpretedEvent:
    """A validated, normalized sample and what the pipeline made of it."""

    sample: GpuSample
    relative: dict[str, float] = field(default_factory=dict)
    workload: Workload | None = None
    score: float | None = None
    verdict: Verdict = Verdict.UNSCORED
    baseline: str | None = None
    explanation: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class InterpretedBatch:
    """Interpreted events held column-wise: what one Kafka message of the interpreted topic carries.

    The processor puts every event it derived from one raw partition in one take into one batch (and sends it
    to the same partition number), so a batch may span several nodes. Row ``i`` of every column is one event.
    ``metrics`` has the columns of METRIC_NAMES and ``relative`` those of RELATIVE_FIELDS, NaN where a value is
    absent; ``score`` is NaN where unscored. Hot paths (the sink) read the arrays; :meth:`events` gives the
    row-wise :class:`InterpretedEvent` view.
    """

    cluster: tuple[str, ...]
    node: tuple[str, ...]
    gpu_uuid: tuple[str, ...]
    gpu_index: tuple[int, ...]
    gpu_model: tuple[str, ...]
    ts_ns: np.ndarray
    metrics: np.ndarray
    relative: np.ndarray
    workload: tuple[Workload | None, ...]
    score: np.ndarray
    verdict: tuple[Verdict, ...]
    baseline: tuple[str | None, ...]
    explanation: tuple[str, ...]
    schema_version: int = SCHEMA_VERSION

    def __len__(self) -> int:
        return len(self.gpu_uuid)

    def events(self) -> list[InterpretedEvent]:
        metrics = _dict_rows(self.metrics, METRIC_NAMES)
        relative = _dict_rows(self.relative, RELATIVE_FIELDS)
        return [
            InterpretedEvent(
                GpuSample(
                    self.cluster[i],
                    self.node[i],
                    uuid,
                    self.gpu_index[i],
                    self.gpu_model[i],
                    int(self.ts_ns[i]),
                    metrics[i],
                ),
                relative[i],
                self.workload[i],
                None if np.isnan(self.score[i]) else float(self.score[i]),
                self.verdict[i],
                self.baseline[i],
                self.explanation[i],
            )
            for i, uuid in enumerate(self.gpu_uuid)
        ]

    @classmethod
    def from_events(cls, events: list[InterpretedEvent]) -> InterpretedBatch:
        samples = [e.sample for e in events]
        nan = float("nan")
        return cls(
            tuple(s.cluster for s in samples),
            tuple(s.node for s in samples),
            tuple(s.gpu_uuid for s in samples),
            tuple(s.gpu_index for s in samples),
            tuple(s.gpu_model for s in samples),
            np.array([s.ts_ns for s in samples], dtype=np.int64),
            metric_matrix(samples),
            np.array([[e.relative.get(n, nan) for n in RELATIVE_FIELDS] for e in events], dtype=np.float64).reshape(
                len(events), len(RELATIVE_FIELDS)
            ),
            tuple(e.workload for e in events),
            np.array([nan if e.score is None else e.score for e in events], dtype=np.float64),
            tuple(e.verdict for e in events),
            tuple(e.baseline for e in events),
            tuple(e.explanation for e in events),
        )


def _dict_rows(values: np.ndarray, names: tuple[str, ...]) -> list[dict[str, float]]:
    # `v == v` is False only for NaN (absent), and is the fastest such test in a comprehension
    return [{n: v for n, v in zip(names, row, strict=True) if v == v} for row in values.tolist()]  # noqa: PLR0124


def node_key(cluster: str, node: str) -> bytes:
    return f"{cluster}/{node}".encode()


def metric_matrix(samples: tuple[GpuSample, ...] | list[GpuSample]) -> np.ndarray:
    """Samples as a float64 matrix (rows: samples, columns: METRIC_NAMES), NaN where a field is absent."""
    nan = float("nan")
    rows = [[s.metrics.get(name, nan) for name in METRIC_NAMES] for s in samples]
    return np.array(rows, dtype=np.float64).reshape(len(rows), len(METRIC_NAMES))
