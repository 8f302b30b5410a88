from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.config import (
    Settings,
    StorageSettings,
    ValidationSettings,
    env_names,
    load_settings,
    settings_env,
)
from pipeline.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("HERMENEUT_"):
            monkeypatch.delenv(name)


def test_defaults_mean_local_services() -> None:
    s = load_settings()
    assert s.uses_local_kafka and s.uses_local_influxdb
    assert s.sample_interval_s == 1.0


def test_env_overrides_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("HERMENEUT_INFLUXDB__URL", "http://influx:8086/")
    monkeypatch.setenv("HERMENEUT_SAMPLE_INTERVAL_S", "0.5")
    s = load_settings()
    assert s.kafka.client_config()["bootstrap.servers"] == "k1:9092,k2:9092"
    assert s.influxdb.url == "http://influx:8086"
    assert s.sample_interval_s == 0.5
    assert not s.uses_local_kafka


def test_toml_file_and_env_priority(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "h.toml"
    cfg.write_text('cluster = "dc1"\n[topics]\nraw = "fleet.raw"\npartitions = 12\n')
    monkeypatch.setenv("HERMENEUT_TOPICS__PARTITIONS", "24")
    s = load_settings(cfg)
    assert (s.cluster, s.topics.raw, s.topics.partitions) == ("dc1", "fleet.raw", 24)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"HERMENEUT_SAMPLE_INTERVAL_S": "0.01"}, "sample_interval_s"),
        ({"HERMENEUT_KAFKA__BOOTSTRAP_SERVERS": "nohostport"}, "kafka.bootstrap_servers"),
        ({"HERMENEUT_INFLUXDB__URL": "influx:8086"}, "influxdb.url"),
        ({"HERMENEUT_TOPICS__PARTITIONS": "zero"}, "topics.partitions"),
        ({"HERMENEUT_KAFKA__SECURITY_PROTOCOL": "SASL_SSL"}, "sasl_mechanism"),
        ({"HERMENEUT_NOT_A_SETTING": "1"}, "HERMENEUT_NOT_A_SETTING"),
        ({"HERMENEUT_KAFKA__BOOTSTRAP_SERVER": "k:1"}, "did you mean HERMENEUT_KAFKA__BOOTSTRAP_SERVERS"),
    ],
)
def test_invalid_config_is_one_readable_line(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], needle: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("invalid configuration:")
    assert needle in message


def test_secrets_never_appear_in_errors_or_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", "s3cr3t-token")
    monkeypatch.setenv("HERMENEUT_KAFKA__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("HERMENEUT_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "hunter2" not in str(info.value)
    monkeypatch.setenv("HERMENEUT_KAFKA__SECURITY_PROTOCOL", "PLAINTEXT")
    s = load_settings()
    assert "s3cr3t" not in repr(s) and "hunter2" not in repr(s)


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_malformed_toml_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("cluster = \n[[[")
    with pytest.raises(ConfigError) as info:
        load_settings(cfg)
    assert "\n" not in str(info.value)


def test_settings_env_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Settings(cluster="c9", influxdb={"token": "t0k", "url": "http://x:1"})  # type: ignore[arg-type]
    env = settings_env(original)
    assert set(env) <= env_names()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert load_settings() == original


def test_empty_optional_values_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMENEUT_INFLUXDB__TOKEN", "")
    monkeypatch.setenv("HERMENEUT_KAFKA__SSL_CAFILE", "")
    monkeypatch.setenv("HERMENEUT_KAFKA__BOOTSTRAP_SERVERS", "")
    s = load_settings()
    assert s.influxdb.token is None and s.kafka.ssl_cafile is None and s.uses_local_kafka


def test_loading_never_writes_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    cfg = tmp_path / "h.toml"
    cfg.write_text('cluster = "dc7"\n')
    before = dict(os.environ)
    s = load_settings(cfg)
    assert s.cluster == "dc7" and type(s) is Settings and dict(os.environ) == before
    assert load_settings().cluster == "local"  # the file was for that call only
    monkeypatch.setenv("HERMENEUT_CONFIG", str(cfg))
    assert load_settings().cluster == "dc7" and load_settings(cfg) == s


@pytest.mark.parametrize(
    ("env", "ok"),
    [
        ({}, True),  # 6 days inside the default week
        ({"HERMENEUT_VALIDATION__MAX_AGE_S": "604800"}, False),  # a week: past retention when a sink lags
        ({"HERMENEUT_VALIDATION__MAX_AGE_S": "600000"}, False),  # inside, but without the margin
        ({"HERMENEUT_STORAGE__RAW_RETENTION_DAYS": "30", "HERMENEUT_VALIDATION__MAX_AGE_S": "2000000"}, True),
        # imported history: the same margin (it was allowed the whole retention, 7 d, and past it when written)
        ({"HERMENEUT_VALIDATION__BACKFILL_MAX_AGE_S": "518400"}, True),  # 6 d: the week less its seventh
        ({"HERMENEUT_VALIDATION__BACKFILL_MAX_AGE_S": "518401"}, False),
        ({"HERMENEUT_VALIDATION__BACKFILL_MAX_AGE_S": "604800"}, False),
        ({"HERMENEUT_STORAGE__RAW_RETENTION_DAYS": "30", "HERMENEUT_VALIDATION__BACKFILL_MAX_AGE_S": "2000000"}, True),
    ],
)
def test_the_age_limit_stays_inside_the_retention_with_a_margin(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], ok: bool
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if ok:
        load_settings()
        return
    with pytest.raises(ConfigError) as err:
        load_settings()
    (line,) = str(err.value).splitlines()
    (name,) = (n.split("__")[1].lower() for n in env if n.startswith("HERMENEUT_VALIDATION__"))
    assert f"validation.{name} (" in line and "storage.raw_retention_days" in line and "margin" in line


@pytest.mark.parametrize(
    ("days", "oldest_s"), [(7.0, 6 * 86_400.0), (1.0, 86_400.0 * 6 / 7), (30.0, 30 * 86_400 * 6 / 7)]
)
def test_unset_backfill_age_is_the_retention_less_the_margin(days: float, oldest_s: float) -> None:
    """Unset, imported history may be as old as the live bound may be at most: inside retention by a seventh."""
    live = ValidationSettings(max_age_s=3600.0)
    limits = Settings(storage=StorageSettings(raw_retention_days=days), validation=live).validation_limits()
    assert limits.backfill_max_age_s == pytest.approx(oldest_s)
    given = Settings(validation=ValidationSettings(backfill_max_age_s=3600.0)).validation_limits()
    assert given.backfill_max_age_s == 3600.0
