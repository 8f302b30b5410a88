"""The query layer's history reads: Flux built only from checked values, and Flux CSV answers parsed into
per-(application, GPU model) columns."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import InvalidQuery
from pipeline.events import METRIC_INDEX, RELATIVE_FIELDS
from sinks.query.history import History, Limits, _concat, _csv_tables, _history_of, history_flux

START, STOP = 1_800_000_000_000_000_000, 1_800_000_060_123_000_000


def test_history_flux_reads_labelled_points_in_the_range() -> None:
    flux = history_flux("telemetry", START, STOP, "10s", "dc1")
    assert "range(start: 2027-01-15T08:00:00.000000000Z, stop: 2027-01-15T08:01:00.123000000Z)" in flux
    assert 'r._measurement == "gpu" and exists r.application and r.cluster == "dc1"' in flux
    assert "aggregateWindow(every: 10s, fn: last, createEmpty: false)" in flux
    assert '"power_watts"' in flux and '"app_source"' in flux and "ratio" not in flux  # relative: computed
    assert "aggregateWindow" not in history_flux("telemetry", START, STOP, None, None)


@pytest.mark.parametrize(("stride", "cluster"), [("10 s", None), ("10s", 'dc1" or true or "'), ("1h)|>drop(", None)])
def test_values_that_could_change_the_flux_are_rejected(stride: str, cluster: str | None) -> None:
    with pytest.raises(InvalidQuery):
        history_flux("telemetry", START, STOP, stride, cluster)


def test_csv_answers_become_columns_per_application_and_model() -> None:
    header = ["", "result", "table", "_time", "application", "cluster", "gpu", "gpu_model", "power_watts",
              "utilization_gpu_percent", "phase", "app_source"]  # fmt: skip
    t0, t1, t2 = "2027-01-15T08:00:00Z", "2027-01-15T08:00:01.5Z", "2027-01-15T08:00:02Z"
    rows = iter(
        [
            header,
            ["", "_result", "0", t0, "llm-serving", "dc1", "GPU-1", "H100", "350", "55", "compute", "slurm"],
            ["", "_result", "0", t1, "llm-serving", "dc1", "GPU-1", "H100", "", "56", "", "slurm"],
            ["", "_result", "0", t0, "idle", "dc1", "GPU-2", "L40S", "0.1", "0", "idle", "inferred"],
            [""],
            header[:-1],  # a second table without the app_source column
            ["", "_result", "1", t2, "llm-serving", "dc1", "GPU-3", "H100", "420", "60", "compute"],
        ]
    )
    tables = list(_csv_tables(rows))
    assert [len(t["_time"]) for t in tables] == [3, 1]
    # GPU-1's power limit: 700 W, lowered to 500 W between its two rows
    limits = Limits()
    limits.add({"_time": [t0, "2027-01-15T08:00:01Z"], "cluster": ["dc1", "dc1"], "gpu": ["GPU-1", "GPU-1"],
                "power_limit_watts": ["700", "500"]})  # fmt: skip
    first = _history_of(tables[0], None, limits)
    serving = first[("llm-serving", "H100")]
    # the phase is stored when it changes: an empty cell is the GPU's last phase
    assert serving.gpu == ("GPU-1", "GPU-1") and serving.phase == ("compute", "compute")
    assert serving.ts_ns.tolist() == [START, START + 1_500_000_000]
    power = serving.relative[:, RELATIVE_FIELDS.index("power_ratio_of_limit")]
    assert power[0] == 0.5 and np.isnan(power[1])  # a reading over the limit then in force; absent stays absent
    assert serving.metrics[:, METRIC_INDEX["power_limit_watts"]].tolist() == [700.0, 500.0]
    assert np.isnan(first[("idle", "L40S")].relative).all()  # no limits known: no relative values
    assert serving.metrics[:, METRIC_INDEX["utilization_gpu_percent"]].tolist() == [55.0, 56.0]
    assert first[("idle", "L40S")].source == ("inferred",)
    assert _history_of(tables[1])[("llm-serving", "H100")].source == (None,)
    carried = {("dc1", "GPU-3"): {"app_source": "slurm"}}  # what the GPU had before the range
    assert _history_of(tables[1], carried)[("llm-serving", "H100")].source == ("slurm",)


def test_the_chunks_of_one_key_are_joined_in_order_and_let_go() -> None:
    rng = np.random.default_rng(7)

    def chunk(n: int, gpu: str, phase: str | None) -> History:
        return History("llm-serving", "H100", ("dc1",) * n, (gpu,) * n, rng.integers(0, 10**9, n),
                       rng.random((n, 53)), rng.random((n, 6)), (phase,) * n, ("slurm",) * n)  # fmt: skip

    parts = [chunk(3, "GPU-1", "compute"), chunk(1, "GPU-2", None), chunk(2, "GPU-1", "idle")]
    want = [np.concatenate([p.ts_ns for p in parts]), np.vstack([p.metrics for p in parts]),
            np.vstack([p.relative for p in parts])]  # fmt: skip
    joined = _concat(parts)
    assert parts == []  # each chunk let go once copied
    assert joined.gpu == ("GPU-1",) * 3 + ("GPU-2",) + ("GPU-1",) * 2
    assert joined.phase == ("compute",) * 3 + (None,) + ("idle",) * 2 and len(joined.source) == 6
    for got, expected in zip((joined.ts_ns, joined.metrics, joined.relative), want, strict=True):
        assert np.array_equal(got, expected)


def test_a_rows_strings_are_shared_not_one_per_row() -> None:
    header = ["", "result", "table", "_time", "application", "cluster", "gpu", "gpu_model", "phase", "app_source"]
    row = ["", "_result", "0", "2027-01-15T08:00:00Z", "llm-serving", "dc1", "GPU-1", "H100", "compute", "slurm"]
    # as the CSV reader makes them: a new string object per cell
    rows = iter([header, *[["".join(cell) for cell in row] for _ in range(3)]])
    (table,) = _csv_tables(rows)
    assert len({id(g) for g in table["gpu"]}) == 3  # the answer's own cells are distinct objects
    h = _history_of(table)[("llm-serving", "H100")]
    for column in (h.gpu, h.cluster, h.phase, h.source):
        assert len({id(x) for x in column}) == 1, column
