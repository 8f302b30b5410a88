"""The CLI reference (docs/cli-reference.md), generated from the ``hermeneut`` command itself: every command and
subcommand with its help and each option as ``--help`` prints it, so the page cannot drift from the code
(tests/unit/hermeneut/test_cli_reference.py compares the two).

``python -m hermeneut.cli.reference > docs/cli-reference.md`` writes it again after a command changes.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click

from hermeneut.cli import cli


def commands(group: click.Group = cli, path: tuple[str, ...] = ("hermeneut",)) -> Iterator[tuple[str, click.Command]]:
    """(``hermeneut a b``, the command) for the group and every command under it, depth first, in name order."""
    yield " ".join(path), group
    ctx = click.Context(group, info_name=path[-1])
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section(name: str, command: click.Command) -> list[str]:
    """One command's section: its usage, its help, and its options and arguments as a table."""
    ctx = click.Context(command, info_name=name)
    usage = " ".join([name, *command.collect_usage_pieces(ctx)])
    out = [f"## `{name}`", "", f"`{usage}`", ""]
    helptext = inspect.cleandoc(command.help or "")
    if helptext:
        out += [helptext.split("\b")[0].strip(), ""]
    rows = [p.get_help_record(ctx) for p in command.get_params(ctx)]
    # the help option is every command's (``-h, --help`` once a parent context has set its names: click caches it)
    records = [r for r in rows if r is not None and "--help" not in r[0].split(", ")]
    if records:
        out += ["| option | what |", "|---|---|"]
        out += [f"| `{_cell(opts)}` | {_cell(what)} |" for opts, what in records]
        out.append("")
    return out


def reference() -> str:
    lines = [
        "# CLI reference",
        "",
        "Generated from the `hermeneut` command by `python -m hermeneut.cli.reference > docs/cli-reference.md`; a test",
        "fails when it is not current. Every command also answers `--help`. Exit codes: 0 done, 1 an answer that",
        "fails (a bad query, acceptance not met), 2 a configuration or input refused before anything starts, 3 a",
        "service that does not answer, 4 an incomplete run or an empty selection, 128 + N stopped by signal N.",
        "",
    ]
    for name, command in commands():
        lines += section(name, command)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(reference(), end="")
