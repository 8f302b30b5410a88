from __future__ import annotations

import pytest

from pipeline.errors import InvalidQuery
from sinks.query import TrendQuery


def test_valid_query_builds_flux() -> None:
    flux = TrendQuery("power_watts", "node", "1m", "2h30m", "max").flux("telemetry")
    assert 'r._field == "power_watts"' in flux
    assert "range(start: -2h30m)" in flux
    assert "aggregateWindow(every: 1m, fn: max" in flux
    assert 'group(columns: ["node"])' in flux


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (TrendQuery('power" or true'), "field"),
        (TrendQuery("power_watts", by="node) |> drop"), "group-by"),
        (TrendQuery("power_watts", every="10 seconds"), "window"),
        (TrendQuery("power_watts", range="-5m"), "range"),
        (TrendQuery("power_watts", fn="stddev(); x"), "function"),
    ],
)
def test_malformed_queries_are_rejected_before_flux(query: TrendQuery, message: str) -> None:
    with pytest.raises(InvalidQuery, match=message):
        query.flux("telemetry")
