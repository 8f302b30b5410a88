"""The wheel hermeneut ships, and the systemd units that run it.

The wheel is built from the files the container image is built from (the packages, pyproject.toml, README.md),
with the command the Dockerfile runs, and installed into a clean venv (dependencies from the package index; nothing
from this checkout or its venv: no PYTHONPATH, another working directory) at ``/opt/hermeneut`` inside a throwaway
root, where the units of deploy/systemd expect it. There ``hermeneut --help`` runs, every module imports and
``pip check`` finds the dependencies consistent; then ``systemd-analyze verify --root`` accepts the units.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
SYSTEMD = ROOT / "deploy" / "systemd"
#: what the image's build context holds (.dockerignore keeps everything else out)
CONTEXT = ("pyproject.toml", "README.md", "hermeneut", "pipeline", "producers", "processors", "sinks", "alerting")
PACKAGES = ("hermeneut", "pipeline", "producers", "processors", "sinks", "alerting")


def clean_env() -> dict[str, str]:
    """This environment without what would let the clean venv see the checkout or another venv."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(cmd: Sequence[str | Path], cwd: Path, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout_s, check=False
    )
    assert done.returncode == 0, f"{shlex.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def dockerfile_wheel_command() -> list[str]:
    """The ``python -m pip wheel ...`` command of the Dockerfile's build stage."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    found = re.search(r"python -m pip wheel [^&\n]*", text)
    assert found, "the Dockerfile builds no wheel"
    return shlex.split(found.group(0))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root folder with hermeneut's wheel installed in a clean venv at <root>/opt/hermeneut."""
    work = tmp_path_factory.mktemp("packaging")
    context = work / "context"
    tracked = subprocess.run(["git", "ls-files", *CONTEXT], cwd=ROOT, capture_output=True, text=True, check=True)
    for name in tracked.stdout.split():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, context / name)
    cmd = dockerfile_wheel_command()
    dist = work / "dist"
    cmd[cmd.index("--wheel-dir") + 1] = str(dist)
    run([sys.executable, *cmd[1:]], cwd=context)
    (wheel,) = dist.glob("hermeneut-*.whl")
    root = work / "root"
    venv = root / "opt" / "hermeneut"
    run([sys.executable, "-m", "venv", venv], cwd=work)
    run([venv / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", wheel], cwd=work, timeout_s=1200)
    return root


def test_hermeneut_runs_from_the_wheel_in_a_clean_venv(installed: Path) -> None:
    venv = installed / "opt" / "hermeneut"
    out = run([venv / "bin" / "hermeneut", "--help"], cwd=installed).stdout
    for command in ("collect", "context", "process", "sink", "alerts", "web", "run"):
        assert re.search(rf"^\s+{command}\s", out, re.MULTILINE), out
    where = run([venv / "bin" / "python", "-c", "import pipeline; print(pipeline.__file__)"], cwd=installed).stdout
    assert where.startswith(str(venv)), where  # the wheel's copy, not the checkout


def test_every_module_imports_and_the_dependencies_are_consistent(installed: Path) -> None:
    python = installed / "opt" / "hermeneut" / "bin" / "python"
    script = (
        "import importlib, pkgutil\n"
        f"for top in {PACKAGES!r}:\n"
        "    for m in pkgutil.walk_packages(importlib.import_module(top).__path__, top + '.'):\n"
        "        if not m.name.endswith('__main__'):\n"
        "            importlib.import_module(m.name)\n"
        "            print(m.name)\n"
    )
    imported = run([python, "-c", script], cwd=installed).stdout.split()
    assert {"pipeline.metrics", "processors.app", "sinks.runner", "hermeneut.web.app"} <= set(imported)
    # every module of the checkout is in the wheel (walk_packages lists what is under each top-level package)
    modules = [
        p for top in PACKAGES for p in (ROOT / top).rglob("*.py") if p.parent != ROOT / top or p.stem != "__init__"
    ]
    assert len(imported) == sum(1 for p in modules if p.stem != "__main__")
    run([python, "-m", "pip", "check"], cwd=installed)


def _verify(root: Path, units: Sequence[str]) -> str:
    """``systemd-analyze verify --root``: everything it says (nothing when the units are good)."""
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", *units], capture_output=True, text=True, check=False
    )
    return (
        f"exit {done.returncode}\n{done.stdout}{done.stderr}".strip()
        if done.returncode or done.stdout or done.stderr
        else ""
    )


def test_the_systemd_units_verify_against_the_installed_wheel(installed: Path) -> None:
    assert shutil.which("systemd-analyze"), "systemd-analyze is missing: `make tools` installs Debian's systemd"
    # the units the units refer to (multi-user.target, network-online.target, ...) come from this system
    shutil.copytree("/lib/systemd/system", installed / "lib" / "systemd" / "system", symlinks=True, dirs_exist_ok=True)
    units = sorted(p.name for p in SYSTEMD.glob("*.service"))
    assert units == ["hermeneut-collect.service", "hermeneut-context.service"]
    target = installed / "etc" / "systemd" / "system"
    target.mkdir(parents=True, exist_ok=True)
    for unit in units:
        shutil.copy2(SYSTEMD / unit, target / unit)
    (installed / "etc" / "hermeneut").mkdir(parents=True, exist_ok=True)
    shutil.copy2(SYSTEMD / "hermeneut.env", installed / "etc" / "hermeneut" / "hermeneut.env")
    assert _verify(installed, units) == ""

    # the check can fail: a misspelt setting, and a unit whose command is not installed
    (target / "hermeneut-collect.service").write_text(
        (SYSTEMD / "hermeneut-collect.service").read_text().replace("Restart=on-failure", "Restart=sometimes")
    )
    assert "Failed to parse service restart specifier" in _verify(installed, ["hermeneut-collect.service"])
    (target / "hermeneut-collect.service").write_text(
        (SYSTEMD / "hermeneut-collect.service").read_text().replace("/opt/hermeneut/bin/", "/opt/elsewhere/bin/")
    )
    assert "is not executable" in _verify(installed, ["hermeneut-collect.service"])
