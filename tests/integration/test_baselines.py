"""The Iterate loop on real Kafka + InfluxDB, through the real processor and sink processes: history written
through the pipeline is learned by ``hermeneut baselines train``, the running processor hot-reloads the new
version, the same raw values are judged normal under one application and anomalous under another (with an
explanation naming the application), a GPU no context source knows gets its application from the classifier,
a lasting anomaly becomes a finding, and operator feedback changes the next version's verdict on the same
values."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from pipeline.baselines import Feedback
from pipeline.codec import decode_record, encode_record
from pipeline.config import Settings
from pipeline.events import GpuContext, GpuSample, SampleBatch, Workload
from pipeline.publisher import Publisher
from pipeline.services.stages import Stage, wait_for
from processors.classify import MIN_SAMPLES
from producers.simulator import Fleet

from .harness import consume_all, publish_batches, running_pipeline, stored_points, wait_stored

pytestmark = pytest.mark.integration

H100 = "NVIDIA H100 80GB HBM3"
SERVING, TRAINING, UNLABELLED = "GPU-judge-serving", "GPU-judge-training", "GPU-judge-unlabelled"
#: seconds the training GPU runs typical training before it is judged
PRELUDE_S = 660


def _contexts(settings: Settings, contexts: list[GpuContext]) -> None:
    pub = Publisher(settings.kafka.client_config())
    for c in contexts:
        pub.publish(settings.topics.context, c.kafka_key, encode_record(c))
    assert pub.close(30) == 0


def _cli(settings: Settings, *args: str) -> str:
    result = CliRunner().invoke(cli, list(args), obj={"settings": settings}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _judge_rounds(settings: Settings, metrics: dict[str, float], start_ms: int, rounds: int) -> list[SampleBatch]:
    """The same raw values on two GPUs whose contexts name different applications, once a second."""
    return [
        SampleBatch(
            settings.cluster,
            "judge",
            tuple(
                GpuSample(settings.cluster, "judge", uuid, i, H100, (start_ms + r * 1000) * 1_000_000, metrics)
                for i, uuid in enumerate((SERVING, TRAINING))
            ),
        )
        for r in range(rounds)
    ]


#: written when they change (and every refresh period): a reader fills them forward per GPU
_ON_CHANGE = ("phase", "baseline", "user", "app_source", "app_confidence")


def _judged(settings: Settings, uuid: str, since_ms: int) -> list[dict[str, object]]:
    """The GPU's stored points since ``since_ms``, the fields written on change filled forward."""
    rows = sorted((r for r in stored_points(settings) if r["gpu"] == uuid), key=lambda r: r["_time"])
    known: dict[str, object] = {}
    out = []
    for r in rows:
        known |= {k: r[k] for k in _ON_CHANGE if r.get(k) not in (None, "")}
        out.append(dict(r) | known)
    return [r for r in out if r["_time"].timestamp() * 1000 >= since_ms]  # type: ignore[attr-defined]


def _wait_version(processor: Stage, version: int) -> None:
    assert wait_for(lambda: processor.stats().get("baselines_version") == version, 60), processor.stats()


