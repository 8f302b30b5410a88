"""Enrichment: workload from the context mirror (or inferred when there is none), phase per row, and relative
values filled from the catalogue where a sample lacks its limit."""

from __future__ import annotations

import dataclasses

import numpy as np

from pipeline.baselines import BaselineManifest
from pipeline.codec import encode_record, encode_samples
from pipeline.config import ValidationSettings
from pipeline.events import RELATIVE_FIELDS, GpuContext, GpuSample, SampleBatch, Workload, gpu_key
from pipeline.mirror import TopicMirror
from processors.baselines.store import BaselineSet
from processors.classify import MIN_SAMPLES, fit_classifier, history_windows, window_inputs
from processors.enrich import ContextTimeline, Enricher, context_record
from processors.features import FEATURE_INDEX, PHASE_INDEX, features, infer_phase
from processors.normalize import RawMessage, process_raw
from producers.simulator import Fleet

from .history import T0, labelled_history

H100 = "NVIDIA H100 80GB HBM3"


def _normalized(*samples: GpuSample) -> tuple:  # type: ignore[type-arg]
    batch = SampleBatch("c", "n", samples)
    out = process_raw([RawMessage(batch.kafka_key, encode_samples(batch), "t/0/0")], T0, ValidationSettings())
    return out.forward[0][1]


def test_context_wins_and_missing_context_is_inferred() -> None:
    h = labelled_history(seed=1, nodes=20, rounds=80)
    windows, ends = history_windows(h.f, h.gpu, h.ts_ns, 20, 5)
    classifier = fit_classifier(window_inputs(windows), h.application[ends], 1, 20, 0.6)
    assert classifier is not None
    baselines = BaselineSet(BaselineManifest(1, 0, 0, 0, (), classifier=True), [], classifier)
    withheld = set(h.fleet.uuids[::2])  # every other GPU has no context
    contexts: dict[bytes, GpuContext] = {}
    enricher = Enricher(contexts.get, lambda: baselines)
    right = total = 0
    for r, (batch, apps) in enumerate(zip(h.batches[:40], h.batch_apps[:40], strict=True)):
        # what a scheduler integration publishes: the job on each GPU, None where nothing runs
        for uuid, node, app in zip(batch.gpu_uuid, batch.node, apps, strict=True):
            if uuid not in withheld:
                workload = None if app == "idle" else Workload(app, source="slurm", confidence=1.0)
                contexts[gpu_key(batch.cluster[0], node, uuid)] = GpuContext(batch.cluster[0], node, uuid, T0, workload)
        out, findings = enricher.apply(batch, 0)
        assert findings == []
        for i, uuid in enumerate(out.gpu_uuid):
            w = out.workload[i]
            if uuid not in withheld:
                assert w is not None and w.source in ("slurm", "context")
                assert w.application == apps[i]
            elif r + 1 < MIN_SAMPLES:
                assert w is None
            else:
                assert w is not None and w.source == "inferred" and 0 < w.confidence <= 1
                right += w.application == apps[i]
                total += 1
    assert total and right / total >= 0.9


def test_without_a_classifier_gpus_without_context_stay_unknown() -> None:
    h = labelled_history(seed=3, nodes=2, rounds=2)
    out, _ = Enricher(lambda _key: None, lambda: None).apply(h.batches[0], 0)
    assert set(out.workload) == {None}
    assert all(p is not None for p in out.phase)


def test_nothing_running_means_idle() -> None:
    sample = GpuSample("c", "n", "GPU-1", 0, H100, T0, {"utilization_gpu_percent": 0.0, "power_watts": 70.0})
    context = GpuContext("c", "n", "GPU-1", T0, None)
    out, _ = Enricher({gpu_key("c", "n", "GPU-1"): context}.get, lambda: None).apply(_normalized(sample), 0)
    assert out.workload[0] == Workload("idle", source="context", confidence=1.0)
    assert out.phase == ("idle",)


