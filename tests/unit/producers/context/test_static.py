"""The static context file: TOML and CSV, wildcards, errors with line numbers, reload keeping the last good."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.events import Workload
from producers.context.inventory import GpuInventory
from producers.context.static import StaticSource, load, workload_from_fields
from tests import TESTDATA

INVENTORY = GpuInventory.parse((TESTDATA / "context" / "nvidia-smi-L-8xH100.txt").read_text())
GPU0, GPU3 = INVENTORY.resolve("0"), INVENTORY.resolve("3")

TOML = """\
# the inference pool of node gpu01
[[gpu]]
node = "*"
gpu = "*"
application = "llm-serving"
tenant = "assistant"
framework = "vllm"

[[gpu]]
node = "gpu01"
gpu = "3"
application = "idle"
job_id = "spare"

[[gpu]]
node = "gpu01"
gpu = "GPU-1d5e2f80-7c3a-4b8e-9f21-6a0b3c4d5e01"
application = "llm-finetuning"
job_id = "ft-7"
user = "ana"
model = "meta-llama/Llama-3.1-8B"
job_gpus = 1
confidence = 0.9
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_toml_with_wildcards(tmp_path: Path) -> None:
    source = StaticSource(_write(tmp_path, "ctx.toml", TOML), "gpu01", INVENTORY)
    observed = source.poll()
    assert len(observed) == 8
    assert observed[GPU0] == Workload(
        "llm-finetuning", "ft-7", "ana", "static", 0.9, model="meta-llama/Llama-3.1-8B", job_gpus=1
    )
    assert observed[GPU3] == Workload("idle", "spare", source="static", confidence=1.0)
    others = {w for uuid, w in observed.items() if uuid not in (GPU0, GPU3)}
    assert others == {Workload("llm-serving", source="static", confidence=1.0, tenant="assistant", framework="vllm")}
    # another node only gets the wildcard entry
    assert set(StaticSource(tmp_path / "ctx.toml", "gpu02", INVENTORY).poll().values()) == others


def test_csv(tmp_path: Path) -> None:
    text = (
        "# render farm\n"
        "node,gpu,application,job_id,tenant,job_gpus\n"
        "gpu01,0,rendering,shot-042,studio,2\n"
        "gpu01,1,rendering,shot-042,studio,2\n"
        "gpu09,0,hashing,,,\n"
    )
    observed = StaticSource(_write(tmp_path, "ctx.csv", text), "gpu01", INVENTORY).poll()
    assert set(observed) == {GPU0, INVENTORY.resolve("1")}
    assert observed[GPU0] == Workload(
        "rendering", "shot-042", source="static", confidence=1.0, tenant="studio", job_gpus=2
    )


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.toml", TOML.replace('"idle"', '"idel"'), r"a.toml:12: unknown application 'idel' \(did you mean idle\?\)"),
        ("a.toml", TOML.replace('job_id = "spare"', 'jobid = "spare"'), r"a.toml:13: unknown column 'jobid'"),
        ("a.toml", TOML.replace('gpu = "3"', 'gpu = "gpu3"'), r"a.toml:11: gpu must be a uuid"),
        ("a.toml", TOML.replace("job_gpus = 1", "job_gpus = 0"), r"a.toml:22: job_gpus must be at least 1"),
        ("a.toml", TOML.replace("confidence = 0.9", "confidence = 2"), r"a.toml:23: confidence must be between"),
        ("a.toml", TOML.replace('node = "gpu01"\ngpu = "3"', 'gpu = "3"'), r"a.toml:9: node is missing"),
        ("a.toml", "[[gpu]\nnode = 1", r"a.toml: malformed TOML: .*line 1"),
        ("a.toml", "[pool]\nx = 1\n", r"unknown table 'pool'"),
        ("a.csv", "node,gpu,application\ngpu01,0,rendering\ngpu01,1\n", r"a.csv:3: expected 3 columns"),
        ("a.csv", "node,gpu,application\ngpu01,0,rendering\ngpu01,0,idle\n", r"a.csv:3: .*already given on line 2"),
    ],
)
def test_bad_files_name_the_line(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(_write(tmp_path, name, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read static context file"):
        StaticSource(tmp_path / "nope.toml", "gpu01", INVENTORY)


def test_broken_edit_keeps_last_good_content(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, "ctx.toml", TOML)
    source = StaticSource(path, "gpu01", INVENTORY)
    before = source.poll()
    path.write_text(TOML.replace('"idle"', '"bogus"'))
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse-grained file systems
    assert source.poll() == before
    assert source.poll() == before
    assert source.reload_errors == 1
    assert sum("bogus" in r.getMessage() for r in caplog.records) == 1  # logged once
    path.write_text(TOML.replace('application = "idle"', 'application = "rendering"'))
    os.utime(path, ns=(2, 2))
    assert source.poll()[GPU3].application == "rendering"


def test_unknown_gpu_is_skipped_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, "ctx.csv", "node,gpu,application\ngpu01,12,rendering\ngpu01,1,rendering\n")
    source = StaticSource(path, "gpu01", INVENTORY)
    assert list(source.poll()) == [INVENTORY.resolve("1")]
    source.poll()
    assert sum("gpu 12 is not a GPU of node gpu01" in r.getMessage() for r in caplog.records) == 1


def test_workload_from_fields() -> None:
    assert workload_from_fields({"application": "unknown", "job_id": "7"}, "manual") == Workload(
        "unknown", "7", source="manual", confidence=0.0
    )
    with pytest.raises(ValueError, match="one of: llm-pretraining"):
        workload_from_fields({"application": "zzz"}, "manual")
    with pytest.raises(ValueError, match="whole number"):
        workload_from_fields({"application": "idle", "job_gpus": "two"}, "manual")
