"""The processor's wiring: the interpretation stages share one per-GPU slot table (the sizing of what it writes
is tested in test_writes.py)."""

from __future__ import annotations

from pipeline.config import DetectorSettings, Settings
from processors.app import interpreter_from
from processors.baselines.score import Scorer
from processors.detectors.stage import Detectors
from processors.enrich import Enricher


def test_the_stages_share_one_slot_table() -> None:
    interpreter = interpreter_from(Settings(), lambda _key: None, lambda _c, _n: None, lambda: None)
    enricher, scorer, detectors = interpreter.stages
    assert isinstance(enricher, Enricher) and isinstance(scorer, Scorer) and isinstance(detectors, Detectors)
    assert enricher.slots is scorer.tracker.slots is detectors.slots


def test_the_table_frees_the_lanes_of_imports_done_as_the_settings_say() -> None:
    def table_idle_s(settings: Settings) -> float | None:
        detectors = interpreter_from(settings, lambda _key: None, lambda _c, _n: None, lambda: None).stages[-1]
        assert isinstance(detectors, Detectors)
        return detectors.slots._idle_s

    assert table_idle_s(Settings()) == 600.0
    assert table_idle_s(Settings(detectors=DetectorSettings(lane_idle_s=0))) is None  # 0: never freed
