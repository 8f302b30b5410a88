"""docs/cli-reference.md is what hermeneut.cli.reference generates from the command itself, and it has a section for
every command, with every option of each."""

from __future__ import annotations

from pathlib import Path

import click

from hermeneut.cli.reference import commands, reference

PAGE = Path(__file__).resolve().parents[3] / "docs" / "cli-reference.md"


def test_the_page_is_current() -> None:
    assert PAGE.read_text() == reference(), (
        "docs/cli-reference.md is stale: python -m hermeneut.cli.reference > docs/cli-reference.md"
    )


def test_every_command_and_option_is_on_the_page() -> None:
    page = reference()
    listed = list(commands())
    assert len(listed) > 40
    for name, command in listed:
        assert f"## `{name}`" in page, name
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert any(opt in page for opt in param.opts), (name, param.opts)
    # a subcommand made from the registry is there too (the importers, the sinks)
    assert "## `hermeneut import table`" in page and "## `hermeneut sink`" in page
