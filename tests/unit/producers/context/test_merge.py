"""Merging what several sources say about a GPU, and the diff that decides what is published."""

from __future__ import annotations

from pipeline.events import Workload
from producers.context.merge import Changes, diff, merge, merge_observations

SLURM_JOB = Workload("unknown", job_id="4315", user="chen", source="slurm", tenant="assistant", job_gpus=2)
VLLM = Workload("llm-serving", source="process", confidence=0.7, model="Qwen/Qwen2.5-72B-Instruct", framework="vllm")
STATIC = Workload("rendering", job_id="farm", source="static", confidence=1.0, tenant="studio")
MANUAL = Workload("idle", source="manual", confidence=1.0)


def test_nothing_known() -> None:
    assert merge([]) is None


def test_scheduler_job_completed_by_process_inference() -> None:
    merged = merge([VLLM, SLURM_JOB])
    assert merged == Workload(
        "llm-serving",
        job_id="4315",
        user="chen",
        source="process",
        confidence=0.7,
        tenant="assistant",
        model="Qwen/Qwen2.5-72B-Instruct",
        framework="vllm",
        job_gpus=2,
    )


def test_scheduler_that_knows_the_class_keeps_it() -> None:
    declared = Workload("llm-pretraining", job_id="4242", source="slurm", confidence=0.95, job_gpus=12)
    merged = merge([VLLM, declared])
    assert merged is not None
    assert (merged.application, merged.source, merged.confidence) == ("llm-pretraining", "slurm", 0.95)
    # the process's framework and model describe a different application: not mixed in
    assert merged.framework is None and merged.model is None


def test_static_beats_scheduler_but_takes_its_job() -> None:
    merged = merge([SLURM_JOB, STATIC])
    assert merged is not None
    assert (merged.application, merged.source, merged.job_id, merged.user) == ("rendering", "static", "farm", "chen")


def test_manual_is_taken_as_is() -> None:
    assert merge([SLURM_JOB, VLLM, STATIC, MANUAL]) == MANUAL


def test_higher_confidence_wins_within_a_level() -> None:
    guessed = Workload("llm-serving", job_id="ns/a", source="kubernetes", confidence=0.5)
    declared = Workload("llm-finetuning", job_id="7", source="slurm", confidence=0.95)
    assert merge([guessed, declared]) == declared
    assert merge([declared, guessed]) == declared


def test_merge_observations_per_gpu() -> None:
    merged = merge_observations(
        {"slurm": {"GPU-a": SLURM_JOB, "GPU-b": SLURM_JOB}, "process": {"GPU-a": VLLM, "GPU-c": VLLM}}
    )
    assert list(merged) == ["GPU-a", "GPU-b", "GPU-c"]
    assert merged["GPU-a"].application == "llm-serving" and merged["GPU-a"].job_id == "4315"
    assert merged["GPU-b"] == SLURM_JOB and merged["GPU-c"] == VLLM


def test_diff() -> None:
    published = {"GPU-a": SLURM_JOB, "GPU-b": VLLM}
    desired = {"GPU-a": SLURM_JOB, "GPU-c": STATIC}
    assert diff(published, desired) == Changes({"GPU-c": STATIC}, ("GPU-b",))
    assert not diff(desired, desired)
    changed = {"GPU-a": Workload("unknown", job_id="4316", source="slurm")}
    assert diff(published, changed).upserts == changed
