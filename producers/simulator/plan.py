"""What the simulator injects: which fault classes, how often, how long and how strong.

Rates and durations come from the StepFun InfiniteHBD fault trace (584 faults on 400 servers over 349 days, see
``TRACE_CLASSES`` for how its descriptions map onto :data:`pipeline.kinds.FAULTS`); the classes it does not tell
apart take Llama 3's rates where its failure table names them (``OTHER_CLASSES``). A fault class occurs per node
as a Poisson process at the trace's rate times ``FaultPlan.rate_scale`` (the real rates are ~1e-3 per node-day,
so an evaluation of a small fleet over two hours needs a scale of ~1e4); ``mix="balanced"`` gives every class the
same rate (the trace's mean) so that rare classes (NVLink: 3 faults in the trace) are seen as often as the others.
A fault lasts the trace's repair time for its class (drawn from its quantiles), times ``duration_scale``, clipped
to ``[min_duration_s, max_duration_s]``: the trace's repair times (hours to weeks) include waiting for a
technician; compressed, they keep the classes' order (XID and ECC short, link and power faults long).

For an evaluation that cannot flatter, a plan can be *graded* (each fault's strength drawn across
:data:`MAGNITUDES`, from just above what the telemetry can show to severe, and stored on its record), can ask for a
*quota* per class (each class injected that many times across a time window, an injection that finds no eligible
target retried every minute; the attempts that found none are counted in ``skipped`` and injections never placed
in ``unplaced``) and for *compound* faults (a share of faults placed on a node that already has one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from pipeline.kinds import (
    BRAKE,
    ECC,
    FAULTS,
    HBM,
    LEAK,
    LOST_BUS,
    NVLINK,
    NVLINK_CRC,
    PCIE,
    PCIE_AER,
    PCIE_REPLAY,
    POWER,
    REMAP,
    SBE,
    STORM,
    STRAGGLER,
    THERMAL,
)

_DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class TraceClass:
    """A fault class as the trace shows it: which (Level, Class, Desc) it covers, how often, how long."""

    fault: str
    #: (Level, Class, Desc) patterns; None matches anything
    sources: tuple[tuple[str, str | None, str | None], ...]
    #: faults in the trace
    count: int
    #: repair time, hours, at the quantiles of REPAIR_QUANTILES
    repair_hours: tuple[float, ...]
    #: "gpu" or "node": what the fault hits
    scope: str = "gpu"


TRACE_SERVERS: Final = 400
TRACE_DAYS: Final = 348.98
REPAIR_QUANTILES: Final = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
_HW = "Hardware Failure"

#: The trace's descriptions per fault class; counts and repair-time quantiles measured on fault_events.csv
#: (tests/unit/producers/simulator/test_faults.py recomputes them from the copy in tests/testdata).
TRACE_CLASSES: Final[dict[str, TraceClass]] = {
    t.fault: t
    for t in (
        # overheating: the GPU's own alarm, and the chassis fans failing
        TraceClass(
            THERMAL,
            ((_HW, "GPU", "GPU Temperature High"), (_HW, "Fan", None)),
            35,
            (0.27, 14.56, 26.19, 82.15, 234.05, 1337.11, 2199.69),
        ),
        # a failed power supply: the node's GPUs are power-limited until it is replaced
        TraceClass(
            POWER,
            ((_HW, "Power Supply", None),),
            26,
            (8.72, 19.28, 45.23, 351.1, 493.23, 1315.42, 1367.01),
            scope="node",
        ),
        TraceClass(
            NVLINK,
            ((_HW, "GPU", "GPU P2P Bandwidth Low"),),
            3,
            (841.13, 851.02, 865.85, 890.58, 1548.7, 1943.57, 2206.82),
        ),
        TraceClass(
            PCIE, ((_HW, "GPU", "GPU PCI link width low"),), 25, (0.2, 0.75, 17.12, 71.98, 246.56, 409.44, 1079.28)
        ),
        # the trace has no memory-leak class; the closest is its software failures (rate and repair times)
        TraceClass(LEAK, (("Software Failure", None, None),), 24, (0.19, 1.05, 4.09, 19.11, 48.79, 163.17, 290.77)),
        # machines the training job itself flagged as suspect (typically slow workers)
        TraceClass(
            STRAGGLER,
            (("Other Failure", "Training Task Troubleshooting", None),),
            14,
            (1.57, 2.44, 3.69, 16.53, 38.57, 58.0, 93.77),
        ),
        TraceClass(
            STORM,
            ((_HW, "GPU", "GPU xid Error"), (_HW, "GPU", "GPU device unknow error")),
            51,
            (0.18, 0.2, 0.23, 1.56, 32.57, 89.43, 410.0),
        ),
        TraceClass(
            ECC,
            ((_HW, "GPU", "GPU DBE(Double Bit ECC) > Threshold"),),
            60,
            (0.07, 0.21, 0.21, 3.21, 51.04, 540.7, 2124.07),
        ),
        TraceClass(
            LOST_BUS,
            ((_HW, "GPU", "GPU Lost"), (_HW, "GPU", "GPU device not found"), (_HW, "GPU", "nvidia-smi Timeout")),
            15,
            (1.48, 3.92, 22.02, 37.3, 68.08, 84.55, 623.97),
        ),
    )
}


@dataclass(frozen=True, slots=True)
class OtherClass:
    """A class the StepFun trace does not tell apart: its rate from Meta's Llama 3 table where the table names its
    component (``llama3``: the category and its count), else the trace's mean rate per class (no fleet publishes
    one); its repair times are those of the trace class ``like``."""

    fault: str
    like: str
    llama3: tuple[str, int] | None = None


#: Llama 3 ("The Llama 3 Herd of Models", Meta 2024, section 3.3.4, Table 5): 419 unexpected interruptions of a
#: 54-day pre-training run on 16,384 H100 GPUs (2,048 servers of 8), by root cause
LLAMA3_SERVERS: Final = 2048
LLAMA3_DAYS: Final = 54.0
OTHER_CLASSES: Final[dict[str, OtherClass]] = {
    c.fault: c
    for c in (
        # a brake asserted by a power supply or the rack's power feed: repaired as a power supply is
        OtherClass(BRAKE, POWER),
        # Llama 3's "Faulty GPU" (148) includes NVLink faults but does not split them out
        OtherClass(NVLINK_CRC, NVLINK),
        OtherClass(PCIE_REPLAY, PCIE),
        # no fleet publishes AER storms apart: the trace's mean rate, repaired as a PCIe link is
        OtherClass(PCIE_AER, PCIE),
        # HBM that wears out corrects more and more errors before it fails: Llama 3's second cause (17.2 %)
        OtherClass(SBE, ECC, ("GPU HBM3 Memory", 72)),
        OtherClass(HBM, THERMAL, ("GPU Thermal Interface + Sensor", 6)),
        # a pending remap waits for a reset, as a DBE's does
        OtherClass(REMAP, ECC),
    )
}


def trace_rate_per_node_s(fault: str) -> float:
    """Faults of a class per node and second: the StepFun trace's, else Llama 3's, else the trace's mean."""
    if fault in TRACE_CLASSES:
        return TRACE_CLASSES[fault].count / (TRACE_SERVERS * TRACE_DAYS * _DAY_S)
    llama3 = OTHER_CLASSES[fault].llama3
    if llama3 is not None:
        return llama3[1] / (LLAMA3_SERVERS * LLAMA3_DAYS * _DAY_S)
    return sum(trace_rate_per_node_s(f) for f in TRACE_CLASSES) / len(TRACE_CLASSES)


