"""Several sources at once: one workload per GPU, and what changed since the last publication. Pure functions.

Priority by level, then confidence within a level:

    manual (``hermeneut context set``) > static file > scheduler (slurm, kubernetes) > processes

The winner's record is completed from the others, so a Slurm job whose class is unknown and a vLLM process on
its GPU become one workload: the job's id, user and GPU count from Slurm, the application, framework and model
from the process (``source``/``confidence`` then describe the application, i.e. ``process``). A manual record is
taken as is: a person's statement is never mixed with what the machines guess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pipeline.events import Workload
from producers.context.base import MANUAL, Observation

_LEVEL: Final = {MANUAL: 4, "static": 3, "slurm": 2, "kubernetes": 2, "process": 1}
_IDENTITY: Final = ("job_id", "user", "tenant", "job_gpus")
_DESCRIPTION: Final = ("model", "framework")


def level(source: str) -> int:
    """Priority level of a source name; unknown names rank below processes."""
    return _LEVEL.get(source, 0)


def _rank(w: Workload) -> tuple[int, float, str, str]:
    return (-level(w.source), -w.confidence, w.source, w.job_id or "")


def merge(candidates: Sequence[Workload]) -> Workload | None:
    """One workload from what several sources say about one GPU (None when nobody says anything)."""
    if not candidates:
        return None
    ranked = sorted(candidates, key=_rank)
    best = ranked[0]
    if best.source == MANUAL:
        return best
    if best.application == "unknown":
        knows = next((w for w in ranked[1:] if w.application != "unknown"), None)
        if knows is not None:
            best = dataclasses.replace(
                best, application=knows.application, source=knows.source, confidence=knows.confidence
            )
    fill: dict[str, Any] = {}
    for name in _IDENTITY:
        if getattr(best, name) is None:
            fill[name] = next((getattr(w, name) for w in ranked if getattr(w, name) is not None), None)
    agreeing = [w for w in ranked if w.application in (best.application, "unknown")]
    for name in _DESCRIPTION:
        if getattr(best, name) is None:
            fill[name] = next((getattr(w, name) for w in agreeing if getattr(w, name) is not None), None)
    return dataclasses.replace(best, **{k: v for k, v in fill.items() if v is not None})


def merge_observations(observations: Mapping[str, Observation]) -> dict[str, Workload]:
    """Per GPU uuid, the merge of every source's observation (source name -> observation)."""
    per_gpu: dict[str, list[Workload]] = {}
    for observation in observations.values():
        for uuid, workload in observation.items():
            per_gpu.setdefault(uuid, []).append(workload)
    merged = {uuid: merge(workloads) for uuid, workloads in per_gpu.items()}
    return {uuid: w for uuid, w in sorted(merged.items()) if w is not None}


@dataclass(frozen=True, slots=True)
class Changes:
    """What to publish: new or changed workloads, and GPUs whose workload ended (tombstones)."""

    upserts: dict[str, Workload]
    ended: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.upserts or self.ended)


def diff(published: Mapping[str, Workload], desired: Mapping[str, Workload]) -> Changes:
    upserts = {uuid: w for uuid, w in desired.items() if published.get(uuid) != w}
    ended = tuple(sorted(uuid for uuid in published if uuid not in desired))
    return Changes(upserts, ended)
