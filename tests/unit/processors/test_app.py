"""The processor's wiring: the interpretation stages share one per-GPU slot table (the sizing of what it writes
is tested in test_writes.py)."""

from __future__ import annotations

from pipeline.config import Settings
from processors.app import interpreter_from
from processors.baselines.score import Scorer
from processors.detectors.stage import Detectors
from processors.enrich import Enricher


def test_the_stages_share_one_slot_table() -> None:
    interpreter = interpreter_from(Settings(), lambda _key: None, lambda _c, _n: None, lambda: None)
    enricher, scorer, detectors = interpreter.stages
    assert isinstance(enricher, Enricher) and isinstance(scorer, Scorer) and isinstance(detectors, Detectors)
    assert enricher.slots is scorer.tracker.slots is detectors.slots
