"""``hermeneut alerts ...``: every command answers --help, and malformed input is one line with exit code 2,
found before anything connects (the servers named here do not exist)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli

COMMANDS = ["run", "subscribe", "unsubscribe", "list", "silence", "unsilence", "ack", "history"]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help(command: str) -> None:
    result = CliRunner().invoke(cli, ["alerts", *([command] if command else []), "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", "t")


SUB = ["alerts", "subscribe", "--name", "n", "--owner", "o"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([*SUB, "--webhook", "http://h/x", "--match", 'severity=~"warning|critical'], "not closed"),
        ([*SUB, "--webhook", "http://h/x", "--match", 'sevrity="critical"'], "did you mean severity"),
        ([*SUB, "--webhook", "http://h/x", "--match", 'node=~"(("'], "invalid regular expression"),
        ([*SUB, "--webhook", "ftp://h/x"], "http:// or https:// URL"),
        ([*SUB, "--email", "ops@example.com"], "needs an SMTP server"),
        ([*SUB], "at least one receiver"),
        ([*SUB, "--kafka-topic", "t", "--group-wait", "soon"], "group wait 'soon' is not a duration"),
        ([*SUB, "--kafka-topic", "t", "--group-by", "job,flavour"], "group-by label 'flavour'"),
        (["alerts", "silence", "--match", 'node!="x"', "--for", "2h"], "at least one matcher must need a value"),
        (["alerts", "silence", "--match", 'node="x"', "--for", "a while"], "silence duration 'a while'"),
        (["alerts", "history", "--range", "yesterday"], "is not a duration"),
        (["alerts", "history", "--outcome", "lost"], "outcome 'lost' is not one of"),
        (["alerts", "history", "--detector", 'x" or true'], "may only hold letters"),
    ],
)
def test_malformed_input_is_one_line_and_exit_2(nowhere: None, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output
