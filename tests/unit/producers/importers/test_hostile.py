"""Hostile import files built from real captures: each mutation of issue 37 applied to a real file, and every
importer reads the file's good rows, dead-letters the bad one with its line (or GPU) and a true reason, and never
raises. Also a multi-GPU nvidia-smi log without a GPU identity column: refused with the fix, or read in the order
the user declares."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from pipeline import registry
from pipeline.config import Settings, TopicSettings
from pipeline.errors import ConfigError
from producers.importers.dcgm_files import DcgmFilesConfig, DcgmFilesImporter
from producers.importers.driver import ImportDriver
from producers.importers.nvsmi_csv import NvsmiCsvConfig, NvsmiCsvImporter
from producers.importers.nvsmi_xml import NvsmiXmlConfig, NvsmiXmlImporter
from producers.importers.prometheus import answer_series
from producers.importers.rows import Block
from producers.importers.table import csv_rows, load_mapping
from tests import TESTDATA
from tests.fakes.kafka import RecordingPublisher

NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
H100 = TESTDATA / "nvidia-smi-csv" / "nvidia-h100-80gb-hbm3-load.csv"
XML = TESTDATA / "nvidia-smi-xml"
SCRAPES = TESTDATA / "dcgm-exporter-cncf-ai-conformance"
LIMIT = csv.field_size_limit()

#: issue 37's hostile cells: (name, the cell, what the dead letter's reason says)
HOSTILE_NUMBERS = [
    ("a field over the CSV reader's limit", "7" * (LIMIT + 1), f"a field over {LIMIT:,} characters"),
    ("a form feed inside a cell", "30\x0c0", "is not a number"),
    ("a 5,000-digit value", "9" * 5000, "too long for a number"),
]


def _nanogpt_as_nvidia_smi(rows: int | None = None) -> str:
    """The nanoGPT run's real 8-GPU series as ``nvidia-smi --query-gpu=timestamp,temperature.gpu,utilization.gpu,
    power.draw --format=csv`` prints it on that node: one line per GPU and time, the time repeated, no index."""
    with (NANOGPT / "gpu_metrics_f4f827dd.csv").open(newline="") as f:
        source = list(csv.DictReader(f))[:rows]
    out = ["timestamp, temperature.gpu, utilization.gpu [%], power.draw [W]"]
    for r in source:
        when = r["timestamp"].replace("-", "/").replace("T", " ").removesuffix("Z")
        out.append(f"{when}, {r['temperature_C'].strip()}, {r['utilization_gpu_percent'].strip()} %, "
                   f"{r['power_W'].strip()} W")  # fmt: skip
    return "\n".join(out) + "\n"


def _nanogpt_power() -> dict[int, list[float]]:
    with (NANOGPT / "gpu_metrics_f4f827dd.csv").open(newline="") as f:
        out: dict[int, list[float]] = {}
        for r in csv.DictReader(f):
            out.setdefault(int(r["gpu_index"]), []).append(float(r["power_W"]))
    return out


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def _accounted(block: Block) -> tuple[int, int, int]:
    """(rows read, samples sent, dead letters) of the block through the import loop, with a recording publisher."""

    class One:
        name = "one"

        def open(self) -> None: ...
        def close(self) -> None: ...
        def total_rows(self) -> int | None:
            return None

        def blocks(self):  # type: ignore[no-untyped-def]
            yield block

    report = ImportDriver(One(), RecordingPublisher(), TopicSettings.with_prefix("t"), "dc1", "run").run()
    return report.rows_read, report.samples, report.rejected_total


# --- a log without a GPU identity -------------------------------------------------------------------------------


def test_a_multi_gpu_log_without_an_identity_column_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = _write(tmp_path, "g150.csv", _nanogpt_as_nvidia_smi())
    with pytest.raises(ConfigError) as err:
        registry.create("importer", "nvidia-smi-csv", Settings(), paths=(path,))
    message = str(err.value)
    assert "\n" not in message and "no index, uuid or pci.bus_id column" in message
    assert "line 3 has the time of line 2" in message and "--gpus-per-timestamp N" in message
    assert "--query-gpu=timestamp,index" in message


def test_the_cli_refuses_it_before_anything_starts(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from hermeneut.cli import cli

    path = _write(tmp_path, "g150.csv", _nanogpt_as_nvidia_smi(40))
    result = CliRunner().invoke(cli, ["import", "nvidia-smi-csv", str(path)], obj={"settings": Settings()})
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "g150.csv has no index, uuid or pci.bus_id column" in result.output


def test_a_declared_gpu_order_reads_each_time_as_its_gpus(tmp_path: Path) -> None:
    path = _write(tmp_path, "g150.csv", _nanogpt_as_nvidia_smi())
    importer = registry.create("importer", "nvidia-smi-csv", Settings(), paths=(path,), gpus_per_timestamp=8)
    (block,) = importer.blocks()
    assert block.rejected == () and len(block.rows) == 6240
    power = block.rows.metrics["power_watts"]
    for index, expected in _nanogpt_power().items():
        mine = [i for i, u in enumerate(block.rows.gpu_uuid) if u == f"g150-gpu{index}"]
        assert power[mine].tolist() == expected and {block.rows.gpu_index[i] for i in mine} == {index}
    assert _accounted(block) == (6240, 6240, 0)  # no "duplicate": every line its own GPU


def test_a_time_with_a_line_missing_is_dead_letters_the_others_are_read() -> None:
    lines = _nanogpt_as_nvidia_smi(24).splitlines()  # 3 times x 8 GPUs
    del lines[12]  # the second time's GPU 3 (line 13 of the file)
    block = NvsmiCsvImporter(NvsmiCsvConfig(gpus_per_timestamp=8)).read("\n".join(lines).encode(), "g.csv", "g150")
    assert len(block.rows) == 16 and len(block.rejected) == 7
    assert {r.origin for r in block.rejected} == {f"g.csv:{n}" for n in range(10, 17)}
    assert all("7 lines at this time for --gpus-per-timestamp 8" in r.detail for r in block.rejected)
    assert sorted(set(block.rows.gpu_index)) == list(range(8))


def test_a_one_gpu_log_needs_no_identity(tmp_path: Path) -> None:
    lines = _nanogpt_as_nvidia_smi(80).splitlines()
    path = _write(tmp_path, "one.csv", "\n".join(lines[:1] + lines[1::8]) + "\n")  # GPU 0's lines only
    importer = registry.create("importer", "nvidia-smi-csv", Settings(), paths=(path,))
    (block,) = importer.blocks()
    assert block.rejected == () and set(block.rows.gpu_uuid) == {"one-gpu0"} and len(block.rows) == 10


def test_read_alone_dead_letters_the_lines_it_cannot_tell_apart() -> None:
    block = NvsmiCsvImporter(NvsmiCsvConfig()).read(_nanogpt_as_nvidia_smi(16).encode(), "g.csv", "g150")
    assert len(block.rows) == 2 and len(block.rejected) == 14  # the first line of each time, 7 refused each
    assert all("which GPU it is cannot be told" in r.detail for r in block.rejected)


# --- nvidia-smi CSV ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("case", "cell", "reason"), HOSTILE_NUMBERS)
def test_nvidia_smi_csv_a_hostile_cell_costs_its_line_only(case: str, cell: str, reason: str) -> None:
    lines = _nanogpt_as_nvidia_smi(16).splitlines()
    lines[5] = re.sub(r"[\d.]+ W$", f"{cell} W", lines[5])
    block = NvsmiCsvImporter(NvsmiCsvConfig(gpus_per_timestamp=8)).read("\n".join(lines).encode(), "g.csv", "g")
    (bad,) = block.rejected
    assert (bad.origin, bad.reason) == ("g.csv:6", "malformed") and reason in bad.detail, case
    assert bad.detail.startswith("line 6: ") and len(bad.detail) < 300
    assert len(block.rows) == 15 and block.rows.origin[-1] == "g.csv:17"
    assert _accounted(block) == (16, 15, 1)


@pytest.mark.parametrize("when", ["1e300", "inf", "2262/04/12 00:00:00", "99999/01/01 00:00:00"])
def test_nvidia_smi_csv_a_time_out_of_range_is_a_dead_letter(when: str) -> None:
    lines = H100.read_text().splitlines()
    lines.append(lines[1])
    lines[1] = when + lines[1][lines[1].index(",") :]
    block = NvsmiCsvImporter(NvsmiCsvConfig()).read("\n".join(lines).encode(), "h100.csv", "n")
    (bad,) = block.rejected
    assert bad.origin == "h100.csv:2" and "is not a time" in bad.detail
    assert len(block.rows) == 1 and block.rows.metrics["power_watts"][0] == 631.95


def test_nvidia_smi_csv_a_5000_digit_index_is_a_dead_letter() -> None:
    lines = H100.read_text().splitlines()
    header = lines[0].split(", ")
    at = header.index("index")
    cells = next(csv.reader([lines[1]]))
    lines.append(lines[1])
    lines[1] = ",".join([*cells[:at], "9" * 5000, *cells[at + 1 :]])
    block = NvsmiCsvImporter(NvsmiCsvConfig()).read("\n".join(lines).encode(), "h100.csv", "n")
    (bad,) = block.rejected
    assert bad.origin == "h100.csv:2" and "is not a GPU index" in bad.detail and "(5000 characters)" in bad.detail
    assert len(block.rows) == 1


def test_nvidia_smi_csv_a_quoted_line_break_is_one_record() -> None:
    lines = H100.read_text().splitlines()
    # the board's name quoted over two lines (valid CSV), then the same reading again
    second = lines[1].replace("NVIDIA H100 80GB HBM3", '"NVIDIA H100\n80GB HBM3"', 1)
    block = NvsmiCsvImporter(NvsmiCsvConfig()).read("\n".join([lines[0], second, lines[1]]).encode(), "h.csv", "n")
    assert block.rejected == () and len(block.rows) == 2
    assert block.rows.gpu_model == ("NVIDIA H100\n80GB HBM3", "NVIDIA H100 80GB HBM3")
    assert block.rows.origin == ("h.csv:2", "h.csv:4")  # the second record starts after the two-line one
    assert block.rows.metrics["power_watts"].tolist() == [631.95, 631.95]


# --- table (CSV through a mapping) ------------------------------------------------------------------------------


def _table_block(lines: list[str]) -> Block:
    importer = registry.create(
        "importer", "table", Settings(), paths=(NANOGPT / "gpu_metrics_f4f827dd.csv",), mapping=NANOGPT / "mapping.toml"
    )
    return importer.read(csv_rows("\n".join(lines) + "\n"), "t.csv")  # type: ignore[no-any-return]


@pytest.mark.parametrize(("case", "cell", "reason"), HOSTILE_NUMBERS)
def test_table_a_hostile_cell_costs_its_row_only(case: str, cell: str, reason: str) -> None:
    lines = (NANOGPT / "gpu_metrics_f4f827dd.csv").read_text().splitlines()[:17]
    lines[5] = lines[5].rsplit(",", 1)[0] + f",{cell}"
    block = _table_block(lines)
    (bad,) = block.rejected
    assert bad.origin == "t.csv:6" and reason in bad.detail and len(bad.detail) < 300, case
    assert len(block.rows) == 15 and _accounted(block) == (16, 15, 1)


@pytest.mark.parametrize(
    ("column", "cell", "reason"),
    [(0, "1e300", "is not a time"), (0, "inf", "is not a time"), (1, "9" * 5000, "is not a GPU index"),
     (1, "\u00b2", "is not a GPU index")],
)  # fmt: skip
def test_table_a_hostile_time_or_index_costs_its_row_only(column: int, cell: str, reason: str) -> None:
    lines = (NANOGPT / "gpu_metrics_f4f827dd.csv").read_text().splitlines()[:17]
    cells = lines[5].split(",")
    cells[column] = cell
    lines[5] = ",".join(cells)
    block = _table_block(lines)
    (bad,) = block.rejected
    assert bad.origin == "t.csv:6" and reason in bad.detail
    assert len(block.rows) == 15


def test_table_a_quoted_line_break_is_one_record() -> None:
    lines = (NANOGPT / "gpu_metrics_f4f827dd.csv").read_text().splitlines()[:4]
    cells = lines[2].split(",")
    lines[2] = ",".join([*cells[:-1], f'"{cells[-1]}\n"'])  # the power cell, quoted, with a line break after it
    block = _table_block(lines)
    assert block.rejected == () and block.rows.origin == ("t.csv:2", "t.csv:3", "t.csv:5")
    assert block.rows.metrics["power_watts"][1] == float(cells[-1])


def test_table_a_parquet_that_is_not_one_is_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "trace.parquet", "timestamp,power\n")
    importer = registry.create("importer", "table", Settings(), paths=(path,), mapping=NANOGPT / "mapping.toml")
    with pytest.raises(ConfigError, match="is not a parquet file") as err:
        importer.open()
    assert "\n" not in str(err.value)


# --- nvidia-smi -q -x --------------------------------------------------------------------------------------------


def test_xml_a_5000_digit_total_costs_its_gpu_only() -> None:
    text = (XML / "dual_2080-v13.xml").read_text()
    bad_xml = re.sub(r"<total>[^<]*</total>", "<total>" + "9" * 5000 + " MiB</total>", text, count=1)
    block = NvsmiXmlImporter(NvsmiXmlConfig()).read(bad_xml.encode(), "dual.xml", "n")
    (bad,) = block.rejected
    assert bad.reason == "malformed" and "a value cannot be read" in bad.detail
    good = NvsmiXmlImporter(NvsmiXmlConfig()).read(text.encode(), "dual.xml", "n")
    assert len(good.rows) == 2 and len(block.rows) == 1 and bad.origin.startswith("dual.xml:gpu ")
    assert block.rows.gpu_uuid[0] == good.rows.gpu_uuid[1]  # the second board, read as in the intact capture
    for name, column in block.rows.metrics.items():
        assert column[0] == good.rows.metrics[name][1] or np.isnan(column[0]), name
    assert _accounted(block) == (2, 1, 1)


# --- saved dcgm-exporter scrapes and Prometheus answers ---------------------------------------------------------


@pytest.mark.parametrize("stamp", ["9" * 5000, "9" * 30, "-5"])
def test_dcgm_a_timestamp_out_of_range_costs_its_file_only(stamp: str) -> None:
    text = (SCRAPES / "ericsson_t4_under_load.prom").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("DCGM_FI_DEV_GPU_UTIL"))
    lines[at] += f" {stamp}"
    importer = DcgmFilesImporter(DcgmFilesConfig())
    block = importer.read("\n".join(lines).encode(), "t4.prom", "n", 1_772_798_400_000_000_000)
    (bad,) = block.rejected
    assert bad.reason == "malformed" and len(block.rows) == 0
    assert any(why in bad.detail for why in ("outside 1970..2262", "not a sample", "over 4,096 characters"))
    intact = importer.read(text.encode(), "t4.prom", "n", 1_772_798_400_000_000_000)
    assert len(intact.rows) == 1 and intact.rejected == ()


def test_prometheus_a_bad_point_or_series_costs_itself_only() -> None:
    good = {"metric": {"__name__": "DCGM_FI_DEV_POWER_USAGE", "gpu": "0", "UUID": "GPU-1"},
            "values": [[1772798400, "250.5"], ["inf", "1"], [1e300, "2"], [1772798401.5, "251"], ["x", "3"],
                       [1772798402, 4]]}  # fmt: skip
    answer = {"resultType": "matrix", "result": [good, {"metric": "GPU-2", "values": []}, 7]}
    series, bad = answer_series(json.loads(json.dumps(answer)), "DCGM_FI_DEV_POWER_USAGE", "q")
    assert series == [({"gpu": "0", "UUID": "GPU-1"}, [(1_772_798_400_000_000_000, 250.5),
                                                      (1_772_798_401_500_000_000, 251.0)])]  # fmt: skip
    assert len(bad) == 6 and all(r.reason == "malformed" and r.origin == "q" for r in bad)
    assert answer_series([], "M", "q")[1][0].detail == "M: the answer holds no list of series"


def test_the_mapping_of_the_nanogpt_trace_loads() -> None:
    assert load_mapping(NANOGPT / "mapping.toml").time_column == "timestamp"


@pytest.mark.parametrize("when", ["1e300", "inf", ""])
def test_a_line_whose_time_cannot_be_read_keeps_its_gpus_place(when: str) -> None:
    lines = _nanogpt_as_nvidia_smi(24).splitlines()
    for at in (10, 16, 17):  # the second time's GPU 1, its last GPU, and the third time's first
        lines[at] = when + lines[at][lines[at].index(",") :]
    block = NvsmiCsvImporter(NvsmiCsvConfig(gpus_per_timestamp=8)).read("\n".join(lines).encode(), "g.csv", "g")
    assert [r.origin for r in block.rejected] == ["g.csv:11", "g.csv:17", "g.csv:18"]
    assert all(("is not a time" if when else "the time is empty") in r.detail for r in block.rejected)
    assert len(block.rows) == 21 and block.rows.gpu_index == (*range(8), 0, *range(2, 7), *range(1, 8))


def test_dcgm_a_line_over_the_bound_costs_its_file_without_parsing_it() -> None:
    """A value of 131,073 digits and a letter: dcgm-exporter's value parser takes the square of its length (about
    13 minutes); the file is refused by its line's length first."""
    text = (SCRAPES / "ericsson_t4_under_load.prom").read_text()
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("DCGM_FI_DEV_GPU_UTIL"))
    lines[at] = lines[at].rsplit(" ", 1)[0] + " " + "7" * LIMIT + "x"
    block = DcgmFilesImporter(DcgmFilesConfig()).read("\n".join(lines).encode(), "t4.prom", "n", 0)
    (bad,) = block.rejected
    assert bad.detail == f"line {at + 1} is over 4,096 characters: not a line dcgm-exporter writes"


def test_a_line_without_a_time_at_the_end_is_a_dead_letter_too() -> None:
    """Found by the property test: one line past the last time's N, without a readable time, was carried to a next
    time that never came, and neither stored nor dead-lettered."""
    lines = _nanogpt_as_nvidia_smi(16).splitlines()
    lines.append("not a time" + lines[-1][lines[-1].index(",") :])
    block = NvsmiCsvImporter(NvsmiCsvConfig(gpus_per_timestamp=8)).read("\n".join(lines).encode(), "g.csv", "g")
    assert len(block.rows) == 16 and [r.origin for r in block.rejected] == ["g.csv:18"]
