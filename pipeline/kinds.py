"""Every kind of finding, once: its name, what kind of thing it is, what it does to its GPU's health, how the
evaluation judges it, and whether the demo injects it. Everything else (the simulator's fault classes, the health
rules, the evaluation's windows, the demo's faults, the detectors' names) is read from :data:`KINDS`, so a new fault
class is one row here plus its detector and its injector (producers.simulator.faults.INJECTORS; a test holds the
three together).

What kind of thing (:class:`Thing`):

- ``fault``: a condition with a start and an end that the simulator injects and the evaluation scores;
- ``event``: an instant (an XID): judged at its time, no grace after it;
- ``waste``: GPUs a job holds without using them (not a fault of the GPU);
- ``info``: a property or a change that describes a job or a GPU (a narrow link from the first sample, a phase
  shift) and never changes a state by itself unless its row has a rule;
- ``anomaly``: unlike the application's learned behaviour (the baselines' scorer, not a detector).

Health rules (the ``health`` column): a finding kind gives a state at each severity and a remedy, with its source
(pipeline.health.fold reads them). A kind without a rule changes no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from pipeline.health.states import Health, Remedy, Rule

#: how long after a fault ends a detection of it still counts, unless its row says otherwise, seconds
DEFAULT_GRACE_S: Final = 60.0


class Thing(StrEnum):
    FAULT = "fault"
    EVENT = "event"
    WASTE = "waste"
    INFO = "info"
    ANOMALY = "anomaly"


@dataclass(frozen=True, slots=True)
class Kind:
    """One finding kind. ``min_visible_s``: the least time a fault needs to show in the telemetry at all, whatever
    the detector (faults starting closer than this to a run's end are excluded from its evaluation by rule);
    ``grace_s``: how long after a fault ends a detection of it still counts; ``hard``: judged against the "hard
    events" delay bar; ``demo_at_s``: injected this many seconds into the main job's live part."""

    name: str
    thing: Thing
    health: Rule | None = None
    min_visible_s: float = 0.0
    grace_s: float = DEFAULT_GRACE_S
    hard: bool = False
    demo_at_s: float | None = None
    #: its finding needs a count of events over a window (a storm: ``storm_count`` XIDs in ``storm_window_s``), so
    #: it cannot come within seconds of the fault's start: the "hard events" bar is then the GPU's state alone,
    #: which the first event's own finding gives at once
    counted: bool = False
    #: other kinds whose signature this one's holds (a link retrained narrower replays its packets too)
    also_shows: tuple[str, ...] = ()


THERMAL: Final = "thermal-throttling"
POWER: Final = "power-capping"
NVLINK: Final = "nvlink-down"
PCIE: Final = "pcie-link-degraded"
LEAK: Final = "memory-leak"
STRAGGLER: Final = "straggler"
STORM: Final = "xid-storm"
ECC: Final = "ecc-uncorrectable"
LOST_BUS: Final = "fallen-off-bus"
BRAKE: Final = "power-brake"
NVLINK_CRC: Final = "nvlink-crc-storm"
PCIE_REPLAY: Final = "pcie-replay-storm"
SBE: Final = "ecc-sbe-storm"
HBM: Final = "hbm-thermal"
REMAP: Final = "row-remap"
PCIE_AER: Final = "pcie-aer-storm"
XID: Final = "xid"
#: an AMD RAS event: a CPER record's AFIDs (pipeline.afid), judged by its CPER severity
RAS: Final = "ras-event"
IDLE: Final = "idle-capacity"
#: a PCIe link narrow from the GPU's first sample: a property of its slot or VM (processors.detectors.links)
PCIE_NARROW: Final = "pcie-link-narrow"
#: abrupt changes of state: processors.detectors.changes
COLLAPSE: Final = "memory-collapse"
CLIFF: Final = "utilization-cliff"
PHASE_SHIFT: Final = "phase-shift"
#: every GPU of a job slower together (a brake, starvation): processors.detectors.job_pace
JOB_SLOWDOWN: Final = "job-slowdown"
#: unlike its application's learned behaviour: processors.baselines.score
BASELINE_ANOMALY: Final = "baseline-anomaly"

_F, _E, _W, _I, _A = Thing.FAULT, Thing.EVENT, Thing.WASTE, Thing.INFO, Thing.ANOMALY
_D, _U = Health.DEGRADED, Health.UNHEALTHY

#: the table (faults first, in the simulator's order: seeded runs draw them in it)
KINDS: Final[tuple[Kind, ...]] = (
    Kind(THERMAL, _F, Rule(_D, _D, Remedy.INSPECT,
         "HW/SW thermal slowdown: it works, slower (as DCGM's thermal violations); cooling, fans"),
         min_visible_s=120.0, demo_at_s=8.0),
    Kind(POWER, _F, Rule(_D, _D, Remedy.NONE, "a power cap below the default: a setting, the GPU is fine"),
         min_visible_s=150.0, grace_s=180.0),
    Kind(NVLINK, _F, Rule(_D, _U, Remedy.RESET_GPU,
         "XID 74 / inactive links: Xid catalog RESET_GPU; traffic falls back to PCIe meanwhile"),
         min_visible_s=15.0, hard=True, demo_at_s=6.0),
    Kind(PCIE, _F, Rule(_D, _U, Remedy.INSPECT,
         "a link trained below its maximum after running at it: reseat, check the riser"),
         min_visible_s=30.0, demo_at_s=4.0, also_shows=(PCIE_REPLAY,)),
    Kind(LEAK, _F, Rule(_D, _D, Remedy.RESTART_JOB, "the job's memory grows until it fails: the job's to fix"),
         min_visible_s=300.0, grace_s=300.0),
    Kind(STRAGGLER, _F, Rule(_D, _D, Remedy.DRAIN,
         "one GPU slows its whole job: move the job off it, then look (Llama 3: faulty GPUs, 30%)"),
         min_visible_s=180.0, grace_s=180.0),
    Kind(STORM, _F, Rule(_D, _U, Remedy.RESET_GPU,
         "as one XID: a storm of the application's XIDs (13, 31, 43, ...) is RESTART_APP, the GPU is fine"),
         min_visible_s=120.0, hard=True, demo_at_s=10.0, counted=True),
    Kind(ECC, _F, Rule(_U, _U, Remedy.RESET_GPU,
         "XID 48/94/95: Xid catalog RESET_GPU (the reset retires the page / remaps the row)"),
         min_visible_s=5.0, hard=True, demo_at_s=2.0),
    Kind(LOST_BUS, _F, Rule(_U, _U, Remedy.REBOOT_NODE,
         "XID 79: NVIDIA Xid catalog RESTART_BM (drain the node, reboot; reseat if it recurs)"),
         min_visible_s=15.0, hard=True),
    Kind(BRAKE, _F, Rule(_D, _D, Remedy.INSPECT,
         "HW power brake (external signal from the PSU/BMC): NVSentinel #1666, found after 36 h"),
         min_visible_s=30.0),
    # a storm is judged on whole 60 s windows: the first one wholly inside the fault ends within 120 s
    Kind(NVLINK_CRC, _F, Rule(_D, _D, Remedy.INSPECT,
         "DCGM dcgm_gpu_hardware_limits.h: NVLink CRC errors matter at 100+/s (a marginal link)"),
         min_visible_s=120.0),
    Kind(PCIE_REPLAY, _F, Rule(_D, _D, Remedy.INSPECT,
         "DCGM dcgm_gpu_hardware_limits.h: 8 PCIe replays per minute is RM's maximum; reseat"),
         min_visible_s=120.0),
    Kind(SBE, _F, Rule(_D, _D, Remedy.INSPECT,
         "corrected ECC errors at 10+/s (DCGM's SBE limit; DCGM #313 called 17,700/s healthy)"),
         min_visible_s=120.0),
    # the memory heats with the thermal time constant, as the die does
    Kind(HBM, _F, Rule(_D, _D, Remedy.INSPECT,
         "HBM above its max operating temperature (DCGM VerifyHBMTemperature, gpud): cooling"),
         min_visible_s=120.0),
    Kind(REMAP, _F, Rule(_D, _U, Remedy.RESET_GPU,
         "NVIDIA row remapping: a pending remap takes effect at the next GPU reset"),
         min_visible_s=5.0, hard=True),
    Kind(PCIE_AER, _F, Rule(_D, _D, Remedy.INSPECT,
         "AER errors on the GPU's PCIe link: 8/min (DCGM's replay limit) or any uncorrectable"),
         min_visible_s=120.0),
    Kind(XID, _E, Rule(_D, _U, Remedy.RESET_GPU,
         "Xid catalog: critical XIDs need RESET_GPU or more; a warning XID is the application's (below)")),
    Kind(RAS, _E, Rule(_D, _U, Remedy.RESET_GPU,
         "AMD CPER severity: fatal needs a reset; contained (non-fatal uncorrected) is the application's; corrected")),
    Kind(IDLE, _W),
    Kind(PCIE_NARROW, _I),
    Kind(COLLAPSE, _I),
    Kind(CLIFF, _I),
    Kind(PHASE_SHIFT, _I),
    Kind(JOB_SLOWDOWN, _I),
    Kind(BASELINE_ANOMALY, _A, Rule(_D, _D, Remedy.NONE,
         "unlike its application's learned behaviour: look, no action")),
)  # fmt: skip
BY_NAME: Final[Mapping[str, Kind]] = {k.name: k for k in KINDS}

#: the fault classes the simulator injects and the evaluation scores, in the table's order
FAULTS: Final = tuple(k.name for k in KINDS if k.thing is Thing.FAULT)
#: what the detectors (processors.detectors) find: every kind but the scorer's
DETECTORS: Final = tuple(k.name for k in KINDS if k.thing is not Thing.ANOMALY)
#: the health rule of each kind that has one (pipeline.health.fold)
RULES: Final[Mapping[str, Rule]] = {k.name: k.health for k in KINDS if k.health is not None}
#: ground truth that is an instant, and ground truth of waste (the evaluation scores both besides the faults)
EVENT_KINDS: Final = tuple(k.name for k in KINDS if k.thing is Thing.EVENT)
WASTE_KINDS: Final = tuple(k.name for k in KINDS if k.thing is Thing.WASTE)
#: faults injected in the main job's live part, by seconds after it starts: the quickly confirmed first, so that a
#: short run shows some (thermal throttling and XID storms take ~40 s)
DEMO_FAULTS: Final = tuple(
    sorted(((k.name, k.demo_at_s) for k in KINDS if k.demo_at_s is not None), key=lambda f: f[1])
)
