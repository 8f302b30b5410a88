"""Every CLI command answers --help, and bad input becomes one readable line with exit code 2, not a trace."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hermeneut.cli import cli
from pipeline.config import load_settings

COMMANDS = [
    [],
    ["services"],
    ["services", "up"],
    ["services", "install"],
    ["services", "status"],
    ["services", "down"],
    ["topics"],
    ["simulate"],
    ["process"],
    ["sink"],
    ["run"],
    ["trend"],
]


@pytest.mark.parametrize("args", COMMANDS)
def test_help(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_invalid_config_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_SAMPLE_INTERVAL_S", "-1")
    result = CliRunner().invoke(cli, ["services", "status"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "sample_interval_s" in lines[0]
    assert "Traceback" not in result.output


def test_missing_local_services_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HERMENEUT_SERVICES__STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["topics"])
    assert result.exit_code == 2
    assert "hermeneut services up" in result.output


def test_malformed_trend_query_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", "t")
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    result = CliRunner().invoke(cli, ["trend", "--every", "ten seconds"])
    assert result.exit_code == 1
    assert "not a duration" in result.output and "Traceback" not in result.output


def test_status_with_external_servers_starts_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HERMENEUT_SERVICES__STATE_DIR", str(tmp_path))
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://influx.example:8086")
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "kafka.example:9092")
    result = CliRunner().invoke(cli, ["services", "status"])
    assert result.exit_code == 0
    assert "external kafka.example:9092" in result.output
    assert "external http://influx.example:8086" in result.output


def test_kafka_only_commands_do_not_need_influxdb(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`topics` against an external Kafka must not ask for InfluxDB (it fails on the unreachable broker)."""
    monkeypatch.setenv("HERMENEUT_SERVICES__STATE_DIR", str(tmp_path))
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_KAFKA__REQUEST_TIMEOUT_S", "1")
    result = CliRunner().invoke(cli, ["topics"])
    assert "InfluxDB" not in result.output
    assert result.exit_code == 3 and "cannot reach Kafka" in result.output


def test_sink_without_token_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://127.0.0.1:9")
    result = CliRunner().invoke(cli, ["sink"])
    assert result.exit_code == 2 and "influxdb.token" in result.output


def test_services_install_takes_what_the_cache_holds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``make test`` installs the services before pytest (a cold influxd build outlasts a test's time limit); with
    both in the cache it builds nothing and says where they are."""
    monkeypatch.setenv("HERMENEUT_SERVICES__CACHE_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.services.cache_dir == tmp_path
    kafka_home = tmp_path / "kafka" / settings.kafka.version
    influx_home = tmp_path / "influxdb" / settings.influxdb.version
    for home in (kafka_home, influx_home):
        home.mkdir(parents=True)
    (kafka_home / ".complete").touch()
    (influx_home / "influxd").touch()
    result = CliRunner().invoke(cli, ["services", "install"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"kafka     {settings.kafka.version}: {kafka_home / 'libs'}",
        f"influxdb  {settings.influxdb.version}: {influx_home / 'influxd'}",
    ]
