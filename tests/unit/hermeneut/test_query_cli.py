"""The query commands: each answers --help, and a malformed question is one line and exit code 1 before
anything is queried (the InfluxDB named here does not exist)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli

COMMANDS = [
    ["trend"], ["top"], ["compare"], ["compare", "job"], ["compare", "models"], ["anomalies"], ["jobs"],
    ["storage"], ["storage", "setup"], ["storage", "status"], ["storage", "rollup"], ["web"],
]  # fmt: skip


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


MALFORMED = [
    (["trend", "--field", "power_limit_watts"], "power_limit_watts is a limit of the GPU"),
    (["trend", "--by", "rack"], "group-by 'rack' is not one of"),
    (["trend", "--fn", "avg"], "function 'avg' is not one of"),
    (["trend", "--range", "1h", "--start", "2025-01-01T00:00:00Z"], "either a range"),
    (["trend", "--gpu", 'GPU-1" or true'], "has characters a gpu cannot have"),
    (["top", "coolest"], "top list 'coolest' is not one of"),
    (["top", "wasted", "--threshold", "0"], "threshold 0 is not a utilization percentage"),
    (["compare", "job", "j'1"], "has characters a job cannot have"),
    (["compare", "models", "A", "A", "--application", "llm-serving"], "compare two different GPU models"),
    (["compare", "models", "A", "B", "--application", "crypto"], "application 'crypto' is not one of"),
    (["anomalies", "--every", "1 hour"], "window '1 hour' is not a duration"),
    (["storage", "rollup", "--at", "noon"], "--at 'noon' is not a time"),
    (["jobs", "--node", "n1"], "job summaries are per job, not per node or GPU"),
]


@pytest.mark.parametrize(("args", "message"), MALFORMED, ids=[" ".join(a) for a, _ in MALFORMED])
def test_malformed_questions_exit_1_with_one_line(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", "t")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("hermeneut: ")


def test_unreachable_influxdb_is_one_line_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", "t")
    result = CliRunner().invoke(cli, ["top", "hot"])
    assert result.exit_code == 3
    assert result.output.count("\n") == 1 and "did not answer" in result.output
