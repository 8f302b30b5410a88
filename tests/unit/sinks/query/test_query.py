"""The query layer's pure parts: validation (every malformed input has its one-line message), plans as Flux
and InfluxQL text, the backend choice, the rollup mapping, and the output formats."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from pipeline.errors import InvalidInput, InvalidQuery
from sinks.query import (
    AnomalyQuery,
    CompareJobQuery,
    CompareModelsQuery,
    Scope,
    Table,
    TopQuery,
    TrendQuery,
    render,
)
from sinks.query.compare import JobFeature
from sinks.query.flux import aggregate_flux, points_flux, time_literal
from sinks.query.flux import string as flux_string
from sinks.query.influxql import InfluxQLBackend, aggregate_influxql, points_influxql
from sinks.query.influxql import string as influxql_string
from sinks.query.model import (
    BENIGN_MASKS,
    NS,
    Aggregate,
    Expr,
    FieldEquals,
    Filter,
    Points,
    Scale,
    TagIn,
    TimeRange,
    ValueBelow,
    ValueNotIn,
    auto_window,
    parse_time,
    resolve_range,
)
from sinks.query.scope import Band, rollup_blocker, rollup_expr
from sinks.query.store import prefers_influxql

NOW = parse_time("2025-06-01T12:00:00Z", "now")
H100 = "NVIDIA H100 80GB HBM3"


def _trend(**kw: object) -> Callable[[], object]:
    q = TrendQuery(**{"field": "power_watts", **kw})  # type: ignore[arg-type]
    return lambda: (q.validate(), q.window_ns(q.time_range(NOW)))


MALFORMED: list[tuple[str, Callable[[], object], str]] = [
    ("field injection", _trend(field='power" or true'), "field 'power\" or true' is not a stored reading"),
    ("limit field", _trend(field="power_limit_watts"), "power_limit_watts is a limit of the GPU"),
    ("misspelt field", _trend(field="power_wats"), "did you mean power_watts?"),
    ("group-by", _trend(by="node) |> drop"), "group-by 'node) |> drop' is not one of"),
    ("window words", _trend(every="10 seconds"), "window '10 seconds' is not a duration"),
    ("negative range", _trend(range="-5m"), "range '-5m' is not a duration"),
    ("zero window", _trend(every="0s"), "window '0s' must be longer than zero"),
    ("months", _trend(range="1mo"), "range '1mo' is not a duration"),
    ("function", _trend(fn="stddev(); x"), "function 'stddev(); x' is not one of mean, max"),
    ("backend", _trend(backend="sql"), "backend 'sql' is not one of auto, flux, influxql"),
    ("scope quote", _trend(scope=Scope(node="n1' OR '1'='1")), "node \"n1' OR '1'='1\" has characters"),
    ("scope flux interp", _trend(scope=Scope(gpu="${x}")), "gpu '${x}' has characters"),
    ("application", _trend(scope=Scope(application="bitcoin")), "application 'bitcoin' is not one of"),
    ("phase", _trend(band=True, phase="warmup"), "phase 'warmup' is not one of"),
    ("start and range", _trend(start="2025-06-01T10:00:00Z", range="1h"), "either a range"),
    ("start after stop", _trend(start="2025-06-01T13:00:00Z", range=None), "the range is empty"),
    ("not a time", _trend(start="yesterday", range=None), "start 'yesterday' is not a time"),
    ("window > range", _trend(every="2h", range="1h"), "window 2h is longer than the range 1h"),
    ("too many windows", _trend(every="1s", range="7d"), "use a window of at least 1m1s"),
    ("top kind", TopQuery("coolest").validate, "top list 'coolest' is not one of hot, throttled"),
    ("top n", TopQuery("hot", n=0).validate, "n=0 is not between 1 and 1000"),
    ("top threshold", TopQuery("wasted", threshold=150).validate, "threshold 150 is not a utilization"),
    ("top fn", TopQuery("hot", fn="avg").validate, "function 'avg' is not one of"),
    ("job chars", CompareJobQuery("job'1").validate, 'job "job\'1" has characters'),
    ("no features", CompareJobQuery("j", features=()).validate, "name at least one feature"),
    ("feature", CompareJobQuery("j", features=("gpu_temp",)).validate, "field 'gpu_temp' is not a stored reading"),
    ("same models", CompareModelsQuery("llm-serving", H100, H100).validate, "compare two different GPU models"),
    ("model chars", CompareModelsQuery("llm-serving", H100, 'A100"').validate, "gpu model 'A100\"' has characters"),
    ("models app", CompareModelsQuery("chess", H100, "A100").validate, "application 'chess' is not one of"),
    ("anomaly limit", AnomalyQuery(limit=0).validate, "limit 0 is not between 1 and 10000"),
    ("detector", AnomalyQuery(detector='x" or 1').validate, "detector 'x\" or 1' has characters"),
    ("anomaly window", AnomalyQuery(every="1 hour").validate, "window '1 hour' is not a duration"),
]


@pytest.mark.parametrize(("case", "call", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_questions_get_one_readable_line(case: str, call: Callable[[], object], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        call()
    text = str(info.value)
    assert message in text, text
    assert len(text.splitlines()) == 1


def test_times_are_utc_and_naive_means_utc() -> None:
    assert parse_time("2025-01-31T12:00:00Z", "t") == parse_time("2025-01-31T12:00:00", "t")
    assert parse_time("2025-01-31T13:00:00+01:00", "t") == parse_time("2025-01-31T12:00:00Z", "t")
    assert parse_time("2025-01-31T12:00:00.250Z", "t") % NS == 250_000_000


def test_ranges_and_windows() -> None:
    tr = resolve_range("1h", None, None, NOW, "15m")
    assert tr == TimeRange(NOW - 3600 * NS, NOW)
    assert resolve_range(None, "2025-06-01T11:00:00Z", "2025-06-01T11:30:00Z", NOW, "15m").length_ns == 1800 * NS
    assert tr.aligned(7 * 60 * NS).start_ns % (7 * 60 * NS) == 0
    for length in (15 * 60 * NS, 6 * 3600 * NS, 30 * 86400 * NS):
        assert length // auto_window(length) <= 300


RANGE = TimeRange(parse_time("2025-06-01T11:00:00Z", "t"), parse_time("2025-06-01T12:00:00Z", "t"))


def test_flux_of_a_windowed_percentile() -> None:
    plan = Aggregate(
        "telemetry", "gpu", (Expr("power_watts", "p95"),), RANGE, (TagIn("node", ("n1", "n2")),), ("gpu",), 60 * NS
    )
    flux = aggregate_flux(plan)
    assert "range(start: 2025-06-01T11:00:00.000000000Z, stop: 2025-06-01T12:00:00.000000000Z)" in flux
    assert '(r["node"] == "n1" or r["node"] == "n2")' in flux
    assert 'quantile(q: 0.95, column: column, method: "exact_selector")' in flux
    assert "aggregateWindow(every: 1m, fn: (column, tables=<-) =>" in flux and 'timeSrc: "_start"' in flux
    assert 'group(columns: ["gpu"])' in flux and "pivot" not in flux


def test_flux_filters_on_a_job_field_through_a_pivot() -> None:
    plan = Aggregate("t", "gpu", (Expr("power_watts", "mean"),), RANGE, (FieldEquals("job_id", "j-1"),))
    flux = aggregate_flux(plan)
    assert '(r._field == "power_watts" or r._field == "job_id")' in flux
    assert 'pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")' in flux
    assert 'r["job_id"] == "j-1"' in flux and "|> mean()" in flux


def test_a_relative_value_is_a_reading_over_the_limit_in_force_at_each_point() -> None:
    changed_at = RANGE.start_ns + 600 * NS
    scale = Scale("power_ratio_of_limit", "power_watts",
                  (("GPU-a", ((0, 700.0),)), ("GPU-b", ((0, 700.0), (changed_at, 500.0)))))  # fmt: skip
    plan = Aggregate("t", "gpu", (Expr("power_ratio_of_limit", "p95"),), RANGE, scales=(scale,))
    flux = aggregate_flux(plan)
    assert flux.startswith('import "dict"')
    assert 'dict.fromList(pairs: [{key: "GPU-a", value: 700.0}, {key: "GPU-b", value: 700.0}])' in flux
    assert 'r._field == "power_watts"' in flux and 'r._field == "power_ratio_of_limit"' not in flux
    assert f'if r.gpu == "GPU-b" then (if r._time < {time_literal(changed_at)} then 700.0 else 500.0)' in flux
    assert '_field: "power_ratio_of_limit"' in flux  # named as asked, then aggregated like any field
    assert flux.index("map(fn:") < flux.index("quantile(")
    no_limits = replace(plan, scales=(replace(scale, limits=()),))
    assert "filter(fn: (r) => false)" in aggregate_flux(no_limits)
    assert InfluxQLBackend("http://127.0.0.1:1", "t", "o", 1.0).unsupported(plan)


def test_throttled_samples_are_the_non_benign_masks() -> None:
    assert sorted(BENIGN_MASKS) == [0, 1, 2, 3, 16, 17, 18, 19, 256, 257, 258, 259, 272, 273, 274, 275]
    plan = Aggregate("t", "gpu", (Expr("throttle_reasons_mask", "count"),), RANGE, (ValueNotIn((0.0, 1.0)),))
    assert "|> filter(fn: (r) => r._value != 0.0 and r._value != 1.0)" in aggregate_flux(plan)
    assert '"throttle_reasons_mask" != 0.0 AND "throttle_reasons_mask" != 1.0' in aggregate_influxql(plan)


def test_flux_points_are_newest_first() -> None:
    q = Points("t", "finding", ("summary", "active"), RANGE, (FieldEquals("job_id", "j"),), 50)
    flux = points_flux(q)
    assert '"job_id"' in flux and 'sort(columns: ["_time"], desc: true)' in flux and "limit(n: 50)" in flux


def test_influxql_of_a_plan() -> None:
    plan = Aggregate(
        "telemetry", "gpu", (Expr("power_watts", "p95"), Expr("power_watts", "count")), RANGE,
        (TagIn("gpu_model", (H100,)), FieldEquals("job_id", "j-1"), ValueBelow(10.0)), ("node",), 300 * NS,
    )  # fmt: skip
    assert aggregate_influxql(plan) == (
        'SELECT percentile("power_watts", 95) AS "e0", count("power_watts") AS "e1" FROM "gpu" '
        f"WHERE time >= {RANGE.start_ns} AND time < {RANGE.stop_ns} AND (\"gpu_model\" = '{H100}') "
        'AND "job_id" = \'j-1\' AND "power_watts" < 10.0 GROUP BY time(5m), "node" fill(none)'
    )


def test_influxql_points_select_tags_and_limit() -> None:
    q = Points("t", "finding", ("summary",), RANGE, (TagIn("detector", ("xid",)),), 10)
    text = points_influxql(q, ("gpu",))
    assert text.startswith('SELECT "summary", "gpu"::tag FROM "finding" WHERE')
    assert text.endswith("ORDER BY time DESC LIMIT 10")


def test_literals_are_escaped_even_after_validation() -> None:
    assert flux_string('a"b\\c${d}') == '"a\\"b\\\\c\\${d}"'
    # a raw NUL or newline in a GPU's name cut a whole fleet's query short ("expected RPAREN, got EOF")
    assert flux_string("nul\x00 nl\n del\x7f") == '"nul\\x00 nl\\x0a del\\x7f"'
    assert influxql_string("it's") == "'it\\'s'"
    assert time_literal(1_500_000_001) == "1970-01-01T00:00:01.500000001Z"


@pytest.mark.parametrize(
    ("exprs", "filters", "window", "influxql"),
    [
        ((Expr("power_watts", "max"),), (TagIn("node", ("n",)),), None, False),
        ((Expr("power_watts", "mean"), Expr("power_watts", "count")), (), None, False),
        ((Expr("job_id", "first"),), (), None, False),
        ((Expr("power_watts", "max"),), (), 60 * NS, True),
        ((Expr("power_watts", "mean"),), (), 60 * NS, True),
        ((Expr("power_watts", "p95"),), (), None, True),
        ((Expr("power_watts", "median"),), (), None, True),
        ((Expr("power_watts", "stddev"),), (), None, True),
        ((Expr("power_watts", "mean"),), (FieldEquals("job_id", "j"),), None, True),
        ((Expr("verdict", "count"),), (FieldEquals("verdict", "anomalous"),), None, True),
        ((Expr("utilization_gpu_percent", "count"),), (ValueBelow(10.0),), None, False),
        ((Expr("throttle_reasons_mask", "count"),), (ValueNotIn(BENIGN_MASKS),), None, False),
    ],
)
def test_backend_choice_follows_the_measured_rule(
    exprs: tuple[Expr, ...], filters: tuple[Filter, ...], window: int | None, influxql: bool
) -> None:
    assert prefers_influxql(Aggregate("t", "gpu", exprs, RANGE, filters, (), window)) is influxql


@pytest.mark.parametrize(
    ("field", "fn", "window", "job", "blocked"),
    [
        ("power_watts", "mean", 60 * NS, None, None),
        ("power_watts", "mean", 60 * NS, "j", "job ids are not kept"),
        ("pcie_replay_total", "max", None, None, "pcie_replay_total is not kept"),
        ("power_watts", "sum", None, None, "sums are not kept"),
        ("power_watts", "max", 90 * NS, None, "whole minutes"),
    ],
)
def test_what_the_rollups_can_answer(
    field: str, fn: str, window: int | None, job: str | None, blocked: str | None
) -> None:
    why = rollup_blocker(field, fn, window, job)
    assert (why is None) if blocked is None else (why is not None and blocked in why)


def test_rollup_expressions() -> None:
    assert rollup_expr("power_watts", "max") == (Expr("power_watts_max", "max"), None)
    assert rollup_expr("power_watts", "count") == (Expr("power_watts_count", "sum"), None)
    expr, note = rollup_expr("power_watts", "p95")
    assert expr == Expr("power_watts_mean", "p95") and note and "1-minute means" in note


def test_job_position_against_the_band() -> None:
    band = Band(0.2, 0.5, 0.8, 1000.0, 3.0, 0)
    assert JobFeature("f", "a", "m", 10, 0.9, 0.95, band).position == "above band"
    assert JobFeature("f", "a", "m", 10, 0.1, 0.3, band).position == "below band"
    assert JobFeature("f", "a", "m", 10, 0.5, 0.7, band).position == "within band"
    assert JobFeature("f", "a", "m", 10, 0.5, 0.7, None).position == "no baseline"


TABLE = Table(
    "t",
    ("time", "gpu", "value"),
    (("2025-06-01T12:00:00Z", "GPU-1", 1.5), ("2025-06-01T12:01:00Z", "GPU 2", None)),
    ("n",),
)


def test_json_and_csv_parse_back() -> None:
    doc = json.loads(render([TABLE], "json"))
    assert doc["rows"] == [{"time": "2025-06-01T12:00:00Z", "gpu": "GPU-1", "value": 1.5},
                           {"time": "2025-06-01T12:01:00Z", "gpu": "GPU 2", "value": None}]  # fmt: skip
    assert doc["notes"] == ["n"]
    rows = list(csv.DictReader(io.StringIO(render([TABLE], "csv"))))
    assert rows == [{"time": "2025-06-01T12:00:00Z", "gpu": "GPU-1", "value": "1.5"},
                    {"time": "2025-06-01T12:01:00Z", "gpu": "GPU 2", "value": ""}]  # fmt: skip


def test_text_table_is_aligned_and_says_when_empty() -> None:
    text = render([TABLE], "table").splitlines()
    assert text[1].split() == ["time", "gpu", "value"] and text[3].endswith("1.5") and text[4].endswith("-")
    assert len({len(line) for line in text[1:5]}) <= 2  # numbers right-aligned, so equal widths but a "-"
    assert "(no data in range)" in render([Table("t", ("a",), ())], "table")


def test_csv_holds_one_table_and_formats_are_checked() -> None:
    with pytest.raises(InvalidQuery, match="CSV holds one table"):
        render([TABLE, TABLE], "csv")
    with pytest.raises(InvalidQuery, match="format 'xml' is not one of"):
        render([TABLE], "xml")


def test_row_times() -> None:
    whole = Aggregate("t", "gpu", (Expr("power_watts", "max"), Expr("power_watts", "mean")), RANGE)
    assert whole.row_time(RANGE.start_ns + 17) == RANGE.start_ns  # one row per group, whatever max selected
    first = Aggregate("t", "gpu", (Expr("job_id", "first"),), RANGE)
    assert first.row_time(RANGE.start_ns + 17) == RANGE.start_ns + 17
    windowed = Aggregate("t", "gpu", (Expr("power_watts", "max"),), RANGE, window_ns=60 * NS)
    assert windowed.row_time(RANGE.start_ns + 60 * NS) == RANGE.start_ns + 60 * NS


@pytest.mark.parametrize("value", ["24h\n", "node-1\n", "gpu\r\n"])
def test_a_value_with_a_trailing_line_break_is_refused(value: str) -> None:
    """``$`` matches before a final newline: every query value check matches the whole string (a path parameter
    ``24h%0A`` reached a query and came back a 500)."""
    from sinks.query.alerts import _VALUE as ALERT_VALUE
    from sinks.query.history import _SAFE_VALUE
    from sinks.query.model import check_value

    with pytest.raises(InvalidQuery):
        check_value(value, "cluster")
    assert ALERT_VALUE.fullmatch(value) is None
    assert _SAFE_VALUE.fullmatch(value) is None