def test_application_aware_verdicts_findings_feedback_and_hot_reload(settings: Settings, tmp_path: Path) -> None:
    # 4 nodes x 2 GPUs whose jobs do not change in these 200 s: one H100 serves an LLM, one trains a ResNet. A fleet
    # this small is its operator's to vouch for: a baseline learned from one GPU may condemn, and a 20 s streak is
    # a finding (the defaults want 4 GPUs and 5 minutes)
    baselines = settings.baselines.model_copy(update={"min_gpus": 1, "anomaly_after_s": 20.0})
    settings = settings.model_copy(update={"baselines": baselines})
    fleet = Fleet(4, 2, cluster=settings.cluster, seed=8)
    now_ms = time.time_ns() // 1_000_000
    history = [b for r in range(200) for b in fleet.tick((now_ms - 600_000 + r * 1000) * 1_000_000)]
    samples = [s for b in history for s in b.samples]
    runs = dict(zip(fleet.uuids, fleet.applications(), strict=True))
    serving = [s for s in samples if s.gpu_model == H100 and runs[s.gpu_uuid] == "llm-serving"]
    assert len(serving) == 200 and "resnet-training" in {runs[s.gpu_uuid] for s in samples if s.gpu_model == H100}
    # a real reading of the LLM-serving H100: the one at its median power
    central = sorted(serving, key=lambda s: s.metrics["power_watts"])[len(serving) // 2].metrics
    judges = [
        GpuContext(settings.cluster, "judge", uuid, now_ms * 10**6, Workload(app, source="static", confidence=1.0))
        for uuid, app in ((SERVING, "llm-serving"), (TRAINING, "resnet-training"))
    ]
    _contexts(settings, fleet.contexts(now_ms * 10**6) + judges)

    with running_pipeline(settings, tmp_path) as (processor, sink):
        # cold start: no baselines yet, everything is stored unscored, labelled with its application
        publish_batches(settings, history)
        wait_stored(sink, len(samples))
        stored = stored_points(settings)
        assert {r["verdict"] for r in stored} == {"unscored"}
        assert {r["application"] for r in stored} == set(runs.values())
        assert processor.stats().get("baselines_version") == 0

        out = _cli(
            settings, "baselines", "train", "--range", "1h", "--min-samples", "100", "--cluster", settings.cluster
        )
        assert "published version 1" in out, out
        assert f"llm-serving/{H100}/compute" in out and f"resnet-training/{H100}/compute" in out
        _wait_version(processor, 1)  # hot reload: same process, new version

        start = time.time_ns() // 1_000_000 - 45_000
        # the training GPU first trains as a ResNet trains, for longer than a job's start-up (an anomaly from a job's
        # first minutes is how the job runs, and no finding)
        trained = [s for s in samples if s.gpu_model == H100 and runs[s.gpu_uuid] == "resnet-training"]
        typical = sorted(trained, key=lambda s: s.metrics["power_watts"])[len(trained) // 2].metrics
        prelude = [
            SampleBatch(settings.cluster, "judge", (GpuSample(settings.cluster, "judge", TRAINING, 1, H100,
                                                              (start - r * 1000) * 10**6, typical),))
            for r in range(PRELUDE_S, 0, -1)
        ]  # fmt: skip
        publish_batches(settings, prelude)
        # and an LLM-serving GPU no context source knows: 40 of a real serving GPU's readings under a new uuid
        source = serving[0].gpu_uuid
        replay = [s.metrics for s in serving if s.gpu_uuid == source][:40]
        unlabelled = [
            SampleBatch(settings.cluster, "judge", (GpuSample(settings.cluster, "judge", UNLABELLED, 2, H100, ts, m),))
            for ts, m in (((start + r * 1000) * 10**6, m) for r, m in enumerate(replay))
        ]
        publish_batches(settings, _judge_rounds(settings, central, start, 40) + unlabelled)
        wait_stored(sink, len(samples) + PRELUDE_S + 120)
        assert wait_for(lambda: sink.stats().get("findings_written", 0) >= 1, 30), sink.stats()
        inferred = _judged(settings, UNLABELLED, start)
        assert len(inferred) == 40
        named = [r for r in inferred if r.get("application")]
        assert len(named) >= 40 - MIN_SAMPLES  # classified once its window holds enough samples
        for row in named:
            assert (row["application"], row["app_source"]) == ("llm-serving", "inferred")
            assert 0.6 <= float(row["app_confidence"]) <= 1.0  # type: ignore[arg-type]

        a, b = _judged(settings, SERVING, start), _judged(settings, TRAINING, start)
        assert len(a) == len(b) == 40
        for row in a:
            assert (row["verdict"], row["baseline"], row["application"]) == (
                "normal",
                f"llm-serving/{H100}/compute",
                "llm-serving",
            )
            assert "explanation" not in row or not row["explanation"]
        for row in b:
            assert (row["verdict"], row["baseline"]) == ("anomalous", f"resnet-training/{H100}/compute")
            assert "anomalous for ResNet training on H100 80GB HBM3 in compute" in str(row["explanation"])
            assert float(row["score"]) > float(a[0]["score"])  # type: ignore[arg-type]
        findings = stored_points(settings, "finding")
        assert {(f["gpu"], f["detector"]) for f in findings if f["detector"] == "baseline-anomaly"} == {
            (TRAINING, "baseline-anomaly")
        }
        assert "ResNet training" in str(next(f for f in findings if f["gpu"] == TRAINING)["summary"])

        bands = [r for r in stored_points_any(settings, "baseline") if r["application"] == "llm-serving"]
        power = [r for r in bands if r["gpu_model"] == H100 and r["feature"] == "power_ratio_of_limit"]
        assert len(power) == 1 and power[0]["version"] == 1.0
        assert power[0]["p05"] <= central["power_watts"] / central["power_limit_watts"] <= power[0]["p95"]
        listed = _cli(settings, "baselines", "list")
        assert listed.startswith("version 1") and f"llm-serving/{H100}/compute" in listed

        # an operator says the flagged values are fine; the next version must agree on the same values
        event = f"{TRAINING}@{start + 35_000}"
        out = _cli(settings, "feedback", event, "--not-anomalous", "--note", "serving traffic on a training pool")
        assert "recorded" in out and "(the pipeline said anomalous" in out
        (message,) = consume_all(settings, settings.topics.feedback, 1)
        fb = decode_record(Feedback, message.value() or b"")
        assert (message.key(), fb.verdict, fb.application, fb.gpu_model) == (
            event.encode(),
            "not-anomalous",
            "resnet-training",
            H100,
        )
        assert [r["verdict"] for r in stored_points_any(settings, "feedback")] == ["not-anomalous"]

        out = _cli(
            settings, "baselines", "train", "--range", "1h", "--min-samples", "100", "--cluster", settings.cluster
        )
        assert "published version 2" in out and "1 feedback events used" in out, out
        # the flagged GPU's finding is information (a baseline anomaly younger than half an hour), not a fault: its
        # rows are learned from, as the operator's verdict says they should be
        assert "; 0 excluded; 1 feedback events used" in out, out
        _wait_version(processor, 2)
        again = time.time_ns() // 1_000_000 - 4_000
        publish_batches(settings, _judge_rounds(settings, central, again, 3))
        wait_stored(sink, len(samples) + PRELUDE_S + 126)
        b = _judged(settings, TRAINING, again)
        assert [r["verdict"] for r in b] == ["normal"] * 3
    log = (tmp_path / "process.log").read_text()
    assert "switched to baselines version 1" in log and "switched to baselines version 2" in log


def stored_points_any(settings: Settings, measurement: str) -> list[dict[str, object]]:
    """Every point of a measurement that has no cluster tag (baseline bands), or of this test's cluster."""
    from sinks.query.store import flux_rows

    [rows] = flux_rows(
        settings,
        f'from(bucket: "{settings.influxdb.bucket}") |> range(start: 0) '
        f'|> filter(fn: (r) => r._measurement == "{measurement}") '
        '|> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value") |> group()',
    )
    return [r for r in rows if r.get("cluster", settings.cluster) == settings.cluster]


def test_training_one_cluster_keeps_every_other_clusters_baselines(settings: Settings, tmp_path: Path) -> None:
    # two clusters running the same applications on the same models: their baselines share ids
    from dataclasses import replace

    from hermeneut.jobs.training import previous_version

    mine, other = settings.cluster, f"{settings.cluster}-b"
    now_ms = time.time_ns() // 1_000_000
    fleets = {mine: Fleet(4, 2, cluster=mine, seed=8), other: Fleet(4, 2, cluster=other, seed=9)}
    history = [b for f in fleets.values() for r in range(200) for b in f.tick((now_ms - 600_000 + r * 1000) * 10**6)]
    _contexts(settings, [c for f in fleets.values() for c in f.contexts(now_ms * 10**6)])
    with running_pipeline(settings, tmp_path) as (processor, sink):
        publish_batches(settings, history)
        wait_stored(sink, sum(len(b.samples) for b in history))

        out = _cli(settings, "baselines", "train", "--range", "1h", "--min-samples", "100", "--cluster", mine)
        assert "published version 1" in out and "kept" not in out, out
        manifest, v1, _ = previous_version(settings)
        assert manifest is not None and v1 and all(r.clusters == (mine,) for r in v1.values())

        out = _cli(settings, "baselines", "train", "--range", "1h", "--min-samples", "100", "--cluster", other)
        assert "published version 2" in out and f"kept {len(v1)} baselines of other clusters" in out, out
        manifest, v2, _ = previous_version(settings)
        assert manifest is not None and manifest.version == 2
        for key, record in v1.items():  # every baseline of the first cluster, unchanged but for the version
            assert v2[key] == replace(record, version=2), key
        learned = {k: r for k, r in v2.items() if k not in v1}
        assert learned and all(r.clusters == (other,) for r in learned.values())
        assert {r.baseline_id for r in learned.values()} & {r.baseline_id for r in v1.values()}  # ids shared
        _wait_version(processor, 2)  # the processor takes the merged version whole
        listed = _cli(settings, "baselines", "list")
        assert listed.startswith("version 2") and all(key in listed for key in v2)
