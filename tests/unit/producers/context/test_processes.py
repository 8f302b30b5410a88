"""Process inference: real nvidia-smi captures for the process lists, the real /proc of a live process, and a
proc tree laid out on disk for GPUs running known workloads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.errors import SourceUnavailable
from pipeline.events import GpuProcess, Workload
from producers.context.inventory import GpuInventory
from producers.context.processes import (
    ProcessSource,
    nvidia_smi_lister,
    parse_nvidia_smi_processes,
    read_process,
)
from tests import TESTDATA

DATA = TESTDATA
INVENTORY = GpuInventory.parse((DATA / "context" / "nvidia-smi-L-8xH100.txt").read_text())


def uuid(index: int) -> str:
    found = INVENTORY.resolve(str(index))
    assert found is not None
    return found


def test_real_nvidia_smi_process_lists() -> None:
    a10g = parse_nvidia_smi_processes((DATA / "nvidia-smi-xml" / "a10g.xml").read_text())
    assert a10g == {
        "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94": (GpuProcess(725, "/usr/lib/xorg/Xorg", 22 * 2**20, "graphics"),)
    }
    p4 = next(iter(parse_nvidia_smi_processes((DATA / "nvidia-smi-xml" / "tesla_p4.xml").read_text()).values()))
    assert len(p4) == 13 and p4[0] == GpuProcess(1188, "", None, "compute")  # vGPU guest: no names, memory N/A
    idle = parse_nvidia_smi_processes((DATA / "nvidia-smi-xml" / "dual_2070-v13.xml").read_text())
    assert list(idle.values()) == [(), ()]
    # a display filter may leave the uuid out: the position is the index
    filtered = (
        "<nvidia_smi_log><gpu id='0'/><gpu id='1'><processes><process_info><pid>7</pid></process_info>"
        "</processes></gpu></nvidia_smi_log>"
    )
    assert parse_nvidia_smi_processes(filtered) == {"0": (), "1": (GpuProcess(7, "", None, "compute"),)}


def test_read_a_real_live_process(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "MODEL_ID": "google-bert/bert-base-uncased", "HF_TOKEN": "hf_secret"}
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "--model_name_or_path", "google-bert/bert-base-uncased"],
        cwd=tmp_path,
        env=env,
    )
    try:
        time.sleep(0.2)
        info = read_process(Path("/proc"), GpuProcess(child.pid, "python"))
    finally:
        child.kill()
        child.wait()
    assert info.argv[1:] == (
        "-c",
        "import time; time.sleep(30)",
        "--model_name_or_path",
        "google-bert/bert-base-uncased",
    )
    assert info.cwd == str(tmp_path)
    assert info.env == (("MODEL_ID", "google-bert/bert-base-uncased"),)  # HF_TOKEN is never read


def _proc(root: Path, pid: int, *argv: str, env: dict[str, str] | None = None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()))


def test_process_source_on_a_proc_tree(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 101, "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen2.5-7B-Instruct")
    _proc(proc, 202, "./t-rex", "-a", "kawpow", "-o", "stratum+tcp://rvn.2miners.com:6060", "-u", "R.w")
    _proc(proc, 303, "/usr/bin/python3", "-u", "train.py", "--arch", "resnet50", env={"TORCHELASTIC_RUN_ID": "r1"})
    _proc(proc, 304, "/usr/bin/python3", "-u", "train.py", "--arch", "resnet50", env={"TORCHELASTIC_RUN_ID": "r1"})
    listing = {
        uuid(0): [GpuProcess(101, "python3")],
        uuid(1): [GpuProcess(202, "t-rex")],
        uuid(2): [GpuProcess(303, "python3"), GpuProcess(304, "python3")],
        # gone from /proc (or another pid namespace): nvidia-smi's name is the evidence
        "3": [GpuProcess(999, "/usr/bin/blender -b shot.blend -a")],
        uuid(4): [GpuProcess(725, "/usr/lib/xorg/Xorg", 22 * 2**20, "graphics")],
        uuid(5): [],
        "GPU-not-on-this-node": [GpuProcess(101, "python3")],
    }
    observed = ProcessSource(lambda: listing, INVENTORY, proc).poll()
    assert observed == {
        uuid(0): Workload(
            "llm-serving", source="process", confidence=0.7, model="Qwen/Qwen2.5-7B-Instruct", framework="vllm"
        ),
        uuid(1): Workload("hashing", source="process", confidence=0.7, framework="t-rex"),
        uuid(2): Workload("resnet-training", source="process", confidence=0.6, model="resnet50", framework="pytorch"),
        uuid(3): Workload("rendering", source="process", confidence=0.7, framework="blender"),
    }


def test_nvidia_smi_lister(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n[ \"$*\" = '-q -x -d PIDS' ] || exit 9\ncat {DATA / 'nvidia-smi-xml' / 'a10g.xml'}\n")
    fake.chmod(0o755)
    assert list(nvidia_smi_lister(5, str(fake))()) == ["GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"]
    broken = tmp_path / "broken-smi"
    broken.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\nexit 9\n"
    )
    broken.chmod(0o755)
    with pytest.raises(SourceUnavailable, match="could not communicate with the driver"):
        nvidia_smi_lister(5, str(broken))()
    with pytest.raises(SourceUnavailable):
        nvidia_smi_lister(5, str(tmp_path / "missing"))()