def _repair_class(fault: str) -> TraceClass:
    """The trace class whose repair times a fault class has."""
    return TRACE_CLASSES[fault] if fault in TRACE_CLASSES else TRACE_CLASSES[OTHER_CLASSES[fault].like]


@dataclass(frozen=True, slots=True)
class Magnitude:
    """How strong a fault of a class is: its unit, the range a graded plan draws from (``low`` just above what the
    telemetry can show) and the band edges an evaluation reports recall in."""

    unit: str
    low: float
    high: float
    bands: tuple[float, ...]
    #: True when a larger value is a milder fault (a cap closer to the default, a slower leak, rarer XIDs)
    milder_above: bool = False
    #: drawn log-uniformly (a range over orders of magnitude, each band as likely as its width in decades)
    log: bool = False


#: Graded strengths per class (classes without an entry are all-or-nothing: an ECC error, a GPU off the bus).
MAGNITUDES: Final[dict[str, Magnitude]] = {
    # 10 % slower than its peers is the smallest straggler a step-time comparison tells from noise (PAI's CoV)
    STRAGGLER: Magnitude("slowdown of the GPU's steps", 0.10, 0.45, (0.10, 0.15, 0.25, 0.45)),
    # where the degraded cooling would settle above the slowdown threshold: 2 C barely reaches it
    THERMAL: Magnitude("C above the slowdown threshold the cooling would settle", 2.0, 20.0, (2.0, 5.0, 10.0, 20.0)),
    HBM: Magnitude("C above the memory's max operating temperature it would settle", 2.0, 20.0, (2.0, 5.0, 10.0, 20.0)),
    POWER: Magnitude(
        "enforced limit as a share of the node's highest limit in force",
        0.5,
        0.85,
        (0.5, 0.65, 0.75, 0.85),
        milder_above=True,
    ),
    NVLINK: Magnitude("share of the GPU's NVLinks down", 0.05, 1.0, (0.05, 0.25, 0.75, 1.0)),
    PCIE: Magnitude("share of the link's bandwidth lost", 0.5, 0.875, (0.5, 0.75, 0.875, 0.875)),
    LEAK: Magnitude(
        "minutes until the process runs out of memory", 5.0, 120.0, (5.0, 20.0, 60.0, 120.0), milder_above=True
    ),
    STORM: Magnitude("seconds between XIDs", 3.0, 60.0, (3.0, 10.0, 30.0, 60.0), milder_above=True),
    # from just above DCGM's limits (100/s, 8/min, 10/s) to what real storms reached (DCGM #313: 17,700 ECC/s)
    NVLINK_CRC: Magnitude(
        "NVLink CRC errors per second", 150.0, 20_000.0, (150.0, 1_000.0, 5_000.0, 20_000.0), log=True
    ),
    PCIE_REPLAY: Magnitude("PCIe replays per minute", 12.0, 600.0, (12.0, 30.0, 120.0, 600.0), log=True),
    # DCGM's replay limit (8/min) stands for AER too (processors.detectors.storms)
    PCIE_AER: Magnitude("PCIe AER correctable errors per minute", 12.0, 600.0, (12.0, 30.0, 120.0, 600.0), log=True),
    SBE: Magnitude("corrected ECC errors per second", 15.0, 20_000.0, (15.0, 100.0, 1_000.0, 20_000.0), log=True),
}


