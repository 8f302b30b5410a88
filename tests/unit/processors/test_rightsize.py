"""Right-sizing advice: the smaller slice of GPU a job needs (MIG, packing, a smaller GPU, a split)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.catalogue import lookup
from pipeline.usage import UsageStats
from processors.rightsize import Link, catalogue_link, recommend, split_extra_s

GIB = 2**30
H100 = "NVIDIA H100 80GB HBM3"


def stats(mem_gib: float, util: float, power: float, model: str = H100, sm: float | None = None) -> UsageStats:
    spec = lookup(model)
    assert spec is not None
    return UsageStats(
        "job-1", "job", "llm-serving", model, 1, 1, 100.0, float(spec.memory_bytes), mem_gib * GIB,
        mem_gib * 0.95 * GIB, mem_gib * 0.98 * GIB, util, power, spec.power_default_watts, sm,
    )  # fmt: skip


def test_small_job_on_h100_gets_a_mig_profile_and_wasted_hours() -> None:
    rec = recommend(stats(mem_gib=7.0, util=20.0, power=180.0, sm=10.0))
    best = rec.options[0]
    assert best.kind == "mig" and best.target == "1g.10gb"
    # need: max(p99 x 1.2, peak x 1.05) = 8.23 GiB of 80 GiB; compute 10% x 1.2 = 12% <= 1/7 of the SMs
    assert rec.used_share == pytest.approx(0.12)
    assert rec.wasted_gpu_hours == pytest.approx(100 * (1 - 0.12))
    assert best.saved_gpu_hours == pytest.approx(100 * 6 / 7)
    # packing 8 per GPU would save a little more (87.5 h) but MIG isolates: preferred within one slice
    assert next(o for o in rec.options if o.kind == "pack").saved_gpu_hours == pytest.approx(87.5)
    assert "1g.10gb" in rec.summary and "wasted" in rec.summary
    assert {o.kind for o in rec.options} >= {"mig", "pack"}


def test_busy_job_is_kept() -> None:
    rec = recommend(stats(mem_gib=70.0, util=97.0, power=650.0))
    assert [o.kind for o in rec.options] == ["keep"] and rec.wasted_gpu_hours < 20


def test_memory_heavy_light_compute_job_on_a_non_mig_gpu_is_packed_or_moved() -> None:
    rec = recommend(stats(mem_gib=10.0, util=25.0, power=120.0, model="NVIDIA L40S"))
    kinds = {o.kind: o for o in rec.options}
    assert "mig" not in kinds
    assert kinds["pack"].target == "3 jobs per GPU"  # memory 26% and compute 30% of the GPU each
    assert kinds["smaller-gpu"].target == "NVIDIA A10G"  # 22.5 GiB holds 12.3 GiB; 300 W >= 1.2 x 120 W


def test_a_model_too_big_for_the_smaller_gpus_is_priced_as_a_split() -> None:
    """70 GiB on an H100 at 20% compute: memory-bound, so kept, but the split over smaller GPUs is priced."""
    rec = recommend(
        stats(mem_gib=70.0, util=20.0, power=250.0),
        exchange_bytes=512 * 2**20,
        measured={"NVIDIA L40S": Link("pcie", 20e9, 10e-6, "measured")},
    )
    assert rec.options[0].kind == "keep"
    split = next(o for o in rec.options if o.kind == "split")
    # need max(68.6 x 1.2, 73.5) = 82.3 GiB: 2 x L40S (48 GiB, 350 W) draws the least board power of the fits
    assert split.target == "2 x NVIDIA L40S"
    assert split.extra_step_s == pytest.approx(512 * 2**20 / 20e9 + 2 * 10e-6)
    assert "over pcie at 20 GB/s (measured)" in split.detail and "2 x 350 W board power vs 700 W" in split.detail


def test_split_cost_formula_and_catalogue_links() -> None:
    link = Link("nvlink", 100e9, 5e-6, "catalogue")
    assert split_extra_s(1e9, 1, link) == 0.0
    assert split_extra_s(1e9, 2, link) == pytest.approx(1e9 / 100e9 + 2 * 5e-6)
    h100, a10g = lookup(H100), lookup("NVIDIA A10G")
    assert h100 is not None and a10g is not None
    assert catalogue_link(h100).bytes_per_second == 18 * 25e9
    assert catalogue_link(a10g).kind == "pcie" and catalogue_link(a10g).bytes_per_second == pytest.approx(1.969 * 16e9)


def test_no_split_that_costs_more_and_no_power_printed_as_zero() -> None:
    """70 GiB on an A100 80 GB (400 W) at 20% compute: 2 x L40S (700 W) would draw more than it saves, so it is no
    alternative; a source without power readings says so instead of "0 W"."""
    a100 = "NVIDIA A100-SXM4-80GB"
    rec = recommend(dataclasses.replace(stats(mem_gib=70.0, util=20.0, power=250.0, model=a100), power_p95_watts=None))
    assert all(o.saved_gpu_hours >= 0 for o in rec.options)
    assert "split" not in {o.kind for o in rec.options}
    assert "power p95 not reported" in rec.summary and " 0 W" not in rec.summary


def test_idle_time_is_waste_as_the_finding_counts_it_and_a_job_idle_a_third_of_the_time_is_told_to_release() -> None:
    """The serving trace of issue 11: GPUs full of a model (memory p99 70 of 80 GiB), busy when busy, but held idle
    for 40 of 100 GPU-hours. Right-sizing said 'keep, 0.0 wasted' while the idle detector counted the idle hours."""
    rec = recommend(dataclasses.replace(stats(mem_gib=70.0, util=97.0, power=650.0), idle_gpu_hours=40.0))
    assert rec.wasted_gpu_hours == pytest.approx(40.0 + 60.0 * (1 - rec.used_share))
    best = rec.options[0]
    assert (
        best.kind == "release" and best.saved_gpu_hours == 40.0 and "idle (under 5% utilization) for 40%" in best.detail
    )
    assert "(40.0 idle)" in rec.summary
    # a job that was never idle has no idle hours to give back
    busy = recommend(stats(mem_gib=70.0, util=97.0, power=650.0))
    assert [o.kind for o in busy.options] == ["keep"]
