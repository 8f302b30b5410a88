"""Simulated GPU fleets for development, tests, benchmarks and evaluation where no GPU is present.

``Fleet`` (fleet.py) is the entry point; hardware.py holds the GPU models and node kinds, profiles.py the
applications and their phases, scheduler.py the jobs, faults.py the fault injector and its ground truth,
source.py the fleet as a source of the node agent (producers/agent.py publishes it, real time or fast-forward).
"""

from producers.simulator.fleet import Fleet, SimRound
from producers.simulator.hardware import MIXES, MODELS, NODE_KINDS, GpuModel, NodeKind
from producers.simulator.plan import FaultPlan, Injection
from producers.simulator.profiles import PROFILES, Profile

__all__ = [
    "MIXES",
    "MODELS",
    "NODE_KINDS",
    "PROFILES",
    "FaultPlan",
    "Fleet",
    "GpuModel",
    "Injection",
    "NodeKind",
    "Profile",
    "SimRound",
]
