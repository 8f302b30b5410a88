"""docker-compose.yml, Dockerfile and .dockerignore, checked without Docker: structure, loopback-only ports,
health-gated start order, and that the env the containers get is exactly what ``pipeline.config`` loads."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from hermeneut.cli import cli
from pipeline.config import CONFIG_FILE_ENV, ENV_PREFIX, env_names, load_settings
from pipeline.services import influxdb

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

INFRA = {"kafka", "influxdb", "grafana"}
PIPELINE = {
    "topics": "topics",
    "simulator": "simulate",
    "processor": "process",
    "sink": "sink",
    "alerts": "alerts",
    "web": "web",
}
LONG_RUNNING = {"simulator", "processor", "sink", "alerts", "web"}
NEEDS_TOPICS = LONG_RUNNING
NEEDS_INFLUXDB = {"sink", "alerts", "web"}
REQUIRED_PIPELINE_ENV = {
    "HERMENEUT_KAFKA__BOOTSTRAP_SERVERS",
    "HERMENEUT_INFLUXDB__URL",
    "HERMENEUT_INFLUXDB__TOKEN",
    "HERMENEUT_INFLUXDB__ORG",
    "HERMENEUT_INFLUXDB__BUCKET",
}
DUMMY = "dummy-required-value-0123456789"


# --- a small implementation of Compose's interpolation (docs.docker.com/reference/compose-file/interpolation)


class MissingVariableError(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


def _raise_missing(name: str, message: str) -> str:
    raise MissingVariableError(name, message)


def interpolate(text: str, env: Mapping[str, str], on_missing: Callable[[str, str], str] = _raise_missing) -> str:
    """``text`` with ``$VAR``/``${VAR...}`` expanded from ``env``; ``on_missing`` handles a failing ``?``/``:?``."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$":
            out.append(text[i])
            i += 1
        elif text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            end = _closing_brace(text, i + 1)
            out.append(_expand(text[i + 2 : end], env, on_missing))
            i = end + 1
        elif m := _NAME.match(text, i + 1):
            out.append(env.get(m.group(), ""))
            i = m.end()
        else:
            out.append("$")
            i += 1
    return "".join(out)


def _closing_brace(text: str, open_at: int) -> int:
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced braces in {text!r}")


def _expand(body: str, env: Mapping[str, str], on_missing: Callable[[str, str], str]) -> str:
    m = _NAME.match(body)
    if not m:
        raise ValueError(f"invalid interpolation ${{{body}}}")
    name, rest = m.group(), body[m.end() :]
    value = env.get(name)
    if not rest:
        return value or ""
    op = next((o for o in _OPERATORS if rest.startswith(o)), None)
    if op is None:
        raise ValueError(f"unsupported interpolation ${{{body}}}")
    present = value is not None and (value != "" or not op.startswith(":"))

    def arg() -> str:  # lazily: an unused default may itself hold a failing ${X:?...}
        return interpolate(rest[len(op) :], env, on_missing)

    if op in (":-", "-"):
        return value if present and value is not None else arg()
    if op in (":?", "?"):
        return value if present and value is not None else on_missing(name, arg())
    return arg() if present else ""


def interpolated_names(text: str) -> set[str]:
    """Every variable name an interpolation in ``text`` refers to, nested ones included."""
    return set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text.replace("$$", "")))


# --- helpers


