"""The detectors' commands answer --help, and bad input is one readable line, not a trace."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli


@pytest.mark.parametrize("args", [["rightsize"], ["evaluate"]])
def test_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["rightsize", "--range", "seven days"], "not a duration"),
        (["rightsize", "--job", "a b"], "job id"),
        (["rightsize", "--job", "j1", "--application", "llm-serving"], "not both"),
    ],
)
def test_rightsize_rejects_bad_questions(monkeypatch: pytest.MonkeyPatch, args: list[str], message: str) -> None:
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", "t")
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output


def test_rightsize_unknown_application_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["rightsize", "--application", "crypto"])
    assert result.exit_code == 2 and "Traceback" not in result.output
