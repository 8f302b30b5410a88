"""The explanation of a verdict reads like advice: what is off, against which baseline, and why when the GPU says."""

from __future__ import annotations

import dataclasses

from pipeline.events import METRIC_INDEX
from processors.baselines.score import score_batch
from tests.unit.processors.baselines.helpers import H100, first_row, fit_on, set_of, with_app
from tests.unit.processors.history import Labelled


def test_explanation_reads_like_advice(history: Labelled) -> None:
    baselines = set_of(fit_on(history, "llm-pretraining", H100))
    batch, i = first_row(history, "llm-pretraining", H100)
    metrics = batch.metrics.copy()
    metrics[i, METRIC_INDEX["power_watts"]] = 0.38 * metrics[i, METRIC_INDEX["power_limit_watts"]]
    metrics[i, METRIC_INDEX["throttle_reasons_mask"]] = 0x40
    relative = batch.relative.copy()
    relative[i, 0] = 0.38
    changed = with_app(dataclasses.replace(batch, metrics=metrics, relative=relative), "llm-pretraining")
    scored, codes = score_batch(changed, baselines)
    text = scored.explanation[i]
    assert codes[i] >= 2
    assert text.startswith("power 38% of limit while SM active")
    assert "for LLM pre-training on H100 80GB HBM3 in compute (p5 " in text
    assert text.endswith("clocks held by thermal slowdown: check cooling")