def _strings(node: Any) -> Iterator[str]:
    """Every string value (not mapping key) in a parsed YAML tree; Compose interpolates values only."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def _environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` in either Compose form (mapping, or list of ``NAME=value``)."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _resolved_env(service: Mapping[str, Any], host_env: Mapping[str, str]) -> dict[str, str]:
    """What the container would see, given the host env, with required-but-unset variables set to DUMMY."""
    return {k: interpolate(v, host_env, lambda _name, _msg: DUMMY) for k, v in _environment(service).items()}


def _seconds(duration: str | int | float) -> float:
    if isinstance(duration, int | float):
        return float(duration)
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
    return sum(float(n) * scale[u] for n, u in parts)


def _host_ip(port: str | Mapping[str, Any]) -> str | None:
    """The host address of a ``ports`` entry (short ``[IP:]HOST:CONTAINER`` or long syntax), None if unbound."""
    if isinstance(port, Mapping):
        return port.get("host_ip")
    parts = str(port).rsplit(":", 2)
    return parts[0].strip("[]") if len(parts) == 3 else None


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with comments dropped and ``\\`` continuations joined."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends in a line continuation"
    return [(ins.upper(), args.strip()) for ins, _, args in (line.partition(" ") for line in logical)]


def _exec_form(args: str) -> list[str]:
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return shlex.split(args)
    assert isinstance(value, list), args
    return [str(v) for v in value]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    svc = compose["services"]
    assert isinstance(svc, dict)
    return svc


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)
    monkeypatch.delenv(CONFIG_FILE_ENV, raising=False)
    return monkeypatch


# --- the interpolation helper itself (the checks below lean on it)


def test_interpolation_follows_compose_rules() -> None:
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET:-d}|${UNSET:-d}|${EMPTY:-d}|${EMPTY-d}", env) == "v|d|d|"
    assert interpolate("${UNSET:-${SET}}|${UNSET:-${ALSO_UNSET:-deep}}|$SET|$$SET", env) == "v|deep|v|$SET"
    assert interpolate("${SET:+alt}|${EMPTY:+alt}|${EMPTY+alt}", env) == "alt||alt"
    assert interpolate("${SET:?never}|${UNSET:-fine}", env) == "v|fine"
    with pytest.raises(MissingVariableError, match="UNSET: must be set"):
        interpolate("${UNSET:?must be set}", env)
    with pytest.raises(MissingVariableError):
        interpolate("${EMPTY:?must not be empty}", env)
    assert interpolated_names("a${X:-${Y}}b $Z $$NOT") == {"X", "Y", "Z"}


# --- docker-compose.yml


def test_expected_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) >= INFRA | set(PIPELINE), f"missing: {INFRA | set(PIPELINE) - set(services)}"
    assert services["kafka"]["image"] == "apache/kafka:4.1.1"
    assert str(services["influxdb"]["image"]).startswith("influxdb:2.7")


def test_every_published_port_is_loopback_only(services: dict[str, dict[str, Any]]) -> None:
    published = {name: svc.get("ports") or [] for name, svc in services.items()}
    assert published["kafka"] and published["influxdb"], "kafka and influxdb should be reachable from the host"
    for name, ports in published.items():
        for port in ports:
            assert _host_ip(port) == "127.0.0.1", f"{name}: port {port!r} is not bound to 127.0.0.1 only"
    assert "127.0.0.1:9092:9092" in published["kafka"]
    assert "127.0.0.1:8086:8086" in published["influxdb"]


def test_infra_has_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name in INFRA:
        check = services[name].get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no healthcheck"
        assert isinstance(check["test"], list) and check["test"][0] in ("CMD", "CMD-SHELL"), check
        assert _seconds(check["interval"]) > 0 and int(check["retries"]) > 0
    kafka_test = " ".join(services["kafka"]["healthcheck"]["test"])
    assert "/opt/kafka/bin/kafka-broker-api-versions.sh" in kafka_test
    assert "kafka:19092" in kafka_test, "the kafka healthcheck should use the internal listener"
    influx_test = " ".join(services["influxdb"]["healthcheck"]["test"])
    assert "influx ping" in influx_test or "/health" in influx_test
    assert "/api/health" in " ".join(services["grafana"]["healthcheck"]["test"])


def test_grafana_is_provisioned_from_the_repository(services: dict[str, dict[str, Any]]) -> None:
    mounts = {dst: src for src, dst, *_ in (str(v).split(":") for v in services["grafana"]["volumes"])}
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    assert mounts["/var/lib/grafana/dashboards"] == "./grafana/dashboards"
    for src in ("grafana/provisioning/datasources", "grafana/provisioning/dashboards", "grafana/dashboards"):
        assert (ROOT / src).is_dir(), src
    datasource = yaml.safe_load((ROOT / "grafana/provisioning/datasources/influxdb.yaml").read_text())
    (ds,) = datasource["datasources"]
    assert ds["uid"] == "hermeneut-influxdb" and ds["jsonData"]["version"] == "Flux"
    # the datasource's ${VAR}s are exactly what the grafana service is given
    env = _environment(services["grafana"])
    wanted = set(re.findall(r"\$\{(\w+)\}", (ROOT / "grafana/provisioning/datasources/influxdb.yaml").read_text()))
    assert wanted and wanted <= set(env), wanted - set(env)


def test_kafka_listeners_are_consistent(services: dict[str, dict[str, Any]]) -> None:
    env = _environment(services["kafka"])
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    for name in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[name] == "1", name
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert set(listeners) <= set(protocols) and set(advertised) <= set(listeners)
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in listeners
    assert env.get("KAFKA_INTER_BROKER_LISTENER_NAME", "PLAINTEXT") in advertised
    voter_port = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].rsplit(":", 1)[1]
    assert listeners[env["KAFKA_CONTROLLER_LISTENER_NAMES"]].endswith(f":{voter_port}")
    assert set(advertised.values()) == {"kafka:19092", "127.0.0.1:9092"}
    # what containers are told to use is what the broker advertises to them
    pipeline_servers = {_environment(services[s])["HERMENEUT_KAFKA__BOOTSTRAP_SERVERS"] for s in PIPELINE}
    assert pipeline_servers == {"kafka:19092"}


def test_infra_keeps_data_in_named_volumes(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, path in (
        ("kafka", _environment(services["kafka"])["KAFKA_LOG_DIRS"]),
        ("influxdb", "/var/lib/influxdb2"),
    ):
        mounts = dict(str(v).split(":")[:2] for v in services[name].get("volumes") or [])
        assert path in mounts.values(), f"{name}: nothing mounted at {path}"
        source = next(src for src, dst in mounts.items() if dst == path)
        assert source in declared, f"{name}: {source} is not a named volume"


def test_pipeline_services_build_the_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    for name in PIPELINE:
        build = services[name].get("build")
        assert build is not None, f"{name} does not build the image"
        if isinstance(build, str):
            build = {"context": build}
        context, dockerfile = build["context"], build.get("dockerfile", "Dockerfile")
        assert (COMPOSE_FILE.parent / context / dockerfile).resolve() == DOCKERFILE, f"{name}: {build!r}"


@pytest.mark.parametrize("name", sorted(PIPELINE))
def test_pipeline_service_runs_its_cli_subcommand(services: dict[str, dict[str, Any]], name: str) -> None:
    command = services[name]["command"]
    args = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    assert args[0] == PIPELINE[name], f"{name} runs {args}"
    sub = cli.commands[args[0]]
    # parsing only (the callbacks never run): catches unknown subcommands and options
    with click.Context(cli) as parent:
        sub.make_context(args[0], args[1:], parent=parent)


def test_pipeline_start_order(services: dict[str, dict[str, Any]]) -> None:
    for name in PIPELINE:
        deps = services[name].get("depends_on")
        assert isinstance(deps, dict), f"{name}: depends_on needs the long form (conditions)"
        assert deps.get("kafka", {}).get("condition") == "service_healthy", f"{name} must wait for kafka healthy"
        if name in NEEDS_INFLUXDB:
            assert deps.get("influxdb", {}).get("condition") == "service_healthy", name
        if name in NEEDS_TOPICS:
            assert deps.get("topics", {}).get("condition") == "service_completed_successfully", name
    assert "topics" not in (services["topics"].get("depends_on") or {})


def test_restart_and_graceful_stop(services: dict[str, dict[str, Any]]) -> None:
    for name in LONG_RUNNING:
        assert services[name].get("restart") == "unless-stopped", name
        assert _seconds(services[name].get("stop_grace_period", "10s")) >= 30, f"{name} gets no time to drain"
    assert services["topics"].get("restart", "no") == "no", "topics is one-shot"


def test_every_hermeneut_name_is_a_setting(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    known = env_names()
    in_environment = {k for svc in services.values() for k in _environment(svc) if k.startswith(ENV_PREFIX)}
    in_interpolation = {n for s in _strings(compose) for n in interpolated_names(s) if n.startswith(ENV_PREFIX)}
    # the scan must have seen something, or this test proves nothing
    assert in_environment >= REQUIRED_PIPELINE_ENV
    assert "HERMENEUT_INFLUXDB__TOKEN" in in_interpolation
    assert in_environment | in_interpolation <= known, (
        f"unknown settings: {(in_environment | in_interpolation) - known}"
    )


def test_pipeline_env_names_the_servers(services: dict[str, dict[str, Any]]) -> None:
    for name in PIPELINE:
        env = _environment(services[name])
        assert env.keys() >= REQUIRED_PIPELINE_ENV, f"{name} lacks {REQUIRED_PIPELINE_ENV - env.keys()}"
        assert env["HERMENEUT_INFLUXDB__URL"] == "http://influxdb:8086"


def test_influxdb_token_is_required(services: dict[str, dict[str, Any]]) -> None:
    for name in ("influxdb", *PIPELINE):
        with pytest.raises(MissingVariableError) as err:
            {k: interpolate(v, {}) for k, v in _environment(services[name]).items()}
        assert err.value.name == "HERMENEUT_INFLUXDB__TOKEN", name


@pytest.mark.parametrize(
    "host_env",
    [
        {},
        {
            "HERMENEUT_INFLUXDB__TOKEN": "t0k3n-from-the-host",
            "HERMENEUT_INFLUXDB__ORG": "fleet",
            "HERMENEUT_INFLUXDB__BUCKET": "gpus",
            "HERMENEUT_CLUSTER": "dc-7",
            "HERMENEUT_SAMPLE_INTERVAL_S": "0.5",
        },
    ],
    ids=["defaults", "host-overrides"],
)
def test_compose_env_loads_as_settings(
    services: dict[str, dict[str, Any]], clean_env: pytest.MonkeyPatch, host_env: dict[str, str]
) -> None:
    influx_init = _resolved_env(services["influxdb"], host_env)
    for name in PIPELINE:
        env = _resolved_env(services[name], host_env)
        with clean_env.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            settings = load_settings()
        assert not settings.uses_local_kafka and not settings.uses_local_influxdb, "would try to start local services"
        assert settings.kafka.bootstrap_servers == "kafka:19092"
        assert settings.influxdb.url == "http://influxdb:8086"
        token = settings.influxdb.token
        assert token is not None
        assert token.get_secret_value() == host_env.get("HERMENEUT_INFLUXDB__TOKEN", DUMMY)
        # the sink writes with exactly what InfluxDB was set up with
        assert token.get_secret_value() == influx_init["DOCKER_INFLUXDB_INIT_ADMIN_TOKEN"]
        assert settings.influxdb.org == influx_init["DOCKER_INFLUXDB_INIT_ORG"]
        assert settings.influxdb.bucket == influx_init["DOCKER_INFLUXDB_INIT_BUCKET"]
        if host_env:
            assert settings.cluster == host_env["HERMENEUT_CLUSTER"]
            assert settings.sample_interval_s == float(host_env["HERMENEUT_SAMPLE_INTERVAL_S"])
            assert settings.influxdb.org == host_env["HERMENEUT_INFLUXDB__ORG"]
    assert len(influx_init["DOCKER_INFLUXDB_INIT_PASSWORD"]) >= 8, "InfluxDB refuses passwords under 8 characters"


# --- Dockerfile and .dockerignore


def test_dockerfile_installs_the_project_as_non_root() -> None:
    assert DOCKERFILE.is_file()
    instructions = _dockerfile_instructions()
    args = {k: default for ins, v in instructions if ins == "ARG" for k, _, default in [v.partition("=")]}
    stages = [v.split()[0] for ins, v in instructions if ins == "FROM"]
    final_image = interpolate(stages[-1], args)
    assert final_image == "python:3.11-slim", final_image
    # the project goes in as the wheel it builds (the one tests/integration/test_packaging.py installs), never as
    # `pip install .` of the source tree
    runs = [v for ins, v in instructions if ins == "RUN"]
    assert any(re.search(r"\bpip wheel --no-deps --wheel-dir (\S+) \.(\s|$)", v) for v in runs), runs
    assert any(re.search(r"\bpip install /dist/hermeneut-\*\.whl\b", v) for v in runs), runs
    assert not any(re.search(r"\bpip install\b.*\s\.(\s|$)", v) for v in runs), runs

    users = [v for ins, v in instructions if ins == "USER"]
    assert users, "the image runs as root (no USER)"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"last USER is {users[-1]!r}"
    last = {ins: n for n, (ins, _) in enumerate(instructions)}
    assert last["USER"] > last["FROM"], "USER must be set in the final stage"

    entrypoints = [v for ins, v in instructions if ins == "ENTRYPOINT"]
    assert entrypoints and _exec_form(entrypoints[-1]) == ["hermeneut"], entrypoints


def test_dockerignore_keeps_local_state_out() -> None:
    patterns = {
        line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines() if line.strip() and line[0] != "#"
    }
    assert {".venv", ".git", ".env"} <= patterns, patterns
    for needed in (
        "pyproject.toml",
        "hermeneut",
        "pipeline",
        "producers",
        "processors",
        "sinks",
        "alerting",
        "README.md",
    ):
        assert needed not in patterns, f"{needed} is needed by `pip install .`"


def test_influxdb_runs_with_the_settings_the_local_services_were_measured_with(
    services: dict[str, dict[str, Any]],
) -> None:
    """The compose file's InfluxDB gets the environment the project's own influxd gets (pipeline.services.influxdb,
    docs/performance.md), and a host's own value wins."""
    env = _resolved_env(services["influxdb"], {})
    assert {k: env.get(k) for k in influxdb.ENVIRONMENT} == influxdb.ENVIRONMENT
    own = _resolved_env(services["influxdb"], {"INFLUXD_STORAGE_CACHE_SNAPSHOT_MEMORY_SIZE": "33554432"})
    assert own["INFLUXD_STORAGE_CACHE_SNAPSHOT_MEMORY_SIZE"] == "33554432"