def test_missing_limits_come_from_the_catalogue_and_metrics_stay_as_reported() -> None:
    # a dcgm-exporter style sample: no power limit, no memory total, no clock maximum
    sample = GpuSample(
        "c", "n", "GPU-1", 0, H100, T0,
        {"power_watts": 350.0, "memory_used_bytes": float(40 * 2**30), "sm_clock_mhz": 990.0},
    )  # fmt: skip
    batch = _normalized(sample)
    assert np.isnan(batch.relative).all()
    out, _ = Enricher(lambda _k: None, lambda: None).apply(batch, 0)
    rel = dict(zip(RELATIVE_FIELDS, out.relative[0].tolist(), strict=True))
    assert rel["power_ratio_of_limit"] == 0.5
    assert rel["memory_used_ratio"] == 0.5
    assert rel["sm_clock_ratio_of_max"] == 0.5
    assert np.array_equal(out.metrics, batch.metrics, equal_nan=True)


def test_own_limits_win_over_the_catalogue() -> None:
    capped = GpuSample("c", "n", "GPU-1", 0, H100, T0, {"power_watts": 350.0, "power_limit_watts": 400.0})
    out, _ = Enricher(lambda _k: None, lambda: None).apply(_normalized(capped), 0)
    assert out.relative[0, 0] == 350.0 / 400.0


def test_phases_from_the_telemetry() -> None:
    gen5 = {"pcie_link_gen_max": 5.0, "pcie_link_width_max": 16.0, "power_limit_watts": 700.0}
    link = 3.938e9 * 16
    cases = {
        "compute": {"utilization_gpu_percent": 97.0, "power_watts": 600.0, "pcie_rx_bytes_per_second": 0.3 * link},
        "data-loading": {"utilization_gpu_percent": 10.0, "power_watts": 200.0, "pcie_rx_bytes_per_second": 0.4 * link},
        "checkpoint": {
            "utilization_gpu_percent": 5.0,
            "power_watts": 150.0,
            "pcie_tx_bytes_per_second": 0.5 * link,
            "memory_used_bytes": float(70 * 2**30),
            "memory_total_bytes": float(80 * 2**30),
        },
        "idle": {"utilization_gpu_percent": 0.0, "power_watts": 70.0},
    }
    samples = [GpuSample("c", "n", f"GPU-{i}", i, H100, T0, gen5 | m) for i, m in enumerate(cases.values())]
    batch = _normalized(*samples)
    f = features(batch.metrics, batch.relative, batch.gpu_model)
    assert f[1, FEATURE_INDEX["pcie_rx_ratio_of_capacity"]] == 0.4
    assert infer_phase(f).tolist() == [PHASE_INDEX[p] for p in cases]
    reported = dataclasses.replace(batch, phase=("eval", None, None, None))
    out, _ = Enricher(lambda _k: None, lambda: None).apply(reported, 0)
    assert out.phase == ("eval", "data-loading", "checkpoint", "idle")  # a reported phase is kept


def test_link_traffic_is_relative_to_the_links_the_gpu_has() -> None:
    traffic = {"nvlink_rx_bytes_per_second": 90e9, "pcie_rx_bytes_per_second": 3.938e9 * 16 / 4}
    catalogue = GpuSample("c", "n", "GPU-1", 0, H100, T0, traffic)
    reported = GpuSample("c", "n", "GPU-2", 1, H100, T0, traffic | {"nvlink_links_max": 6.0})
    batch = _normalized(catalogue, reported)
    f = features(batch.metrics, batch.relative, batch.gpu_model)
    assert f[:, FEATURE_INDEX["nvlink_rx_ratio_of_capacity"]].tolist() == [0.2, 0.6]  # 18 x 25 GB/s, 6 x 25 GB/s
    assert f[:, FEATURE_INDEX["pcie_rx_ratio_of_capacity"]].tolist() == [0.25, 0.25]  # gen 5 x16 from the catalogue
    pcie_card = _normalized(GpuSample("c", "n", "GPU-3", 0, "NVIDIA L40S", T0, traffic))
    assert np.isnan(
        features(pcie_card.metrics, pcie_card.relative, pcie_card.gpu_model)[
            0, FEATURE_INDEX["nvlink_rx_ratio_of_capacity"]
        ]
    )


