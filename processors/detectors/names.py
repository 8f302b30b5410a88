"""The names of the detectors' findings: the fault classes the simulator injects (pipeline.events.FAULTS, in that
order) and more (single XIDs, a row remap waiting for a reset, allocated but idle GPUs, abrupt changes of state)."""

from __future__ import annotations

from typing import Final

from pipeline.events import FAULTS

(THERMAL, POWER, NVLINK, PCIE, LEAK, STRAGGLER, STORM, ECC, LOST_BUS, BRAKE, NVLINK_CRC, PCIE_REPLAY, SBE,
 HBM, REMAP, PCIE_AER) = FAULTS  # fmt: skip
XID: Final = "xid"
IDLE: Final = "idle-capacity"
#: a PCIe link narrow from the GPU's first sample: a property of its slot or VM (processors.detectors.links)
PCIE_NARROW: Final = "pcie-link-narrow"
#: abrupt changes of state (events): processors.detectors.changes
COLLAPSE: Final = "memory-collapse"
CLIFF: Final = "utilization-cliff"
PHASE_SHIFT: Final = "phase-shift"
#: every GPU of a job slower together (a brake, starvation): processors.detectors.job_pace
JOB_SLOWDOWN: Final = "job-slowdown"
DETECTORS: Final = (
    *FAULTS,
    XID,
    IDLE,
    PCIE_NARROW,
    COLLAPSE,
    CLIFF,
    PHASE_SHIFT,
    JOB_SLOWDOWN,
)
#: a straggler whose GPU already has one of these findings is explained by it and not reported twice
EXPLAINS_SLOWNESS: Final = (THERMAL, HBM, POWER, BRAKE, NVLINK, PCIE, LEAK, STORM, XID, ECC, LOST_BUS)
#: a GPU with one of these holds its whole job back: its finding names the job's GPUs waiting on it, and their rows'
#: explanations name it (a straggler's wording says the same in its own words; a leak or an XID does not slow a step)
HOLDS_JOB_BACK: Final = (THERMAL, HBM, POWER, BRAKE, NVLINK, PCIE)
