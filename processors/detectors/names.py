"""The names of the detectors' findings: the fault classes the simulator injects (pipeline.events.FAULTS, in that
order) and three more (single XIDs, a row remap waiting for a reset, allocated but idle GPUs)."""

from __future__ import annotations

from typing import Final

from pipeline.events import FAULTS

THERMAL, POWER, NVLINK, PCIE, LEAK, STRAGGLER, STORM, ECC, LOST_BUS = FAULTS
XID: Final = "xid"
REMAP: Final = "row-remap"
IDLE: Final = "idle-capacity"
DETECTORS: Final = (*FAULTS, XID, REMAP, IDLE)
#: a straggler whose GPU already has one of these findings is explained by it and not reported twice
EXPLAINS_SLOWNESS: Final = (THERMAL, POWER, NVLINK, PCIE, LEAK, STORM, ECC, LOST_BUS)
