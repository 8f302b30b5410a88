"""The model catalogue (what a split hands on) and the published link figures: every entry sourced, the bytes as
the dimensions give them, topology path kinds mapped to link kinds."""

from __future__ import annotations

import pytest

from pipeline.catalogue import MODELS, PUBLISHED_LINKS, link_kind_of, model_dims


def test_every_model_and_link_names_its_source() -> None:
    assert {m.name for m in MODELS} >= {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama3-8b", "llama3-70b",
                                        "sdxl-unet", "bert-base", "bert-large", "resnet50"}  # fmt: skip
    assert all(m.source and m.hidden > 0 and m.layers > 0 and m.params > 0 for m in MODELS)
    assert all(
        f.source.startswith("published") and f.latency_s > 0 and f.overhead_s > 0 for f in PUBLISHED_LINKS.values()
    )


def test_activation_and_gradient_bytes() -> None:
    gpt2, resnet, llama = model_dims("GPT2"), model_dims("resnet50"), model_dims("llama3_8b")
    assert gpt2 is not None and resnet is not None and llama is not None
    assert gpt2.activation_bytes(12) == 12 * 768 * 4 == 36_864  # the thread's 12 tokens: 37 KB per cut
    assert gpt2.activation_bytes(512) == 1_572_864  # and 512 tokens: 1.5 MiB
    assert llama.activation_bytes(100, batch=2) == 2 * 100 * 4096 * 2
    assert resnet.activation_bytes(12) == resnet.activation_bytes(1) == 56 * 56 * 256 * 4  # per image, not per token
    assert gpt2.gradient_bytes() == gpt2.params * 4
    assert model_dims("gpt-5") is None


@pytest.mark.parametrize(
    ("topo", "kind"),
    [("NV12", "nvlink"), ("NV1", "nvlink"), ("PIX", "pcie"), ("PXB", "pcie"), ("PHB", "pcie"), ("NODE", "pcie"),
     ("SYS", "sys"), ("X", "pcie-staged")],
)  # fmt: skip
def test_topology_path_kinds_map_to_link_kinds(topo: str, kind: str) -> None:
    assert link_kind_of(topo) == kind
