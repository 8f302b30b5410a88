"""Which finding kinds (pipeline.kinds) explain a slow GPU, and which hold its whole job back: the detectors'
policy over the one table of kinds."""

from __future__ import annotations

from typing import Final

from pipeline.kinds import BRAKE, ECC, HBM, LEAK, LOST_BUS, NVLINK, PCIE, POWER, STORM, THERMAL, XID

#: a straggler whose GPU already has one of these findings is explained by it and not reported twice
EXPLAINS_SLOWNESS: Final = (THERMAL, HBM, POWER, BRAKE, NVLINK, PCIE, LEAK, STORM, XID, ECC, LOST_BUS)
#: a GPU with one of these holds its whole job back: its finding names the job's GPUs waiting on it, and their rows'
#: explanations name it (a straggler's wording says the same in its own words; a leak or an XID does not slow a step)
HOLDS_JOB_BACK: Final = (THERMAL, HBM, POWER, BRAKE, NVLINK, PCIE)
