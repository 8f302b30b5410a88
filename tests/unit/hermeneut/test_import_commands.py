"""``hermeneut import <name>`` comes from the registry: one subcommand per importer, its options the settings its
Config declares with :func:`pipeline.registry.setting` (declared once, with their defaults), plus what every import
takes. A new importer in the registry gets its subcommand without a line of CLI code."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from hermeneut.cli.importing import COMMON, import_group, importer_command
from pipeline import registry
from pipeline.registry import FLAG, setting


def _settings(name: str) -> set[str]:
    return {f.name for f in dataclasses.fields(registry.load("importer", name).Config) if FLAG in f.metadata}


@pytest.mark.parametrize("name", registry.names("importer"))
def test_every_importer_has_its_subcommand_with_its_configs_settings(name: str) -> None:
    command = import_group.commands[name]
    common = {p.name for p in COMMON}
    assert {p.name for p in command.params} - common == _settings(name)
    assert command.help == registry.load("importer", name).description  # type: ignore[attr-defined]


def test_a_settings_bounds_and_choices_are_the_options(tmp_path: Path) -> None:
    log = tmp_path / "gpu.csv"
    log.write_text("timestamp, power.draw [W]\n2025/01/01 00:00:00.000, 100 W\n")
    bad = CliRunner().invoke(cli, ["import", "nvidia-smi-csv", str(log), "--gpus-per-timestamp", "0"])
    assert bad.exit_code == 2 and "--gpus-per-timestamp" in bad.output
    bad = CliRunner().invoke(cli, ["import", "dcgm-exporter", str(log), "--application", "mining"])
    assert bad.exit_code == 2 and "--application" in bad.output
    missing = CliRunner().invoke(cli, ["import", "table", str(log)])
    assert missing.exit_code == 2 and "--mapping" in missing.output


@dataclasses.dataclass(frozen=True)
class _Config:
    paths: tuple[Path, ...] = setting((), "Files.", input=True, argument=True)
    depth: int = setting(3, "How deep.", minimum=1)
    cluster: str = "local"


class _Importer:
    name = "fake"
    Config = _Config
    description: ClassVar[str] = "Fake files."


def test_an_importer_added_to_the_registry_gets_its_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "load", lambda kind, name: _Importer)
    command = importer_command("fake")
    assert command.name == "fake" and command.help == "Fake files."
    options = {p.name: p for p in command.params}
    assert set(options) == {"paths", "depth"} | {p.name for p in COMMON}
    assert "[default: 3]" in (getattr(options["depth"], "help", "") or "")
