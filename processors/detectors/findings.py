"""From a rule's conclusion to a :class:`pipeline.events.Finding`: the episode it opens, repeats or closes, and its
wording, asked of the family that owns the detector.

A finding started on a row describes that row (the GPU's latest, see processors.detectors.gpus); a repeat describes
the GPU as it is now; a clear too, prefixed ``cleared:``. A node-level finding (``gpu_uuid`` None: one cause for
several GPUs of a node) is described when it starts and repeats, and its clear repeats the last description. The
summary of a GPU's finding starts with the GPU's name and workload; a node's with the node's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from pipeline.events import Finding
from pipeline.kinds import DETECTORS
from processors.detectors.gpus import GpuView, Latest
from processors.detectors.names import EXPLAINS_SLOWNESS, HOLDS_JOB_BACK
from processors.episodes import Description, Episode, Episodes
from processors.state import GpuSlots


class Wording(Protocol):
    """A detector family's wording of its findings on one GPU."""

    def describe(self, name: str, gpu: GpuView, episode: Episode, ts_ns: int) -> Description: ...


class NodeWording(Protocol):
    """A detector family's wording of a finding on several GPUs of one node (``slots``: the node's GPUs)."""

    def describe_node(self, name: str, slots: np.ndarray) -> Description: ...


def _known(said: Description) -> Description:
    """Absent numbers are left out of the evidence."""
    return said._replace(evidence={k: v for k, v in said.evidence.items() if v == v})  # noqa: PLR0124


class Reporter:
    """Opens, repeats and closes the detectors' episodes, per GPU and per node, and words their findings."""

    def __init__(self, slots: GpuSlots, latest: Latest) -> None:
        self.slots = slots
        self.latest = latest
        self.gpus = Episodes(slots, DETECTORS)
        self.nodes = Episodes(slots, DETECTORS, per="node")
        self.wording: dict[str, Wording] = {}
        self.node_wording: dict[str, NodeWording] = {}
        #: the other GPUs of a GPU's job (its straggler peer group): a GPU whose slowness a finding explains holds
        #: them all back, and its finding says so (a job-level finding, not N unusual GPUs)
        self.peers_of: Callable[[int], list[int]] = lambda _slot: []

    def transition(
        self, slot: int, name: str, start: bool, ts: int, out: list[Finding], detail: dict[str, float] | None = None
    ) -> None:
        """``name`` starts (or restarts) on a GPU, or clears there if it is open; ``detail`` is for its wording."""
        if name in EXPLAINS_SLOWNESS:
            self.latest.explained(slot, start, ts, name)
        if start:
            self.gpus.open(slot, name, ts, detail)
            self.send(slot, name, True, ts, out)
        elif self.gpus.is_open(slot, name):
            self.gpus.get(slot, name).detail.update(detail or {})
            self.send(slot, name, False, ts, out)
            self.gpus.close(slot, name)

    def send(self, slot: int, name: str, active: bool, ts: int, out: list[Finding]) -> None:
        """The finding of an open episode on a GPU: its start or a repeat (``active``), or its clear."""
        episode = self.gpus.get(slot, name)
        gpu = self.latest.view(self.slots, slot)
        said = _known(self.wording[name].describe(name, gpu, episode, ts))
        waiting = len(self.peers_of(slot)) if name in HOLDS_JOB_BACK else 0
        if waiting:  # said first: the job's other GPUs are slow because of this one
            others = "the other GPU of its job waits" if waiting == 1 else f"the {waiting} other GPUs of its job wait"
            who = f"{gpu.who()}, which {others} on"
            said = said._replace(evidence=said.evidence | {"job_gpus_waiting": float(waiting)})
        else:
            who = gpu.who()
        said = said._replace(summary=f"{who}: {said.summary}")
        if active:
            episode.said = said
        else:
            said = said._replace(summary=f"cleared: {said.summary}")
        where = (gpu.cluster, gpu.node, gpu.uuid, gpu.model)
        out.append(self.gpus.send(slot, name, active, ts, where, said, gpu.workload, gpu.index))

    def node_starts(self, node: int, name: str, ts: int, out: list[Finding]) -> None:
        self.nodes.open(node, name, ts)
        self.send_node(node, name, True, ts, out)

    def node_clears(self, node: int, name: str, ts: int, out: list[Finding]) -> None:
        self.send_node(node, name, False, ts, out)
        self.nodes.close(node, name)

    def send_node(self, node: int, name: str, active: bool, ts: int, out: list[Finding]) -> None:
        """The finding of an open episode on a node (``gpu_uuid`` None); a clear repeats the last description."""
        episode = self.nodes.get(node, name)
        slots = np.flatnonzero(self.slots.node_of[: len(self.slots)] == node)
        cluster, node_name, _ = self.slots.key(int(slots[0]))
        if active:
            said = _known(self.node_wording[name].describe_node(name, slots))
            episode.said = said._replace(summary=f"{node_name}: {said.summary}")
        said = episode.said if active else episode.said._replace(summary=f"cleared: {episode.said.summary}")
        models = {self.slots.model(s) for s in slots.tolist()}
        where = (cluster, node_name, None, models.pop() if len(models) == 1 else "")
        out.append(self.nodes.send(node, name, active, ts, where, said))

    def waited_on(self) -> list[tuple[int, Episode]]:
        """(slot, the finding it waits on) for every GPU whose job another GPU holds back (HOLDS_JOB_BACK)."""
        return [
            (peer, episode)
            for slot, name, episode in self.gpus.listed()
            if name in HOLDS_JOB_BACK
            for peer in self.peers_of(slot)
        ]

    def explain(
        self, slots: np.ndarray, ts_ns: np.ndarray, explanation: tuple[str, ...], also: list[tuple[int, Episode]]
    ) -> tuple[str, ...]:
        """Per row (its GPU's slot and time), the explanation with the summary of every finding active on the GPU
        since that time appended: its own, in the order they opened, then ``also`` (slot, episode) those of its
        node that speak for it."""
        open_on: dict[int, list[Episode]] = {}
        for slot, _name, episode in self.gpus.listed():
            open_on.setdefault(slot, []).append(episode)
        for slot, episode in also:
            open_on.setdefault(slot, []).append(episode)
        out = list(explanation)
        for i, slot in enumerate(slots.tolist()):
            episodes = open_on.get(slot)
            if not episodes:
                continue
            text = "; ".join(e.said.summary for e in episodes if e.since_ns <= ts_ns[i] and e.said.summary)
            if text:
                out[i] = f"{out[i]} | {text}" if out[i] else text
        return tuple(out)
