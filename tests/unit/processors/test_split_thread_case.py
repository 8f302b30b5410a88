"""The forum thread's measurement as an acceptance case for the split model (issue 43).

GPT-2 small cut into two halves on two GeForce GTX 1080 Ti over PCIe 3.0 x16, inputs of 12, 52 and 512 tokens, three
runs each (ms, the thread's ranges): one GPU 162.97-166.48 / 159.59-163.41 / 177.95-179.44, split 169.39-171.46 /
162.84-166.58 / 182.38-185.72; about +5 ms (+3%) per split, and the author's extrapolation to 12 GPUs about 226 ms
(+36%). The prediction uses only the catalogue's GPT-2 dimensions and the published link figures
(pipeline.catalogue.PUBLISHED_LINKS, each with its source): nothing here is fitted to the thread's numbers.

Result: the published figures do NOT get within a factor of 2. One hand-off of 36 KiB to 1.5 MiB costs 26-188 us
by them; the thread measured 3.2-5.7 ms. The acceptance test says so (a strict xfail: it fails the suite the day
the prediction gets within 2x without this test being updated)."""

from __future__ import annotations

import pytest

from pipeline.catalogue import PUBLISHED_LINKS, lookup, model_dims
from processors.rightsize import catalogue_link, pipeline_split

#: tokens -> (one GPU, split) as (low, high) ms over the thread's three runs
THREAD_MS = {
    12: ((162.97, 166.48), (169.39, 171.46)),
    52: ((159.59, 163.41), (162.84, 166.58)),
    512: ((177.95, 179.44), (182.38, 185.72)),
}


def _mid(r: tuple[float, float]) -> float:
    return (r[0] + r[1]) / 2


def measured_extra_ms(tokens: int) -> float:
    one, split = THREAD_MS[tokens]
    return _mid(split) - _mid(one)


def predicted(tokens: int, k: int = 2) -> float:
    """Predicted extra ms per forward pass for a pipeline split of GPT-2 small over k GTX 1080 Ti (one hand-off
    per cut: inference)."""
    gpt2, gtx = model_dims("gpt2"), lookup("NVIDIA GeForce GTX 1080 Ti")
    assert gpt2 is not None and gtx is not None
    return pipeline_split(gpt2, tokens, k, catalogue_link(gtx)).total_s * 1e3


def test_the_prediction_is_built_from_the_model_and_the_published_figures_only() -> None:
    gpt2, gtx = model_dims("gpt2"), lookup("NVIDIA GeForce GTX 1080 Ti")
    assert gpt2 is not None and gtx is not None
    link = catalogue_link(gtx)
    assert link == catalogue_link(gtx) and link.kind == "pcie-staged"  # GeForce: no peer access, host-staged
    f = PUBLISHED_LINKS["pcie-staged"]
    assert (link.bytes_per_second, link.latency_s, link.overhead_s) == (f.bytes_per_second, f.latency_s, f.overhead_s)
    for tokens in THREAD_MS:
        c = pipeline_split(gpt2, tokens, 2, link)
        assert c.bytes_moved == tokens * 768 * 4 and c.hops == 1  # one fp32 activation handed on per pass
        assert c.total_s == pytest.approx(tokens * 768 * 4 / f.bytes_per_second + f.latency_s + f.overhead_s)
        # 12 GPUs: 11 cuts, each the same hand-off
        assert pipeline_split(gpt2, tokens, 12, link).total_s == pytest.approx(11 * c.total_s)


def test_the_thread_numbers_as_the_docs_quote_them() -> None:
    """+5 ms (about 3%) per split, and the author's 12-GPU extrapolation (+5 ms x 11 cuts on ~166 ms) ~ +36%."""
    extra = [measured_extra_ms(t) for t in THREAD_MS]
    assert min(extra) > 3 and max(extra) < 6
    share = [measured_extra_ms(t) / _mid(THREAD_MS[t][0]) for t in THREAD_MS]
    assert all(0.015 < s < 0.04 for s in share)
    assert 0.3 < 5 * 11 / _mid(THREAD_MS[12][0]) < 0.4


@pytest.mark.xfail(
    strict=True,
    reason="published link figures predict 0.03-0.19 ms per hand-off; the thread measured 3.2-5.7 ms (28-216x): "
    "its extra time is not the hand-off the published figures price (docs/rightsizing.md)",
)
@pytest.mark.parametrize("tokens", sorted(THREAD_MS))
def test_prediction_within_a_factor_of_2_of_the_measured_extra_time_per_split(tokens: int) -> None:
    ratio = measured_extra_ms(tokens) / predicted(tokens)
    assert 0.5 <= ratio <= 2.0, f"{tokens} tokens: measured {measured_extra_ms(tokens):.2f} ms, predicted "
    f"{predicted(tokens):.3f} ms"


def thread_table() -> list[str]:
    """The 12-way case and its assumptions beside the thread's numbers, as docs/rightsizing.md quotes them."""
    lines = [
        "assumptions: GPT-2 small (768 hidden, fp32), inference (one hand-off per cut per forward pass), GPUs in a",
        "chain over host-staged PCIe 3.0 x16 (GeForce: no peer access), published figures:",
        f"  {PUBLISHED_LINKS['pcie-staged'].source}",
        "the thread's 12-GPU extrapolation: about 226 ms, +36% (+5 ms x 11 cuts)",
        "tokens  measured +ms (2 GPUs)  predicted +ms (2)  measured/predicted  predicted +ms (12)",
    ]
    for tokens in sorted(THREAD_MS):
        base, p2, p12 = _mid(THREAD_MS[tokens][0]), predicted(tokens), predicted(tokens, 12)
        lines.append(f"{tokens:>6}  {measured_extra_ms(tokens):>21.2f}  {p2:>17.3f}  "
                     f"{measured_extra_ms(tokens) / p2:>18.0f}  {p12:>8.3f} ({p12 / base:+.2%})")  # fmt: skip
    return lines


def test_the_twelve_way_case_and_its_assumptions() -> None:
    """Printed with ``pytest -s -k twelve``: 11 cuts cost 11 hand-offs, each as the 2-GPU case's."""
    lines = thread_table()
    print("\n".join(lines))
    assert len(lines) == 5 + len(THREAD_MS) and "assumptions" in lines[0]
    for tokens in THREAD_MS:
        assert predicted(tokens, 12) == pytest.approx(11 * predicted(tokens))
