"""Every importer is total and its counts add up (issue 37): any bytes, or a real capture with bytes flipped, cut
short, or hostile pieces spliced in (quotes, line breaks, form feeds, NUL, huge numbers, fields over the CSV
reader's limit), is read without an exception, and through the import loop every row read is either a sample sent
or a dead letter. For the CSV importers the rows are counted independently: one per data record of the file."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator
from typing import Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.config import TopicSettings
from pipeline.errors import ConfigError
from producers.importers.dcgm_files import DcgmFilesConfig, DcgmFilesImporter
from producers.importers.driver import ImportDriver
from producers.importers.nvsmi_csv import NvsmiCsvConfig, NvsmiCsvImporter
from producers.importers.nvsmi_xml import NvsmiXmlConfig, NvsmiXmlImporter
from producers.importers.parse import csv_records
from producers.importers.prometheus import answer_series
from producers.importers.rows import Block
from producers.importers.table import TableConfig, TableImporter, csv_rows, load_mapping
from tests import TESTDATA
from tests.fakes.kafka import RecordingPublisher
from tests.fuzzing import SEEDS, count, mutations

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"


def _head(path: str, lines: int) -> bytes:
    return b"\n".join((TESTDATA / path).read_bytes().split(b"\n")[:lines]) + b"\n"


#: real captures, cut to a few records so each input is cheap
CAPTURES: Final = {
    "nvsmi_csv": [_head("nvidia-smi-csv/nvidia-h200-load.csv", 3), _head("nvidia-smi-csv/nvidia-l40s-load.csv", 2)],
    "table": [_head("nanogpt-pr643-h100x8-nvsmi-timeseries/gpu_metrics_f4f827dd.csv", 17)],
    "xml": [(TESTDATA / "nvidia-smi-xml" / name).read_bytes() for name in ("dual_2080-v13.xml", "a10g.xml")],
    "dcgm": [(TESTDATA / "dcgm-exporter-cncf-ai-conformance" / "ericsson_t4_under_load.prom").read_bytes()],
}
#: pieces issue 37 found breaking importers, and their kin
_PIECES: Final = (
    '"', '""', ",", "\n", "\r", "\r\n", "\x0c", "\x0b", "\x1c", "\x85", "\u2028", "\x00", "1e300", "inf", "-inf",
    "nan", "9" * 5000, "0x" + "f" * 400, "P" + "9" * 400, "\u00b2", "timestamp", "index", "<total>", "</gpu>",
    "<gpu id=\"x\">", "&amp;", "# TYPE x gauge\n", "{", "}", "=", " 99999999999999999999", "[N/A]", "\ufffd",
    "7" * (csv.field_size_limit() + 1),
)  # fmt: skip


def spliced(data: bytes, seed: int) -> Iterator[bytes]:
    """``data`` with one to three hostile pieces put in at random places (or a line repeated), then
    :func:`tests.fuzzing.mutations` of that."""
    rng = random.Random(seed)
    text = data.decode("utf-8", errors="replace")
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(text) + 1)
        if rng.random() < 0.1:
            start = text.rfind("\n", 0, at) + 1
            text = text[:start] + text[start:at] + "\n" + text[start:]
        else:
            text = text[:at] + rng.choice(_PIECES) + text[at:]
    yield from mutations(text.encode(), seed)


def inputs(kind: str) -> Any:
    """A real capture (then spliced and mutated) or any bytes."""
    return st.sampled_from(CAPTURES[kind]) | st.binary(max_size=300)


def through_the_loop(block: Block) -> None:
    """Every row read is a sample sent or a dead letter, and nothing raises on the way to Kafka."""

    class One:
        name = "one"

        def open(self) -> None: ...
        def close(self) -> None: ...
        def total_rows(self) -> int | None:
            return None

        def blocks(self) -> Iterator[Block]:
            yield block

    publisher = RecordingPublisher()
    report = ImportDriver(One(), publisher, TopicSettings.with_prefix("t"), "dc1", "run").run()
    assert report.rows_read == len(block.rows) + len(block.rejected)
    assert report.rows_read == report.samples + report.rejected_total


def _records(data: bytes, header: bool) -> int:
    """Data records of a CSV text, counted apart from the importers: not blank, and not a header (the first
    record with ``header``; else any whose first cell is ``timestamp``, as nvidia-smi logs repeat theirs)."""
    n = 0
    for i, (_line, cells, record) in enumerate(csv_records(data.decode("utf-8", errors="replace"))):
        if (header and i == 0) or not record.strip():
            continue
        n += header or not (cells and cells[0].strip() == "timestamp")
    return n


@pytest.mark.fuzz
@given(inputs("nvsmi_csv"), st.sampled_from([0, 1, 2]), SEEDS)
def test_nvidia_smi_csv_is_total_and_every_line_is_a_row_or_a_dead_letter(data: bytes, per: int, seed: int) -> None:
    importer = NvsmiCsvImporter(NvsmiCsvConfig(gpus_per_timestamp=per))
    for variant in spliced(data, seed):
        count()
        block = importer.read(variant, "f.csv", "n")
        assert len(block.rows) + len(block.rejected) == _records(variant, header=False)
        through_the_loop(block)


_MAPPING: Final = load_mapping(NANOGPT / "mapping.toml")


@pytest.mark.fuzz
@given(inputs("table"), SEEDS)
def test_table_is_total_and_every_record_is_a_row_or_a_dead_letter(data: bytes, seed: int) -> None:
    importer = TableImporter(TableConfig(), _MAPPING)
    for variant in spliced(data, seed):
        count()
        text = variant.decode("utf-8", errors="replace")
        first = next(csv_records(text), None)
        try:  # what open() checks first: a header without a mapped column is one line, before anything is read
            _MAPPING.validate_columns([c.strip() for c in (first[1] or [])] if first else [], "t.csv")
        except ConfigError as exc:
            assert "\n" not in str(exc)
            continue
        block = importer.read(csv_rows(text), "t.csv")
        assert len(block.rows) + len(block.rejected) == _records(variant, header=True)
        through_the_loop(block)


@pytest.mark.fuzz
@given(inputs("xml"), SEEDS)
def test_nvidia_smi_xml_is_total(data: bytes, seed: int) -> None:
    importer = NvsmiXmlImporter(NvsmiXmlConfig())
    for variant in spliced(data, seed):
        count()
        block = importer.read(variant, "c.xml", "n")
        assert len(block.rows) + len(block.rejected) >= 1  # a capture is rows, or a dead letter naming why
        through_the_loop(block)


@pytest.mark.fuzz
@given(inputs("dcgm"), SEEDS)
def test_saved_dcgm_scrapes_are_total(data: bytes, seed: int) -> None:
    importer = DcgmFilesImporter(DcgmFilesConfig())
    for variant in spliced(data, seed):
        count()
        block = importer.read(variant, "s.prom", "n", 1_772_798_400_000_000_000)
        through_the_loop(block)


_JSON: Final = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    | st.sampled_from(["1772798400.5", "+Inf", "NaN", "1e300", "250"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["result", "metric", "values", "__name__", "gpu", "UUID", "x"]), inner, max_size=4),
    max_leaves=16,
)  # fmt: skip
_ANSWER: Final = {"resultType": "matrix", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_POWER_USAGE", "gpu": "0", "UUID": "GPU-1", "Hostname": "n"},
     "values": [[1772798400, "250.5"], [1772798401, "251"]]}]}  # fmt: skip


@pytest.mark.fuzz
@given(_JSON, SEEDS)
def test_prometheus_answers_are_total_and_every_point_is_read_or_a_dead_letter(value: Any, seed: int) -> None:
    for variant in [value, *_answer_variants(seed)]:
        count()
        series, bad = answer_series(variant, "DCGM_FI_DEV_POWER_USAGE", "q")
        results = variant.get("result", []) if isinstance(variant, dict) else None
        if not isinstance(results, list):
            assert series == [] and len(bad) == 1
            continue
        valid = [r for r in results if _a_series(r)]
        points = sum(len(r.get("values", [])) for r in valid)
        assert len(series) == len(valid)
        assert sum(len(p) for _labels, p in series) + len(bad) == points + len(results) - len(valid)


def _a_series(r: Any) -> bool:
    """What the API sends as one series: string labels and a list of points."""
    return (
        isinstance(r, dict) and isinstance(r.get("metric"), dict) and isinstance(r.get("values", []), list)
        and all(isinstance(v, str) for v in r["metric"].values())
    )  # fmt: skip


def _answer_variants(seed: int) -> Iterator[Any]:
    """The real answer's shape with one value somewhere replaced (through the shared mutator, as JSON)."""
    rng = random.Random(seed)
    for payload in mutations(json.dumps(_ANSWER).encode(), seed):
        try:
            yield json.loads(payload)
        except ValueError:
            yield rng.choice([None, [], {"result": None}, payload.decode(errors="replace")])
