"""Right-sizing advice: the smaller slice of GPU a job needs (MIG, packing, a smaller GPU, a split)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.catalogue import PUBLISHED_LINKS, lookup, model_dims
from pipeline.topology import LinkTiming
from pipeline.usage import UsageStats
from processors.rightsize import (
    Link,
    catalogue_link,
    data_split,
    measured_links,
    pipeline_split,
    recommend,
    tensor_split,
)

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


def test_a_model_too_big_for_the_smaller_gpus_is_priced_as_a_split_and_shown_as_the_trade_it_is() -> None:
    """70 GiB on an H100 at 20% compute: memory-bound, so kept, but the split over smaller GPUs is priced, from
    the model's dimensions, on the link measured for that GPU model."""
    llama = model_dims("llama3-8b")
    assert llama is not None
    measured = {"NVIDIA L40S": Link("pcie", 20e9, 10e-6, "measured", 6e-6)}
    rec = recommend(stats(mem_gib=70.0, util=20.0, power=250.0), model=llama, tokens=512, measured=measured)
    assert rec.options[0].kind == "keep"
    split = next(o for o in rec.options if o.kind == "split")
    # need max(68.6 x 1.2, 73.5) = 82.3 GiB: 2 x L40S (48 GiB) is the fewest; one cut hands on 512 x 4096 x 2 bytes
    assert split.target == "2 x NVIDIA L40S"
    assert split.extra_step_s == pytest.approx(512 * 4096 * 2 / 20e9 + 10e-6 + 6e-6)
    # two GPUs for the one it holds: twice the GPU-hours, never printed as a saving
    assert split.saved_gpu_hours == pytest.approx(-100.0) and "a trade, not a saving" in split.detail


def test_cost_terms_per_parallelism_kind() -> None:
    """Each kind = bytes / bandwidth + hops x latency + hops x overhead, with its own bytes and hops."""
    link = Link("nvlink", 100e9, 2e-6, "test", 6e-6)
    gpt2 = model_dims("gpt2")
    assert gpt2 is not None
    act = 52 * 768 * 4
    one = pipeline_split(gpt2, 52, 1, link)
    assert one.total_s == 0.0 and one.hops == 0
    p = pipeline_split(gpt2, 52, 4, link, training=True)  # 3 cuts, there and back
    assert (p.hops, p.bytes_moved) == (6, 6 * act)
    assert p.total_s == pytest.approx(6 * act / 100e9 + 6 * 2e-6 + 6 * 6e-6)
    assert p.per_added_gpu_s == pytest.approx(p.total_s / 3)
    t = tensor_split(gpt2, 52, 4, link)  # 2 ring all-reduces per layer: 2 x 3/4 of the bytes in 2 x 3 hops each
    assert (t.hops, t.bytes_moved) == (12 * 2 * 6, pytest.approx(12 * 2 * 1.5 * act))
    d = data_split(gpt2, 2, link)
    assert d.hops == 2 and d.bytes_moved == pytest.approx(gpt2.params * 4)
    assert "6 x 2.0 us latency + 6 x 6.0 us overhead" in p.terms()


def test_catalogue_links_carry_published_latency_and_overhead() -> None:
    h100, a10g, gtx = lookup(H100), lookup("NVIDIA A10G"), lookup("NVIDIA GeForce GTX 1080 Ti")
    assert h100 is not None and a10g is not None and gtx is not None
    assert catalogue_link(h100).bytes_per_second == 18 * 25e9
    assert catalogue_link(h100).latency_s == PUBLISHED_LINKS["nvlink"].latency_s
    assert catalogue_link(a10g).kind == "pcie" and catalogue_link(a10g).bytes_per_second == pytest.approx(1.969 * 16e9)
    # a GeForce board has no peer access: its copies are staged through the host, at the posted 1080 Ti figures
    assert catalogue_link(gtx).kind == "pcie-staged" and catalogue_link(gtx).overhead_s > 0


def test_no_option_prints_a_saving_that_is_not_one() -> None:
    """Real serving data was offered "split: 2 x NVIDIA A30, saves 0.65 GPU-h" for one-GPU jobs: a board-power
    share printed as GPU-hours. Two GPUs for one is more GPU-hours; one smaller GPU for one is the same."""
    a100 = "NVIDIA A100-SXM4-40GB"
    rec = recommend(dataclasses.replace(stats(mem_gib=30.0, util=20.0, power=120.0, model=a100), power_p95_watts=None))
    split = next(o for o in rec.options if o.kind == "split")
    # 2 x the largest smaller board of its class (a V100 32 GB; A30 and A10G would need 2 as well)
    assert split.target == "2 x Tesla V100-SXM2-32GB" and split.saved_gpu_hours == pytest.approx(-100.0)
    assert "a trade, not a saving" in split.detail and "saves" not in split.detail
    assert rec.options[-1] is split  # a trade comes last
    smaller = recommend(stats(mem_gib=10.0, util=25.0, power=120.0, model="NVIDIA L40S"))
    assert next(o for o in smaller.options if o.kind == "smaller-gpu").saved_gpu_hours == 0.0
    assert "power p95 not reported" in rec.summary and " 0 W" not in rec.summary


