"""The health the alert manager publishes (alerting/health.py), with alerts from the real engine: a change of a
GPU's alerts is one record for its key, the same health again is none, and the record says the state and why."""

from __future__ import annotations

import json

from alerting.engine import AlertEngine
from alerting.health import HealthBook, health_key
from pipeline.config import HealthSettings
from pipeline.events import Severity
from tests.unit.alerting.helpers import S, finding, settings


def _published(book: HealthBook) -> dict[str, dict[str, object]]:
    out = {key.decode(): json.loads(value) for key, value in book.dirty.items()}
    book.dirty.clear()
    return out


def test_a_gpu_whose_alert_fires_and_resolves_is_published_on_each_change_only() -> None:
    engine, book = AlertEngine(settings(), ()), HealthBook(HealthSettings())
    ecc = finding(True, 10, detector="ecc-uncorrectable", severity=Severity.CRITICAL)
    new = engine.apply(ecc, 10 * S)
    assert new is not None
    book.touch([health_key(new.labels)])
    book.seen(ecc)
    engine.step(10 * S)
    book.assess(engine.alerts.values(), 10 * S)
    first = _published(book)
    assert list(first) == ["c1/n1/GPU-1"] and first["c1/n1/GPU-1"]["state"] == "unhealthy"
    assert [r["detector"] for r in first["c1/n1/GPU-1"]["reasons"]] == ["ecc-uncorrectable"]  # type: ignore[union-attr]

    book.touch([("c1", "n1", "GPU-1")])  # touched again, nothing changed: nothing to publish
    book.assess(engine.alerts.values(), 11 * S)
    assert book.dirty == {}

    gone = engine.apply(finding(False, 20, detector="ecc-uncorrectable", severity=Severity.CRITICAL), 20 * S)
    assert gone is not None
    book.touch([health_key(gone.labels)])
    engine.step(20 * S)
    book.assess(engine.alerts.values(), 20 * S)
    assert _published(book)["c1/n1/GPU-1"]["state"] == "healthy"


def test_nothing_touched_is_nothing_assessed() -> None:
    book = HealthBook(HealthSettings())
    book.assess([], 5 * S)
    assert book.dirty == {} and book.shadow_escalations == 0
