"""The context commands answer --help and turn bad input into one readable line (exit 2) before connecting."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.cli.context import format_contexts
from pipeline import registry
from pipeline.events import GpuContext, Workload


@pytest.fixture(autouse=True)
def _unreachable_kafka(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HERMENEUT_SERVICES__STATE_DIR", str(tmp_path))
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")


@pytest.mark.parametrize(
    "args", [["context"], ["context", "set"], ["context", "clear"], ["context", "show"], ["context", "watch"]]
)
def test_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0 and "Usage:" in result.output


def _one_line_error(args: list[str], expected: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output


def test_set_rejects_an_unknown_application() -> None:
    _one_line_error(
        ["context", "set", "--node", "gpu01", "--gpu", "GPU-a", "--app", "llm-serve"],
        "unknown application 'llm-serve' (did you mean llm-serving?)",
    )


def test_set_and_clear_need_a_uuid() -> None:
    _one_line_error(
        ["context", "set", "--node", "gpu01", "--gpu", "0", "--app", "idle"], "expected a GPU-... or MIG-... uuid"
    )
    _one_line_error(["context", "clear", "--node", "gpu01", "--gpu", "gpu0"], "expected a GPU-... or MIG-... uuid")


def test_watch_needs_a_source() -> None:
    result = CliRunner().invoke(cli, ["context", "watch"])
    assert result.exit_code == 2 and result.output.strip() == (
        "hermeneut: no source: give --static, --slurm-dir, --squeue, --kubernetes and/or --processes"
    )
    _one_line_error(["context", "watch", "--slurm-dir", "/tmp/x", "--squeue"], "choose one")


def test_watch_rejects_a_bad_static_file_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "ctx.csv"
    bad.write_text("node,gpu,application\ngpu01,0,rendering\ngpu01,1,renderng\n")
    result = CliRunner().invoke(cli, ["context", "watch", "--static", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip() == f"hermeneut: {bad}:3: unknown application 'renderng' (did you mean rendering?)"


def test_show_table() -> None:
    now = 10**18
    table = format_contexts(
        [
            GpuContext("dc1", "gpu02", "GPU-b", now - 5 * 10**9, Workload("hashing", source="process", confidence=0.7)),
            GpuContext(
                "dc1",
                "gpu01",
                "GPU-a",
                now,
                Workload("llm-serving", "ns/vllm", source="kubernetes", confidence=0.6, job_gpus=2),
            ),
        ],
        now,
    ).splitlines()
    assert table[0].split() == [
        "node",
        "gpu",
        "application",
        "source",
        "conf",
        "job",
        "user",
        "tenant",
        "model",
        "framework",
        "gpus",
        "age",
    ]
    assert table[1].split() == [
        "gpu01",
        "GPU-a",
        "llm-serving",
        "kubernetes",
        "0.60",
        "ns/vllm",
        "-",
        "-",
        "-",
        "-",
        "2",
        "0s",
    ]
    assert table[2].split()[:5] == ["gpu02", "GPU-b", "hashing", "process", "0.70"] and table[2].endswith("5s")


def test_watch_offers_every_context_source_of_the_registry() -> None:
    names = registry.names("context")
    assert {"static", "slurm-dir", "squeue", "kubernetes", "processes"} <= set(names)
    page = CliRunner().invoke(cli, ["context", "watch", "--help"]).output
    assert all(f"--{name}" in page for name in names), page