def test_the_three_questions_are_answered_per_job() -> None:
    """A 30 GiB job on an A100 40 GB: no MIG profile or smaller board of its class holds it alone; 2 x A30 or
    2 x V100 do; each added GPU costs, per link kind, what the model hands on over it."""
    a100 = "NVIDIA A100-SXM4-40GB"
    gpt2 = model_dims("gpt2-xl")
    assert gpt2 is not None
    links = {"nvlink": Link("nvlink", 50e9, 2e-6, "t", 6e-6), "pcie": Link("pcie", 10e9, 16e-6, "t", 6e-6)}
    rec = recommend(stats(mem_gib=30.0, util=20.0, power=120.0, model=a100), model=gpt2, tokens=100, links=links)
    q = rec.answers
    assert q is not None
    assert q.priced == next(o.target for o in rec.options if o.kind == "split")  # the split offered is the one priced
    assert q.smallest == a100 and "no smaller GPU" in q.smallest_detail
    assert dict(q.splits)["NVIDIA A30"] == 2 and q.priced.startswith("2 x ")
    by = {(c.link.kind, c.parallelism): c for c in q.costs}
    assert set(by) == {(k, p) for k in links for p in ("pipeline", "tensor")}  # serving: no gradients
    assert by["pcie", "pipeline"].total_s == pytest.approx(100 * 1600 * 4 / 10e9 + 16e-6 + 6e-6)
    assert "model gpt2-xl" in q.cost_note
    # a small job: a MIG profile holds it, no split is needed
    small = recommend(stats(mem_gib=7.0, util=20.0, power=180.0, sm=10.0)).answers
    assert small is not None and small.smallest == f"{H100} MIG 1g.10gb" and small.splits == ()
    assert small.cost_note == f"no split needed: {H100} MIG 1g.10gb holds it"
    mystery = dataclasses.replace(stats(mem_gib=7.0, util=20.0, power=180.0, sm=10.0), gpu_model="Mystery GPU")
    unknown = recommend(mystery).answers
    assert unknown is not None and unknown.smallest == "Mystery GPU" and "not in the catalogue" in unknown.cost_note


def test_without_dimensions_the_split_is_priced_from_measured_traffic_or_says_what_is_missing() -> None:
    a100 = "NVIDIA A100-SXM4-40GB"
    base = stats(mem_gib=30.0, util=20.0, power=120.0, model=a100)
    bare = recommend(base).answers
    assert bare is not None and bare.costs == () and "--model" in bare.cost_note and "us" in bare.cost_note
    seen = recommend(dataclasses.replace(base, nvlink_p99_bytes_per_second=5e9)).answers
    assert seen is not None and {c.bytes_from for c in seen.costs} == {"measured NVLink traffic (per second of run)"}
    c = next(c for c in seen.costs if c.link.kind == "pcie-staged")
    assert c.total_s == pytest.approx(5e9 / PUBLISHED_LINKS["pcie-staged"].bytes_per_second) and c.hops == 0


def test_probe_timings_become_the_links_of_their_kind() -> None:
    """d2d readings per kind, the median pair; the CPU path's host copies are no GPU link."""
    timings = [
        LinkTiming("G0", "G1", "d2d", "nvlink", 40e9, 3e-6, 7e-6, 8, "probe"),
        LinkTiming("G1", "G0", "d2d", "nvlink", 41e9, 2e-6, 7e-6, 8, "probe"),
        LinkTiming("G0", "G2", "d2d", "nvlink", 39e9, 9e-6, 7e-6, 8, "probe"),
        LinkTiming("G0", "G1", "d2h2d", "pcie-staged", 9e9, 20e-6, 12e-6, 8, "probe"),
        LinkTiming("host", "host", "host", "host", 10e9, 0.0, 2e-6, 8, "probe"),
    ]
    links = measured_links(timings)
    assert set(links) == {"nvlink"}
    assert links["nvlink"].latency_s == 3e-6 and "3 GPU pair(s)" in links["nvlink"].source


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
