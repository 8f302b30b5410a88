"""The Prometheus importer's checks and query shapes (its reads of a real server: tests/integration/
test_import_prometheus.py)."""

from __future__ import annotations

import itertools

import pytest

from pipeline import registry
from pipeline.config import Settings
from pipeline.errors import ConfigError
from producers.importers.prometheus import MAX_POINTS, _chunks, _selector

GOOD = {"url": "http://prom:9090", "start": "2025-09-24T03:00:00Z", "end": "2025-09-24T04:00:00Z"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"url": "prom:9090"}, "--url must be an http:// or https:// URL"),
        ({"end": "2025-09-24T02:00:00Z"}, "--start must be before --end"),
        ({"start": "yesterday"}, "is not a time"),
        ({"step": "a minute"}, "is not a duration"),
        ({"selector": 'Hostname="x"'}, "--selector must be a label set"),
        ({"application": "training"}, "'training' is not one of"),
    ],
)
def test_wrong_options_are_one_line_before_anything_is_queried(change: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        registry.create("importer", "prometheus", Settings(), **(GOOD | change))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_queries_name_the_metric_and_keep_the_selector() -> None:
    assert _selector("DCGM_FI_DEV_GPU_UTIL", "") == '{__name__="DCGM_FI_DEV_GPU_UTIL"}'
    assert _selector("DCGM_FI_DEV_GPU_UTIL", '{Hostname=~"gpu0.*"}') == (
        '{__name__="DCGM_FI_DEV_GPU_UTIL", Hostname=~"gpu0.*"}'
    )


def test_chunks_tile_the_range_and_stay_under_the_points_limit() -> None:
    step = 15 * 10**9
    chunks = _chunks(0, 3 * MAX_POINTS * step + 7, MAX_POINTS * step)
    assert chunks[0] == (0, MAX_POINTS * step) and chunks[-1][1] == 3 * MAX_POINTS * step + 7
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    assert max((b - a) // step for a, b in chunks) <= MAX_POINTS < 11_000
