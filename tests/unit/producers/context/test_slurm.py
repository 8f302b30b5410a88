"""Slurm: the shipped prolog/epilog scripts run for real, their files parsed; scontrol/squeue output parsed;
the command source run against stand-in squeue/scontrol executables on PATH."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pipeline.errors import ConfigError, SourceUnavailable
from pipeline.events import Workload
from producers.context.inventory import GpuInventory
from producers.context.slurm import (
    EPILOG,
    PROLOG,
    SlurmCommandSource,
    SlurmFileSource,
    SlurmJob,
    expand_hostlist,
    expand_ranges,
    job_workload,
    parse_comment,
    parse_env_file,
    parse_scontrol,
    parse_squeue_ids,
)
from producers.source import run_command
from tests import TESTDATA
from tests.fakes.context import FakeSlurm

DATA = TESTDATA / "context"
INVENTORY = GpuInventory.parse((DATA / "nvidia-smi-L-8xH100.txt").read_text())
SCONTROL = (DATA / "scontrol-show-job-d.txt").read_text()


def uuid(index: int) -> str:
    found = INVENTORY.resolve(str(index))
    assert found is not None
    return found


def run_prolog(directory: Path, script: Path = PROLOG, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script)],
        env={"PATH": os.environ["PATH"], "HERMENEUT_SLURM_DIR": str(directory), **env},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("gpu[08-10],login1", ["gpu08", "gpu09", "gpu10", "login1"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("tc-intel[002-004]", ["tc-intel002", "tc-intel003", "tc-intel004"]),
    ],
)
def test_hostlists(expr: str, hosts: list[str]) -> None:
    assert expand_hostlist(expr) == hosts


def test_ranges() -> None:
    assert expand_ranges("0-2,5") == [0, 1, 2, 5]
    with pytest.raises(ValueError):
        expand_ranges("N/A")


def test_comment() -> None:
    assert parse_comment("app=llm-finetuning, model=meta-llama/Llama-3.1-8B; note=x framework=axolotl") == {
        "application": "llm-finetuning",
        "model": "meta-llama/Llama-3.1-8B",
        "framework": "axolotl",
    }
    assert parse_comment("hermeneut.application=rendering") == {"application": "rendering"}
    assert parse_comment(None) == {}


def test_scontrol_show_job_detail() -> None:
    jobs = parse_scontrol(SCONTROL, "gpu01")
    assert [j.job_id for j in jobs] == ["4242", "4315"]  # 4301 runs on gpu03, 4400 holds no GPU
    pretrain, serve = jobs
    assert pretrain == SlurmJob(
        "4242",
        ("0", "1", "2", "3", "4", "5"),
        user="ana",
        name="llama3-70b-pt",
        account="foundation-models",
        comment="application=llm-pretraining model=meta-llama/Meta-Llama-3-70B framework=megatron",
        command="/home/ana/runs/llama3-70b/pretrain.sbatch",
        num_nodes=2,
        total_gpus=12,
    )
    assert serve.gpus == ("6", "7") and serve.name == "serve-qwen2.5-72b-vllm" and serve.total_gpus == 2
    assert [j.gpus for j in parse_scontrol(SCONTROL, "gpu03")] == [("2", "3")]
    assert parse_scontrol(SCONTROL, "gpu09") == []


def test_scontrol_job_names_with_spaces_and_old_formats() -> None:
    old = (
        "JobId=77 JobName=my training run\n   UserId=x(1) GroupId=x(1)\n   NumNodes=1\n   TRES=cpu=2,gres/gpu=1\n"
        "     Nodes=cortex-08 CPU_IDs=20 Mem=8192 GRES_IDX=gpu(IDX:5)\n"
    )
    (job,) = parse_scontrol(old, "cortex-08")
    assert (job.name, job.gpus, job.total_gpus) == ("my training run", ("5",), 1)


def test_job_workload_declared_guessed_unknown() -> None:
    pretrain, serve = parse_scontrol(SCONTROL, "gpu01")
    assert job_workload(pretrain) == Workload(
        "llm-pretraining",
        "4242",
        "ana",
        "slurm",
        0.95,
        tenant="foundation-models",
        model="meta-llama/Meta-Llama-3-70B",
        framework="megatron",
        job_gpus=12,
    )
    guessed = job_workload(serve)
    assert (guessed.application, guessed.framework, guessed.confidence) == ("llm-serving", "vllm", 0.6)
    bash = job_workload(SlurmJob("9", ("0",), name="bash", comment="application=not-a-class"))
    assert (bash.application, bash.confidence, bash.job_id) == ("unknown", 0.0, "9")


def test_squeue_ids() -> None:
    assert parse_squeue_ids((DATA / "squeue-gpu01.txt").read_text()) == ["4242", "4315", "4400"]
    assert parse_squeue_ids("4242\n123_7\nslurm_load_jobs error: x\n") == ["4242", "123_7"]


def test_real_prolog_and_epilog(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    done = run_prolog(
        jobs,
        SLURM_JOB_ID="4315",
        SLURM_JOB_USER="chen",
        SLURM_JOB_ACCOUNT="assistant",
        SLURM_JOB_GPUS="6,7",
        CUDA_VISIBLE_DEVICES="6,7",
        SLURM_JOB_NUM_NODES="1",
        SLURM_JOB_COMMENT="application=llm-serving\nmodel=Qwen/Qwen2.5-72B-Instruct",
    )
    assert done.returncode == 0 and done.stderr == ""
    written = (jobs / "4315.env").read_text()
    assert "SLURM_JOB_COMMENT=application=llm-serving model=Qwen/Qwen2.5-72B-Instruct\n" in written
    assert sorted(p.name for p in jobs.iterdir()) == ["4315.env"]  # no temporary file left
    job = parse_env_file(written, "4315.env")
    assert (job.job_id, job.gpus, job.user, job.account, job.total_gpus) == ("4315", ("6", "7"), "chen", "assistant", 2)
    observed = SlurmFileSource(jobs, INVENTORY).poll()
    assert set(observed) == {uuid(6), uuid(7)}
    assert observed[uuid(6)].model == "Qwen/Qwen2.5-72B-Instruct" and observed[uuid(6)].confidence == 0.95
    assert run_prolog(jobs, EPILOG, SLURM_JOB_ID="4315").returncode == 0
    assert list(jobs.iterdir()) == []


def test_prolog_never_fails_the_job(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert run_prolog(blocked / "jobs", SLURM_JOB_ID="1", SLURM_JOB_GPUS="0").returncode == 0
    assert run_prolog(tmp_path / "jobs").returncode == 0  # not inside a job


def test_file_source_follows_jobs_and_skips_bad_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = SlurmFileSource(tmp_path / "jobs", INVENTORY)
    assert source.poll() == {}  # directory not there yet: no job
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="10", SLURM_JOB_GPUS="0,1", SLURM_JOB_NUM_NODES="4")
    run_prolog(tmp_path / "jobs", SLURM_JOB_ID="11", CUDA_VISIBLE_DEVICES="NoDevFiles")
    (tmp_path / "jobs" / "12.env").write_text("this is not a job file\n")
    (tmp_path / "jobs" / "13.env").write_text("SLURM_JOB_ID=13\nSLURM_JOB_GPUS=9\n")
    first = source.poll()
    assert set(first) == {uuid(0), uuid(1)} and first[uuid(0)].job_gpus == 8
    assert source.poll() == first
    assert source.malformed == 1
    messages = [r.getMessage() for r in caplog.records]
    assert sum("12.env:1: expected KEY=value" in m for m in messages) == 1
    assert sum("job 13 gpu 9 is not a GPU of this node" in m for m in messages) == 1
    run_prolog(tmp_path / "jobs", EPILOG, SLURM_JOB_ID="10")
    assert source.poll() == {}


def test_stale_file_loses_to_the_newer_job(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    run_prolog(jobs, SLURM_JOB_ID="20", SLURM_JOB_GPUS="0")
    os.utime(jobs / "20.env", ns=(10**18, 10**18))
    run_prolog(jobs, SLURM_JOB_ID="21", SLURM_JOB_GPUS="0")
    os.utime(jobs / "21.env", ns=(2 * 10**18, 2 * 10**18))
    assert SlurmFileSource(jobs, INVENTORY).poll()[uuid(0)].job_id == "21"


def test_command_source_asks_scontrol_once_per_job() -> None:
    fake = FakeSlurm((DATA / "squeue-gpu01.txt").read_text(), SCONTROL)
    clock = [0.0]
    source = SlurmCommandSource("gpu01", INVENTORY, fake, refresh_s=300, squeue_interval_s=0, clock=lambda: clock[0])
    observed = source.poll()
    assert set(observed) == {uuid(i) for i in range(8)}
    assert observed[uuid(0)].job_id == "4242" and observed[uuid(7)].job_id == "4315"
    assert len(fake.calls) == 4  # squeue + scontrol for 4242, 4315, 4400
    source.poll()
    assert len(fake.calls) == 5  # only squeue: the jobs' allocations are cached
    fake.squeue = "4315\n"
    assert set(source.poll()) == {uuid(6), uuid(7)}
    clock[0] = 301.0
    source.poll()
    assert fake.calls[-1] == ["scontrol", "-d", "show", "job", "4315"]  # refreshed (the comment may change)
    fake.down = True
    with pytest.raises(SourceUnavailable):
        source.poll()


def test_real_commands_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_command against stand-in executables: output, exit codes and missing binaries."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(f"#!/bin/sh\ncat {DATA / 'squeue-gpu01.txt'}\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert run_command(["squeue", "--noheader"], 5).split() == ["4242", "4315", "4400"]
    with pytest.raises(SourceUnavailable, match="exited 1: slurm_load_jobs error: Invalid job id"):
        run_command(["scontrol", "-d", "show", "job", "1"], 5)
    source = SlurmCommandSource("gpu01", INVENTORY)
    assert source.poll() == {}  # scontrol failed for every job: nothing known, nothing raised
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="squeue and scontrol"):
        SlurmCommandSource("gpu01", INVENTORY)


def test_command_source_spares_slurmctld() -> None:
    fake = FakeSlurm((DATA / "squeue-gpu01.txt").read_text(), SCONTROL)
    clock = [0.0]
    source = SlurmCommandSource("gpu01", INVENTORY, fake, squeue_interval_s=30, clock=lambda: clock[0])
    first = source.poll()
    clock[0] = 29.0
    assert source.poll() == first
    assert [c[0] for c in fake.calls].count("squeue") == 1
    clock[0] = 30.0
    source.poll()
    assert [c[0] for c in fake.calls].count("squeue") == 2
