"""The README's runnable examples run: each shell block marked ``<!-- runnable ... -->`` is executed line by line
(its ``$`` lines, with ``\\`` continuations) against the test's own Kafka and InfluxDB, every command must exit 0,
and the summary lines the README prints (``rows read``, ``stored``, ...) must be what the command printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import Settings, settings_env

from .conftest import InfluxServer, KafkaServer
from .test_import import import_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- runnable"
#: summary lines whose printed value the README states and the test compares
SUMMARY = re.compile(r"^(rows read|stored|dead-lettered|GPUs|jobs|time range)\s{2,}\S")


def runnable_blocks(text: str) -> list[tuple[list[str], list[str]]]:
    """Each marked block as (commands, the summary lines it shows)."""
    blocks = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(MARK):
            continue
        assert lines[i + 1].startswith("```"), f"README line {i + 2}: a runnable mark must sit right above a block"
        body = []
        for inner in lines[i + 2 :]:
            if inner.startswith("```"):
                break
            body.append(inner)
        commands: list[str] = []
        shown = [b for b in body if SUMMARY.match(b)]
        for b in body:
            if b.startswith("$ "):
                commands.append(b[2:])
            elif commands and commands[-1].endswith("\\"):
                commands[-1] = commands[-1][:-1] + " " + b.strip()
        blocks.append(([re.sub(r"\s+#.*$", "", c) for c in commands], shown))
    return blocks


def test_the_readme_has_runnable_blocks() -> None:
    blocks = runnable_blocks((ROOT / "README.md").read_text())
    assert blocks and all(commands for commands, _shown in blocks)


def test_runnable_blocks_parse_continuations() -> None:
    text = f"{MARK} -->\n```sh\n$ a \\\n    --b c   # note\nrows read        5\n$ d\n```\n"
    assert runnable_blocks(text) == [(["a  --b c", "d"], ["rows read        5"])]


def test_the_readme_examples_run(
    kafka_server: KafkaServer, influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> None:
    settings = import_settings(kafka_server, influx_server, defaults, tmp_path / "state")
    env = os.environ | settings_env(settings) | {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for commands, shown in runnable_blocks((ROOT / "README.md").read_text()):
        script = "set -e\n" + "\n".join(commands)
        done = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert done.returncode == 0, f"{commands} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        printed = [" ".join(line.split()) for line in done.stdout.splitlines()]
        for line in shown:
            assert " ".join(line.split()) in printed, f"the README shows {line!r}; the command printed:\n{done.stdout}"