def test_a_backlog_is_labelled_with_the_job_that_ran_then() -> None:
    # a processor behind its input: the context topic already says job-2 (and a job-3 that starts later)
    s = 1_000_000_000
    key = gpu_key("c", "n", "GPU-1")
    first = GpuContext("c", "n", "GPU-1", T0, Workload("llm-pretraining", job_id="job-1"))
    second = GpuContext("c", "n", "GPU-1", T0 + 60 * s, Workload("cv-inference", job_id="job-2"))
    third = GpuContext("c", "n", "GPU-1", T0 + 120 * s, None)
    timeline = ContextTimeline()
    for context in (first, second, third):  # what the mirror's reader thread sees, in topic order
        timeline.see(key, context)
    latest = {key: third}
    samples = [
        GpuSample("c", "n", "GPU-1", 0, H100, T0 + t * s, {"utilization_gpu_percent": 90.0, "power_watts": 500.0})
        for t in (-5, 10, 59, 60, 119, 125)
    ]
    out, _ = Enricher(latest.get, lambda: None, timeline).apply(_normalized(*samples), 0)
    apps = [w.application if w is not None else None for w in out.workload]
    # before the first context known: the oldest known one; from each context's own time on: that context
    assert apps == ["llm-pretraining", "llm-pretraining", "llm-pretraining", "cv-inference", "cv-inference", "idle"]


def test_the_timeline_keeps_the_latest_few_and_forgets_a_deleted_gpu() -> None:
    key = gpu_key("c", "n", "GPU-1")
    timeline = ContextTimeline(keep=3)
    contexts = [GpuContext("c", "n", "GPU-1", T0 + i, Workload(f"app-{i}")) for i in range(5)]
    for c in reversed(contexts):  # out of order: sorted by their own time
        timeline.see(key, c)
    at = timeline.at(key, np.array([T0, T0 + 2, T0 + 3, T0 + 9], dtype=np.int64))
    assert [c.workload.application if c and c.workload else None for c in at] == ["app-2", "app-2", "app-3", "app-4"]
    again = GpuContext("c", "n", "GPU-1", T0 + 4, Workload("app-4-corrected"))
    timeline.see(key, again)  # the same time re-published: the latest word on it
    assert timeline.at(key, np.array([T0 + 4], dtype=np.int64)) == [again]
    timeline.see(key, None)
    assert timeline.at(key, np.array([T0 + 4], dtype=np.int64)) == [None]


def test_a_replay_batch_is_classified_as_its_rounds_were_live() -> None:
    h = labelled_history(seed=1, nodes=20, rounds=80)
    windows, ends = history_windows(h.f, h.gpu, h.ts_ns, 20, 5)
    classifier = fit_classifier(window_inputs(windows), h.application[ends], 1, 20, 0.6)
    assert classifier is not None
    baselines = BaselineSet(BaselineManifest(1, 0, 0, 0, (), classifier=True), [], classifier)
    fleet = Fleet(4, 4, seed=2)  # jobs start and end within these rounds
    rounds = [[RawMessage(b.kafka_key, encode_samples(b), "t/0/0") for b in fleet.tick(T0 + r * 10**9)]
              for r in range(150)]  # fmt: skip
    live = Enricher(lambda _k: None, lambda: baselines)
    one_by_one = [
        w for r, messages in enumerate(rounds)
        for _, b in process_raw(messages, T0 + r * 10**9, ValidationSettings()).forward
        for w in live.apply(b, 0)[0].workload
    ]  # fmt: skip
    ((_, backlog),) = process_raw([m for ms in rounds for m in ms], T0 + 150 * 10**9, ValidationSettings()).forward
    replayed = Enricher(lambda _k: None, lambda: baselines).apply(backlog, 0)[0].workload
    assert len({w.application for w in one_by_one if w is not None}) > 1
    assert list(replayed) == one_by_one  # row for row: same order (node rounds in arrival order), same labels


def test_features_are_computed_once_and_travel_on_the_batch() -> None:
    # a dcgm-exporter style sample without a power limit: the catalogue's fills the ratio the features read
    sample = GpuSample("c", "n", "GPU-1", 0, H100, T0, {"power_watts": 350.0, "utilization_gpu_percent": 90.0})
    batch = _normalized(sample)
    assert batch.features is None
    out, _ = Enricher(lambda _k: None, lambda: None).apply(batch, 0)
    assert out.features is not None
    assert np.array_equal(out.features, features(out.metrics, out.relative, out.gpu_model), equal_nan=True)
    assert out.features[0, FEATURE_INDEX["power_ratio_of_limit"]] == 0.5


