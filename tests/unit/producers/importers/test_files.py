"""The file importers on real captures: nvidia-smi CSV logs, nvidia-smi -q -x captures, saved dcgm-exporter scrapes
and a CSV (and parquet) trace through a mapping. Values are checked against the files' own text."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from pipeline import registry
from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.events import Workload
from producers.importers.nvsmi_csv import NvsmiCsvConfig, NvsmiCsvImporter
from producers.importers.rows import Block
from tests import TESTDATA

MIB = 2.0**20
NANOGPT = TESTDATA / "nanogpt-pr643-h100x8-nvsmi-timeseries"
CSV_DIR = TESTDATA / "nvidia-smi-csv"


def blocks(name: str, **options: object) -> list[Block]:
    importer = registry.create("importer", name, Settings(cluster="dc1"), **options)
    importer.open()
    try:
        return list(importer.blocks())
    finally:
        importer.close()


def test_nvidia_smi_csv_with_every_column_units_and_na() -> None:
    files = (CSV_DIR / "nvidia-h100-80gb-hbm3-idle.csv", CSV_DIR / "nvidia-h100-80gb-hbm3-load.csv")
    (idle, load) = blocks("nvidia-smi-csv", paths=files, node="h100")
    row = {k: float(v[0]) for k, v in load.rows.metrics.items()}
    # from the file: memory.used [MiB] 19818 MiB, power.draw [W] 631.95 W, utilization.gpu 100 %, P0, 5/5 gen
    assert row["memory_used_bytes"] == 19818 * MIB and row["memory_total_bytes"] == 81559 * MIB
    assert row["power_watts"] == 631.95 and row["power_limit_watts"] == 700.0
    assert row["utilization_gpu_percent"] == 100.0 and row["performance_state"] == 0.0
    assert row["pcie_link_gen"] == 5.0 and row["sm_clock_max_mhz"] == 1980.0
    assert "fan_speed_percent" not in row  # [N/A] on this board: absent, not zero
    assert load.rows.gpu_uuid == ("GPU-00000000-0000-0000-0000-000000000000",)
    assert load.rows.gpu_model == ("NVIDIA H100 80GB HBM3",) and load.rows.node == ("h100",)
    assert idle.rows.metrics["throttle_reasons_mask"][0] == 1.0  # 0x...01: GPU idle
    assert load.rejected == idle.rejected == ()


def test_a_mig_gpu_reports_no_utilization() -> None:
    (block,) = blocks("nvidia-smi-csv", paths=(CSV_DIR / "nvidia-h100-mig-load.csv",))
    assert "utilization_gpu_percent" not in block.rows.metrics and len(block.rows) == 1
    assert block.rows.node == ("nvidia-h100-mig-load",)  # no --node: the file's name


def test_nvidia_smi_csv_without_header_or_units() -> None:
    text = (CSV_DIR / "nvidia-l40s-load.csv").read_text().splitlines()
    header = [c.strip() for c in text[0].split(",")]
    with_units = NvsmiCsvImporter(NvsmiCsvConfig(node="n")).read("\n".join(text).encode(), "l40s", "n")
    # the same log as `--format=csv,noheader,nounits` writes it: the values without their units, no header line
    bare = ", ".join(
        c.strip().split(" ")[0] if c.strip()[:1].isdigit() else c.strip() for c in next(csv.reader([text[1]]))
    )
    names = ",".join(h.split(" [")[0] for h in header)
    noheader = NvsmiCsvImporter(NvsmiCsvConfig(node="n", columns=names)).read(bare.encode(), "l40s", "n")
    assert noheader.rejected == ()
    for name, column in with_units.rows.metrics.items():
        assert noheader.rows.metrics[name][0] == pytest.approx(column[0]), name


def test_a_cut_line_is_a_dead_letter_with_its_line_number() -> None:
    lines = (CSV_DIR / "nvidia-h200-load.csv").read_text().splitlines()
    block = NvsmiCsvImporter(NvsmiCsvConfig(node="n")).read(
        "\n".join([lines[0], lines[1], lines[1][:200]]).encode(), "h200.csv", "n"
    )
    assert len(block.rows) == 1
    (bad,) = block.rejected
    assert bad.reason == "malformed" and bad.origin == "h200.csv:3" and bad.original == lines[1][:200].encode()
    assert bad.detail.startswith("line 3: ") and "values for" in bad.detail


def test_nvidia_smi_xml_captures_through_the_nvml_collector() -> None:
    found = blocks("nvidia-smi-xml", paths=(TESTDATA / "nvidia-smi-xml",), node="lab")
    assert sum(len(b.rows) for b in found) == 18  # 16 captures, two of them dual-GPU
    (bad,) = [r for b in found for r in b.rejected]
    assert bad.origin == "gtx-1070-ti.xml" and "no <timestamp>" in bad.detail  # hand-trimmed: when is unknown
    a10g = next(b for b in found if b.label == "a10g.xml").rows
    assert a10g.gpu_model == ("NVIDIA A10G",)
    assert a10g.ts_ns[0] == 1_682_352_711_000_000_000  # <timestamp>Mon Apr 24 16:11:51 2023</timestamp>, in UTC
    xml = (TESTDATA / "nvidia-smi-xml" / "a10g.xml").read_text()
    assert f"<power_draw>{a10g.metrics['power_watts'][0]:.2f} W</power_draw>" in xml


def test_saved_dcgm_exporter_scrapes() -> None:
    folder = TESTDATA / "dcgm-exporter-cncf-ai-conformance"
    found = {b.label: b for b in blocks("dcgm-exporter", paths=(folder,), time="2026-03-06T12:00:00Z")}
    # kops_l4.prom holds the same scrape twice (its source printed it twice): which copy is right cannot be told
    (bad,) = found["kops_l4.prom"].rejected
    assert bad.reason == "malformed" and "repeats a series" in bad.detail and len(found["kops_l4.prom"].rows) == 0
    t4 = found["ericsson_t4_under_load.prom"].rows
    assert t4.gpu_model == ("Tesla T4",) and t4.ts_ns[0] == 1_772_798_400_000_000_000
    assert t4.metrics["utilization_gpu_percent"][0] == 91.0 and t4.metrics["memory_used_bytes"][0] == 5120 * MIB
    # DCGM's profiling ratios (0..1) in percent: PIPE_TENSOR_ACTIVE 0.0058, DRAM_ACTIVE 0.093
    assert t4.metrics["tensor_active_percent"][0] == pytest.approx(0.58, abs=0.01)
    assert t4.metrics["dram_active_percent"][0] == pytest.approx(9.3, abs=0.1)
    assert t4.workload is None  # no pod, namespace or hpc_job labels in these scrapes


def test_a_mig_instance_is_a_row_of_its_own_and_dcgms_blank_value_is_absent() -> None:
    folder = TESTDATA / "dcgm-exporter-nvidia-cloud-native-docs"
    found = {b.label: b for b in blocks("dcgm-exporter", paths=(folder,), node="k8s")}
    mig = found["a100_mig_dcgm_exporter_scrape.prom"].rows
    assert len(mig) == 2 and any(u.startswith("MIG-") for u in mig.gpu_uuid)
    assert any(m.endswith("MIG 1g.5gb") for m in mig.gpu_model)
    (bad,) = found["single_gpu_readme_example.prom"].rejected  # a literal "..." line (an elision in the doc)
    assert "not a sample" in bad.detail


def test_a_trace_through_a_mapping_file_matches_the_csv() -> None:
    path = NANOGPT / "gpu_metrics_f4f827dd.csv"
    (block,) = blocks("table", paths=(path,), mapping=NANOGPT / "mapping.toml")
    with path.open(newline="") as f:
        source = list(csv.DictReader(f))
    r = block.rows
    assert len(r) == len(source) == 6240 and block.rejected == ()
    assert r.metrics["power_watts"].tolist() == [float(row["power_W"]) for row in source]
    assert r.gpu_uuid[:2] == ("g150-gpu0", "g150-gpu1") and set(r.node) == {"g150"}
    assert set(r.workload or ()) == {Workload("llm-pretraining", job_id="nanogpt-pr643", source="import",
                                              confidence=1.0)}  # fmt: skip


def test_parquet_reads_like_csv(tmp_path: Path) -> None:
    table = pacsv.read_csv(NANOGPT / "gpu_metrics_f4f827dd.csv",
                           convert_options=pacsv.ConvertOptions(column_types={"timestamp": pa.string()}))  # fmt: skip
    pq.write_table(table, tmp_path / "trace.parquet")
    (from_parquet,) = blocks("table", paths=(tmp_path / "trace.parquet",), mapping=NANOGPT / "mapping.toml")
    (from_csv,) = blocks("table", paths=(NANOGPT / "gpu_metrics_f4f827dd.csv",), mapping=NANOGPT / "mapping.toml")
    assert np.array_equal(from_parquet.rows.ts_ns, from_csv.rows.ts_ns)
    for name, column in from_csv.rows.metrics.items():
        assert np.array_equal(from_parquet.rows.metrics[name], column), name


@pytest.mark.parametrize(
    ("mapping", "message"),
    [
        ('[time]\ncolumn = "timestamp"\n[fields]\npower = "power_W"', "'power' is not a schema field"),
        ('[time]\ncolumn = "ts"', "has no column 'ts' named in the mapping"),
        ('[time]\ncolumn = "timestamp"\n[fields]\npower_watts = {column = "power_W", unit = "hp"}',
         "unknown unit 'hp'"),
        ('[time]\ncolumn = "timestamp"\n[context]\napplication = "training"', "'training' is not one of"),
        ("[tyme]", "unknown section [tyme]"),
    ],
)  # fmt: skip
def test_a_wrong_mapping_is_one_line_before_anything_is_read(tmp_path: Path, mapping: str, message: str) -> None:
    (tmp_path / "m.toml").write_text(mapping)
    with pytest.raises(ConfigError) as err:
        blocks("table", paths=(NANOGPT / "gpu_metrics_f4f827dd.csv",), mapping=tmp_path / "m.toml")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_row_that_cannot_be_read_is_rejected_the_others_are_not(tmp_path: Path) -> None:
    lines = (NANOGPT / "gpu_metrics_f4f827dd.csv").read_text().splitlines()[:9]
    lines[4] = lines[4].replace(", 72.17", ", n/a W")  # a power cell no unit rule reads
    lines[5] = "not-a-time" + lines[5][lines[5].index(",") :]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    (block,) = blocks("table", paths=(tmp_path / "t.csv",), mapping=NANOGPT / "mapping.toml")
    assert len(block.rows) == 6
    assert [(r.origin, r.detail) for r in block.rejected] == [
        ("t.csv:5", "line 5: power_W 'n/a W' is not a number"),
        ("t.csv:6", "line 6: 'not-a-time' is not a time (iso8601)"),
    ]


def test_a_job_column_with_a_jobs_file_names_each_rows_application(tmp_path: Path) -> None:
    # the trace's GPU index as the job column: each GPU its own job, its application from the jobs file
    (tmp_path / "jobs.csv").write_text("job,application\n" + "".join(
        f"{g},{'llm-pretraining' if g < 4 else 'llm-serving'}\n" for g in range(8)))  # fmt: skip
    mapping = (NANOGPT / "mapping.toml").read_text().split("[context]")[0]
    (tmp_path / "m.toml").write_text(mapping + '[context]\njob_column = "gpu_index"\njobs_file = "jobs.csv"\n')
    (block,) = blocks("table", paths=(NANOGPT / "gpu_metrics_f4f827dd.csv",), mapping=tmp_path / "m.toml")
    by_gpu = dict(zip(block.rows.gpu_uuid, block.rows.workload or (), strict=True))
    assert by_gpu["g150-gpu1"] == Workload("llm-pretraining", job_id="1", source="import", confidence=1.0)
    assert by_gpu["g150-gpu6"] == Workload("llm-serving", job_id="6", source="import", confidence=1.0)
    (tmp_path / "jobs.csv").write_text("job,application\n0,training\n")
    with pytest.raises(ConfigError, match=r"jobs.csv:2: needs a job and an application"):
        blocks("table", paths=(NANOGPT / "gpu_metrics_f4f827dd.csv",), mapping=tmp_path / "m.toml")
