"""Labelled history from the simulated fleet, run through the real normalizer: what the baseline and classifier
tests learn from (each row's application is the one the simulator's scheduler ran on that GPU at that time)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.codec import encode_samples
from pipeline.config import ValidationSettings
from pipeline.events import InterpretedBatch
from processors.features import features
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet

T0 = 1_800_000_000_000_000_000


@dataclass
class Labelled:
    batches: list[InterpretedBatch]
    #: per batch, the true application of each row
    batch_apps: list[list[str]]
    f: np.ndarray
    application: np.ndarray
    gpu: np.ndarray
    ts_ns: np.ndarray
    model: np.ndarray
    fleet: Fleet


def labelled_history(seed: int, nodes: int = 30, gpus: int = 4, rounds: int = 120, t0: int = T0) -> Labelled:
    fleet = Fleet(nodes, gpus, seed=seed)
    index = {u: i for i, u in enumerate(fleet.uuids)}
    batches: list[InterpretedBatch] = []
    batch_apps: list[list[str]] = []
    for r in range(rounds):
        now = t0 + r * 10**9
        messages = [RawMessage(b.kafka_key, encode_samples(b), "t/0/0") for b in fleet.tick(now)]
        apps = fleet.applications()
        for _, b in process_raw(messages, now, ValidationSettings()).forward:
            batches.append(b)
            batch_apps.append([apps[index[u]] for u in b.gpu_uuid])
    f = np.vstack([features(b.metrics, b.relative, b.gpu_model) for b in batches])
    uuids = [u for b in batches for u in b.gpu_uuid]
    return Labelled(
        batches,
        batch_apps,
        f,
        np.array([a for apps in batch_apps for a in apps]),
        np.unique(np.array(uuids), return_inverse=True)[1],
        np.concatenate([b.ts_ns for b in batches]),
        np.array([m for b in batches for m in b.gpu_model]),
        fleet,
    )
