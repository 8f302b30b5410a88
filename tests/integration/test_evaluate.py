"""The evaluation job end to end on real Kafka and InfluxDB, with a stand-in producer in place of the simulator:
the same faulty node as test_detectors plus a healthy node whose context is withheld, ground truth on its topic,
context on the truth topic. Every injected class is found with F1 1, no finding of any kind falls outside the
faults, and the classification of the withheld node is measured."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from hermeneut.jobs.evaljob import run_evaluation, withheld
from hermeneut.jobs.evalreport import format_table
from pipeline.codec import encode_record
from pipeline.config import Settings
from pipeline.events import FaultRecord, GpuContext, GpuSample, SampleBatch, Workload
from pipeline.publisher import Publisher

from .harness import publish_batches
from .test_detectors import MODEL, SECONDS, events, reading

pytestmark = pytest.mark.integration

S = 1_000_000_000
#: (fault, GPU, start s, end s; 0 = still open at the end)
FAULTS = [
    ("thermal-throttling", 0, 60, 0),
    ("power-capping", 1, 120, 0),
    ("nvlink-down", 2, 60, 0),
    ("pcie-link-degraded", 3, 60, 0),
    ("memory-leak", 4, 0, 0),
    ("ecc-uncorrectable", 5, 100, 0),
    ("xid-storm", 6, 200, 300),
    ("fallen-off-bus", 7, 399, 0),
]


def test_evaluation_scores_a_replay(settings: Settings, tmp_path: Path) -> None:
    seed = next(s for s in range(1000) if withheld("n2", 0.5, s) and not withheld("n1", 0.5, s))
    start = time.time_ns() - (SECONDS + 5) * S

    def produce(sim: Settings, _run_dir: Path) -> int:
        cluster = sim.cluster
        pub = Publisher(sim.kafka.client_config())
        for node in ("n1", "n2"):
            for gpu in range(8):
                job = Workload("llm-pretraining", f"job-{node}", source="simulator", job_gpus=8)
                ctx = GpuContext(cluster, node, f"{node}-GPU-{gpu}", start, job)
                pub.publish(sim.topics.context, ctx.kafka_key, encode_record(ctx))
        for fault, gpu, begin, end in FAULTS:
            rec = FaultRecord(cluster, "n1", f"n1-GPU-{gpu}", fault, start + begin * S, start + end * S if end else 0)
            pub.publish(sim.topics.ground_truth, rec.kafka_key, encode_record(rec))
        assert pub.close(30) == 0
        rng = np.random.default_rng(3)
        batches, samples = [], 0
        for t in range(SECONDS):
            ts = start + t * S
            for node in ("n1", "n2"):
                gpus = []
                for gpu in range(8):
                    metrics = reading(t, gpu, rng) if node == "n1" else reading(0, 0, rng)
                    if metrics is not None:
                        gpus.append(GpuSample(cluster, node, f"{node}-GPU-{gpu}", gpu, MODEL, ts, metrics))
                node_events = tuple(
                    type(e)(e.cluster, e.node, f"n1-{e.gpu_uuid}", e.gpu_index, e.ts_ns, e.kind, e.code, e.detail)
                    for e in events(t, ts, cluster)
                ) if node == "n1" else ()  # fmt: skip
                samples += len(gpus)
                batches.append(SampleBatch(cluster, node, tuple(gpus), node_events))
        publish_batches(sim, batches)
        return samples

    outcome = run_evaluation(settings, produce, tmp_path, seed=seed, withhold_share=0.5, drain_timeout_s=300)
    print(format_table(outcome.evaluation))

    assert outcome.stored == outcome.samples and outcome.dead_lettered == 0
    assert outcome.withheld_nodes == ["n2"] and outcome.faults == len(FAULTS)
    ev = outcome.evaluation
    by_class = {c.fault: c for c in ev.classes}
    for fault, *_ in FAULTS:
        c = by_class[fault]
        assert (c.faults, c.detected, c.f1) == (1, 1, 1.0), c
        assert c.delays_s[0] < 1200
    assert by_class["straggler"].faults == 0
    # every finding a user saw counts: nothing outside the faults at all
    assert ev.false_alarms == {}, ev.false_alarm_examples
    # n2 all the time; n1's GPUs before their faults, and GPU 6 again 60 s (the grace) after its storm ended
    healthy_s = 8 * (SECONDS - 1) + 60 + 120 + 60 + 60 + 0 + 100 + (200 + (SECONDS - 1) - 360) + 399
    assert ev.healthy_gpu_days == pytest.approx(healthy_s / 86400)
    # classification is measured on the withheld node's rows (this branch has no classifier yet: nothing inferred)
    assert ev.classification is not None and ev.classification.rows == 8 * SECONDS
    assert [r.ok for r in outcome.pai] == [True] * 4