@dataclass(frozen=True, slots=True)
class Injection:
    """One fault at a fixed time (seconds after the first round). Without ``node``/``gpu`` (index within the
    node) the injector picks an eligible target at that time; ``duration_s`` None draws it as for random faults."""

    fault: str
    at_s: float
    duration_s: float | None = None
    node: int | None = None
    gpu: int | None = None


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """What to inject: random faults at the trace's rates (scaled) and/or fixed injections."""

    rate_scale: float = 1.0
    mix: str = "trace"
    duration_scale: float = 1 / 120
    min_duration_s: float = 180.0
    max_duration_s: float = 1800.0
    classes: tuple[str, ...] = FAULTS
    injections: tuple[Injection, ...] = ()
    #: draw each fault's strength across MAGNITUDES (else each class's usual, clearly visible range)
    graded: bool = False
    #: with a quota, each class is injected this many times over ``quota_window_s`` (seconds after the first
    #: round) instead of at random rates; an injection without an eligible target is retried every minute
    quota: int = 0
    quota_window_s: tuple[float, float] = (0.0, 0.0)
    #: share of faults placed, where one can be, on a node that already has a fault (compound faults)
    compound: float = 0.0

    def __post_init__(self) -> None:
        if self.mix not in ("trace", "balanced"):
            raise ValueError(f"fault mix must be 'trace' or 'balanced', got {self.mix!r}")
        unknown = sorted(set(self.classes) - set(FAULTS)) + [i.fault for i in self.injections if i.fault not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault class {unknown[0]!r}; known: {', '.join(FAULTS)}")
        if self.rate_scale < 0 or self.duration_scale <= 0 or not 0 < self.min_duration_s <= self.max_duration_s:
            raise ValueError("rate_scale must be >= 0, duration_scale > 0 and 0 < min_duration_s <= max_duration_s")
        lo, hi = self.quota_window_s
        if self.quota < 0 or (self.quota and not 0 <= lo < hi) or not 0 <= self.compound <= 1:
            raise ValueError("quota must be >= 0 with a window 0 <= start < end, and compound a share in [0, 1]")

    def quota_times(self, rng: np.random.Generator) -> list[tuple[float, str]]:
        """(seconds after the first round, class) of every quota injection: spread evenly over the window per
        class, each jittered within its slot, all sorted by time."""
        lo, hi = self.quota_window_s
        slot = (hi - lo) / max(self.quota, 1)
        return sorted(
            (lo + (k + float(rng.random())) * slot, fault) for fault in self.classes for k in range(self.quota)
        )

    def magnitude(self, fault: str, rng: np.random.Generator) -> float | None:
        """A graded strength for a fault of this class (None: the plan is not graded, or the class has none)."""
        m = MAGNITUDES.get(fault)
        if m is None or not self.graded:
            return None
        return float(np.exp(rng.uniform(np.log(m.low), np.log(m.high)))) if m.log else float(rng.uniform(m.low, m.high))

    def rate_per_node_s(self, fault: str) -> float:
        if fault not in self.classes:
            return 0.0
        if self.mix == "balanced":
            base = sum(trace_rate_per_node_s(f) for f in FAULTS) / len(FAULTS)
        else:
            base = trace_rate_per_node_s(fault)
        return base * self.rate_scale

    def expected(self, nodes: int, seconds: float) -> dict[str, float]:
        """Expected number of random faults per class for a fleet of ``nodes`` over ``seconds``."""
        return {f: self.rate_per_node_s(f) * nodes * seconds for f in FAULTS}

    @classmethod
    def for_evaluation(cls, nodes: int, seconds: float, per_class: float = 5.0, **kwargs: object) -> FaultPlan:
        """A balanced plan where each class is expected ``per_class`` times on ``nodes`` nodes over ``seconds``."""
        base = sum(trace_rate_per_node_s(f) for f in FAULTS) / len(FAULTS)
        return cls(rate_scale=per_class / (base * nodes * seconds), mix="balanced", **kwargs)  # type: ignore[arg-type]

    def draw_duration_s(self, fault: str, rng: np.random.Generator) -> float:
        """A repair time from the class's trace quantiles (log-linear between them), compressed and clipped."""
        hours = np.interp(rng.random(), REPAIR_QUANTILES, np.log(_repair_class(fault).repair_hours))
        return float(np.clip(math.exp(hours) * 3600 * self.duration_scale, self.min_duration_s, self.max_duration_s))
