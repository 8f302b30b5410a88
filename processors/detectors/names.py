"""The names of the detectors' findings: the fault classes the simulator injects (pipeline.events.FAULTS, in that
order) and more (single XIDs, a row remap waiting for a reset, allocated but idle GPUs, abrupt changes of state)."""

from __future__ import annotations

from typing import Final

from pipeline.events import FAULTS

THERMAL, POWER, NVLINK, PCIE, LEAK, STRAGGLER, STORM, ECC, LOST_BUS = FAULTS
XID: Final = "xid"
REMAP: Final = "row-remap"
IDLE: Final = "idle-capacity"
#: a PCIe link narrow from the GPU's first sample: a property of its slot or VM (processors.detectors.links)
PCIE_NARROW: Final = "pcie-link-narrow"
#: clocks held by the board's external power-brake signal (processors.detectors.brake)
BRAKE: Final = "power-brake"
#: abrupt changes of state (events): processors.detectors.changes
COLLAPSE: Final = "memory-collapse"
CLIFF: Final = "utilization-cliff"
PHASE_SHIFT: Final = "phase-shift"
#: correctable error counters rising faster than DCGM's limits (processors.detectors.storms)
NVLINK_CRC: Final = "nvlink-crc-storm"
PCIE_REPLAY: Final = "pcie-replay-storm"
SBE: Final = "ecc-sbe-storm"
DETECTORS: Final = (
    *FAULTS,
    XID,
    REMAP,
    IDLE,
    PCIE_NARROW,
    BRAKE,
    COLLAPSE,
    CLIFF,
    PHASE_SHIFT,
    NVLINK_CRC,
    PCIE_REPLAY,
    SBE,
)
#: a straggler whose GPU already has one of these findings is explained by it and not reported twice
EXPLAINS_SLOWNESS: Final = (THERMAL, POWER, BRAKE, NVLINK, PCIE, LEAK, STORM, XID, ECC, LOST_BUS)
#: a GPU with one of these holds its whole job back: its finding names the job's GPUs waiting on it, and their rows'
#: explanations name it (a straggler's wording says the same in its own words; a leak or an XID does not slow a step)
HOLDS_JOB_BACK: Final = (THERMAL, POWER, BRAKE, NVLINK, PCIE)