def test_every_job_of_a_long_backlog_labels_exactly_its_own_rows() -> None:
    # an import (or a processor catching up) with far more job changes per GPU than a few: the mirror has read
    # all of them before the first row is labelled, and each still labels exactly the rows of its range
    key = gpu_key("c", "n", "GPU-1")
    timeline = ContextTimeline()
    start = T0 - 1000 * 10**9
    jobs = [GpuContext("c", "n", "GPU-1", start + j * 10 * 10**9, Workload("llm-serving", job_id=f"job-{j}"))
            for j in range(100)]  # fmt: skip
    for context in jobs:
        timeline.see(key, context, context.ts_ns)
    samples = [
        GpuSample("c", "n", "GPU-1", 0, H100, start + t * 10**9, {"utilization_gpu_percent": 50.0}) for t in range(1000)
    ]
    enricher = Enricher(lambda _k: jobs[-1], lambda: None, timeline)
    labelled = [
        w.job_id if w is not None else None
        for chunk in range(0, 1000, 250)
        for w in enricher.apply(_normalized(*samples[chunk : chunk + 250]), 0)[0].workload
    ]
    assert labelled == [f"job-{t // 10}" for t in range(1000)]


def test_a_tombstone_ends_its_context_at_the_time_it_was_published() -> None:
    key = gpu_key("c", "n", "GPU-1")
    timeline = ContextTimeline()
    job = GpuContext("c", "n", "GPU-1", T0, Workload("llm-finetuning", job_id="ft-1"))
    timeline.see(key, job, T0)
    timeline.see(key, None, T0 + 60 * 10**9)  # the job ended: nobody knows what runs from then on
    at = timeline.at(key, np.array([T0 + 10**9, T0 + 59 * 10**9, T0 + 61 * 10**9], dtype=np.int64))
    assert at == [job, job, None]


def test_the_timeline_drops_what_no_row_to_come_can_need() -> None:
    key = gpu_key("c", "n", "GPU-1")
    timeline = ContextTimeline()
    contexts = [GpuContext("c", "n", "GPU-1", T0 + i * 10**9, Workload(f"app-{i}")) for i in range(10)]
    for c in contexts:
        timeline.see(key, c)
    timeline.at(key, np.array([T0 + 5 * 10**9], dtype=np.int64))  # rows up to app-5's time are labelled
    # rows arrive in time order per GPU: app-0..4 cannot be needed again; an older row gets the oldest kept
    assert timeline.at(key, np.array([T0, T0 + 9 * 10**9], dtype=np.int64)) == [contexts[5], contexts[9]]


def test_a_context_whose_application_cannot_be_stored_is_read_as_unknown_with_its_job() -> None:
    """Applied as sent, an application ending in a backslash cost every sample of its GPU at the sink (a tag line
    protocol cannot carry); the GPU's job and time stay as sent, what runs there is not claimed."""
    for bad in ("llm-pretraining\\", "\r\n", "x" * 300):
        sent = GpuContext("c", "n", "GPU-1", T0, Workload(bad, job_id="job-37", source="slurm", confidence=0.95))
        read = context_record(encode_record(sent))
        assert read.workload == Workload("unknown", job_id="job-37", source="slurm", confidence=0.0)
        assert (read.cluster, read.node, read.gpu_uuid, read.ts_ns) == ("c", "n", "GPU-1", T0)
    for good in (GpuContext("c", "n", "GPU-1", T0, Workload("llm\\serving", job_id="j")),
                 GpuContext("c", "n", "GPU-1", T0, Workload("", job_id="j")),
                 GpuContext("c", "n", "GPU-1", T0, None)):  # fmt: skip
        assert context_record(encode_record(good)) == good


def test_a_context_record_that_does_not_decode_clears_its_gpu_from_when_it_was_published() -> None:
    """The context mirror takes an undecodable record as a tombstone (``invalid_clears``): rows from its publication
    on carry no context (inferred), not the workload it replaced."""
    timeline = ContextTimeline()
    mirror = TopicMirror({}, "context", context_record, on_record=timeline.see, invalid_clears=True)
    key = gpu_key("c", "n", "GPU-1")
    mirror._apply(key, encode_record(GpuContext("c", "n", "GPU-1", T0, Workload("llm-serving", job_id="a"))), "t/0/0",
                  T0)  # fmt: skip
    mirror._apply(key, b"\x93not a record", "t/0/1", T0 + 60 * 10**9)
    assert mirror.invalid == 1 and mirror.get(key) is None
    before, after = timeline.at(key, np.array([T0 + 30 * 10**9, T0 + 90 * 10**9]))
    assert before is not None and before.workload is not None and before.workload.job_id == "a"
    assert after is None
