"""``hermeneut collect``: help, a missing NVML as one readable line, and a run against an unreachable exporter."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli


@pytest.fixture
def kafka_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HERMENEUT_SERVICES__STATE_DIR", str(tmp_path))
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_COLLECTOR__SHUTDOWN_GRACE_S", "0")


def test_help() -> None:
    result = CliRunner().invoke(cli, ["collect", "--help"])
    assert result.exit_code == 0 and "--source [nvml|dcgm-exporter|amd-exporter|amd-smi|simulator]" in result.output


@pytest.mark.usefixtures("kafka_env")
def test_no_nvml_here_is_one_readable_line() -> None:
    # this machine has no NVIDIA driver: NVML cannot load, and that is said in one line, not a traceback
    result = CliRunner().invoke(cli, ["collect", "--source", "nvml", "--duration", "1"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hermeneut: cannot start the nvml source:")
    assert "Traceback" not in result.output


@pytest.mark.usefixtures("kafka_env")
def test_no_amd_smi_here_is_one_readable_line() -> None:
    result = CliRunner().invoke(cli, ["collect", "--source", "amd-smi", "--binary", "no-such-amd-smi"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        "hermeneut: cannot start the amd-smi source: amd-smi source: 'no-such-amd-smi' is not a command here "
        "(install amd-smi, or --binary)"
    ]


@pytest.mark.usefixtures("kafka_env")
def test_an_unreachable_exporter_is_counted_round_after_round(tmp_path: Path) -> None:
    stats = tmp_path / "collect.json"
    result = CliRunner().invoke(
        cli,
        ["collect", "--source", "dcgm-exporter", "--url", "http://127.0.0.1:9/metrics", "--interval", "0.1",
         "--duration", "0.5", "--stats-file", str(stats)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "0 samples" in result.output and "failed reads" in result.output
    assert '"source_errors": ' in stats.read_text()


@pytest.mark.usefixtures("kafka_env")
def test_bad_options_exit_2() -> None:
    result = CliRunner().invoke(cli, ["collect", "--source", "dcgm-exporter", "--url", "ftp://x/metrics"])
    assert result.exit_code == 2 and "http://" in result.output
    result = CliRunner().invoke(cli, ["collect", "--interval", "0.01"])
    assert result.exit_code == 2
