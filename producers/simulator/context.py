"""Workload context for the simulated fleet: one :class:`GpuContext` per GPU, naming the application its
profile stands for, as a scheduler integration would publish it to the context topic.

Until the simulator publishes context itself, the main job, the tests and the benchmarks use this to label
simulated GPUs (and to withhold the labels when they test the classifier).
"""

from __future__ import annotations

from typing import Final

from pipeline.events import GpuContext, Workload
from producers.simulator.fleet import Fleet

#: simulator profile -> application class (pipeline.events.APPLICATIONS)
PROFILE_APPLICATIONS: Final[dict[str, str]] = {
    "llm-training": "llm-pretraining",
    "llm-inference": "llm-serving",
    "resnet-training": "resnet-training",
    "stable-diffusion-inference": "stable-diffusion-inference",
    "idle": "idle",
}


def application_of(fleet: Fleet, index: int) -> str:
    """The application class of GPU ``index`` of the fleet."""
    return PROFILE_APPLICATIONS[fleet.profile[index].name]


def fleet_contexts(fleet: Fleet, ts_ns: int) -> list[GpuContext]:
    """The context record of every GPU of the fleet (idle GPUs run nothing: workload None)."""
    out = []
    for i, uuid in enumerate(fleet.uuids):
        node = fleet.nodes[i // fleet.gpus_per_node]
        app = application_of(fleet, i)
        workload = None if app == "idle" else Workload(app, job_id=f"job-{node}", source="simulator", confidence=1.0)
        out.append(GpuContext(fleet.cluster, node, uuid, ts_ns, workload))
    return out
