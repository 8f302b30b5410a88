"""A real, healthy training run judged as a new installation judges it: nanoGPT PR #643's 8xH100 run
(tests/testdata/nanogpt-pr643-h100x8-nvsmi-timeseries, nvidia-smi every ~0.33 s: utilization, power, temperature)
against baselines learned only from the simulator, i.e. from another cluster. Issue 11 saw a real run like it
condemned (81% of rows anomalous) by simulator priors; a prior may widen a band, never condemn. The share judged
normal depends on how much simulator history the priors saw: from 40 nodes x 8 GPUs over 4 minutes every busy row
is normal; from 24 nodes over 2 minutes 30% of them are unusual (none anomalous). And judged as an installation
judges it once it has learned: baselines fitted on the run's first half, its second half judged against them."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from pipeline import registry
from pipeline.baselines import BaselineManifest
from pipeline.config import Settings
from pipeline.events import (
    METRIC_INDEX,
    GpuSample,
    InterpretedBatch,
    InterpretedEvent,
    Verdict,
    Workload,
    metric_matrix,
    relative_values,
)
from processors.baselines.fit import LabelledRows, fit_version
from processors.baselines.score import AnomalyTracker, score_batch
from processors.baselines.store import BaselineSet
from processors.features import features_of, fill_relative, infer_phase
from tests import TESTDATA
from tests.unit.processors.history import labelled_history

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
H100 = "NVIDIA H100 80GB HBM3"


def _real_run() -> InterpretedBatch:
    trace, mapping = NANOGPT / "gpu_metrics_f4f827dd.csv", NANOGPT / "mapping.toml"
    importer = registry.create("importer", "table", Settings(cluster="real"), paths=(trace,), mapping=mapping)
    importer.open()
    try:
        blocks = list(importer.blocks())
    finally:
        importer.close()
    samples = [
        GpuSample(
            "real",
            r.node[i],
            r.gpu_uuid[i],
            r.gpu_index[i],
            r.gpu_model[i],
            int(r.ts_ns[i]),
            {k: float(v[i]) for k, v in r.metrics.items() if v[i] == v[i]},
        )
        for r in (b.rows for b in blocks)
        for i in range(len(r.ts_ns))
    ]
    workload = Workload("llm-pretraining", job_id="nanogpt-pr643", source="import", confidence=1.0)
    batch = InterpretedBatch.from_events([InterpretedEvent(s, workload=workload) for s in samples])
    m = metric_matrix(samples)
    return dataclasses.replace(batch, relative=fill_relative(m, relative_values(m), batch.gpu_model))


def _simulator_baselines() -> BaselineSet:
    h = labelled_history(7, nodes=40, gpus=8, rounds=240)
    parts = [
        LabelledRows(
            str(app), str(model), h.f[sel], infer_phase(h.f[sel]), h.gpu[sel], h.ts_ns[sel], frozenset({"simulator"})
        )
        for app in np.unique(h.application)
        for model in np.unique(h.model)
        if (sel := (h.application == app) & (h.model == model)).sum() >= 50
    ]
    return _fitted(parts, 0)


def _fitted(parts: list[LabelledRows], trained_ns: int) -> BaselineSet:
    """The baselines of one version fitted on ``parts``, which must hold the run's own (application, model)."""
    records = fit_version(parts, 1, trained_ns, 100, 30, 0.6).records
    assert f"llm-pretraining/{H100}/compute" in {r.baseline_id for r in records}
    return BaselineSet(BaselineManifest(1, 0, 0, 0, tuple(r.baseline_id for r in records)), list(records))


def test_a_real_healthy_training_run_is_normal_under_simulator_priors() -> None:
    run, baselines = _real_run(), _simulator_baselines()
    assert len(run) == 6240
    scored, _ = score_batch(run, baselines)
    verdicts = np.array(scored.verdict)
    busy = run.metrics[:, METRIC_INDEX["utilization_gpu_percent"]] >= 90  # the steady training, ramps aside
    assert busy.sum() > 5000
    shares = collections.Counter(verdicts[busy].tolist())
    assert shares[Verdict.NORMAL] >= 0.995 * busy.sum(), shares
    assert Verdict.ANOMALOUS not in set(verdicts.tolist())  # ramps included: a prior never condemns
    judged = [e for e, v in zip(scored.explanation, verdicts, strict=True) if v == Verdict.UNUSUAL]
    assert all("a prior" in e and "never condemns" in e for e in judged), judged[:3]


def test_a_real_healthy_training_run_is_normal_against_what_was_learned_from_its_first_half() -> None:
    """What `hermeneut baselines train` does after an import, held out: learned from the first half of the run
    (its start ramp and two minutes of training), the second half's training is judged normal; its stop ramp has
    a few anomalous rows (GPUs idle but still hot, unlike the cold idle the first half learned) over 6 seconds,
    and the whole run replayed against what was learned, a round at a time, raises no finding."""
    run = _real_run()
    split = int(np.median(run.ts_ns))
    first, second = (run.take(np.flatnonzero(sel)) for sel in (run.ts_ns < split, run.ts_ns >= split))
    f = features_of(first)
    gpu = np.unique(np.array(first.gpu_uuid), return_inverse=True)[1]
    part = LabelledRows("llm-pretraining", H100, f, infer_phase(f), gpu, first.ts_ns, frozenset({"real"}))
    learned = _fitted([part], split)

    scored, _ = score_batch(second, learned)
    verdicts = np.array(scored.verdict)
    busy = second.metrics[:, METRIC_INDEX["utilization_gpu_percent"]] >= 90
    assert busy.sum() > 2000
    shares = collections.Counter(verdicts[busy].tolist())
    assert shares[Verdict.NORMAL] >= 0.995 * busy.sum(), shares

    tracker, findings = AnomalyTracker(), []
    order = np.argsort(run.ts_ns, kind="stable")
    for rows in np.array_split(order, len(order) // 8):  # one round of the node's 8 GPUs at a time
        batch, codes = score_batch(run.take(np.sort(rows)), learned)
        findings += tracker.update(batch, codes, list(batch.explanation), batch.score)
    assert findings == []
