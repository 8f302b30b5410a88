"""The Iterate commands answer --help and turn bad input into one readable line with exit code 2."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli


@pytest.mark.parametrize("args", [["baselines"], ["baselines", "train"], ["baselines", "list"], ["feedback"]])
def test_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["feedback", "GPU-1", "--anomalous"], "is not <gpu uuid>@<epoch ms>"),
        (["feedback", "GPU-1@17x", "--not-anomalous"], "is not <gpu uuid>@<epoch ms>"),
        (["feedback", "GPU-1@1700000000000"], "Missing option"),
        (["baselines", "train", "--range", "a day"], "not a duration"),
        (["baselines", "train", "--min-samples", "3"], "min-samples"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_too_few_min_samples_in_settings_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_BASELINES__MIN_SAMPLES", "5")
    result = CliRunner().invoke(cli, ["baselines", "list"])
    assert result.exit_code == 2
    assert "baselines.min_samples" in result.output
