"""Local Kafka + InfluxDB (and the dashboard) for people and tests without a cluster: ``hermeneut services
up|status|down``.

Each ``up`` gets a fresh run folder (``<state>/runs/<UTC time>/{kafka,influxdb}``) with data and logs, which are
kept after ``down``. Ports are free loopback ports. The endpoints and the generated InfluxDB token go to
``<state>/services.json`` (mode 0600), which every other command reads when the settings name no external
servers. Where the settings name an external Kafka or InfluxDB, nothing local is started for it. Pipeline stages
the main job leaves running (:func:`keep_stages`) are listed there too, and stop with the services.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from pipeline.config import Settings, settings_env
from pipeline.errors import ConfigError, ServiceError
from pipeline.services import influxdb, kafka
from pipeline.services.procs import answers, free_port, pid_alive, port_open, start_daemon, stop_pid, wait_until

log = logging.getLogger(__name__)


@dataclass
class LocalState:
    """What ``services up`` started, as stored in services.json."""

    run_dir: str
    kafka: dict[str, Any] | None = None
    influxdb: dict[str, Any] | None = None
    web: dict[str, Any] | None = None
    #: pipeline stages left running by the main job: name, pid, log, metrics (their /metrics URL)
    stages: list[dict[str, Any]] | None = None


def state_path(settings: Settings) -> Path:
    return settings.services.state_dir / "services.json"


def read_state(settings: Settings) -> LocalState | None:
    path = state_path(settings)
    try:
        return LocalState(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise ServiceError(f"{path} is not a hermeneut services file: {exc}") from exc


def _write_state(settings: Settings, state: LocalState) -> None:
    path = state_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state.__dict__, f, indent=2)
    tmp.replace(path)


def _kafka_running(info: dict[str, Any] | None) -> bool:
    return bool(info) and pid_alive(int(info["pid"])) and port_open(int(info["port"]))  # type: ignore[index]


def _influx_running(info: dict[str, Any] | None) -> bool:
    return bool(info) and pid_alive(int(info["pid"])) and influxdb.healthy(str(info["url"]))  # type: ignore[index]


def _start_kafka(settings: Settings, run_dir: Path) -> kafka.KafkaProcess:
    cache, k = settings.services.cache_dir, settings.kafka
    try:
        return kafka.start(cache, k.version, run_dir / "kafka", heap_mb=k.heap_mb)
    except ServiceError as exc:
        if k.fallback_version == k.version:
            raise
        log.warning("Kafka %s failed (%s); falling back to %s", k.version, exc, k.fallback_version)
        print(f"Kafka {k.version} failed to start ({exc}); trying {k.fallback_version}")
        return kafka.start(cache, k.fallback_version, run_dir / "kafka-fallback", heap_mb=k.heap_mb)


def _web_running(info: dict[str, Any] | None) -> bool:
    return bool(info) and pid_alive(int(info["pid"])) and web_healthy(str(info["url"]))  # type: ignore[index]


def web_healthy(url: str) -> bool:
    return answers(f"{url}/healthz")


def start_web(settings: Settings) -> LocalState:
    """The dashboard (``hermeneut web``) as a local service on the resolved servers, on ``web.port`` when it is
    free (else a free port); it stops with ``services down``."""
    state = read_state(settings)
    if state is None:
        raise ServiceError("start the local services first (`hermeneut services up`)")
    if _web_running(state.web):
        return state
    resolved = resolve(settings)
    host = resolved.web.host
    port = resolved.web.port if not port_open(resolved.web.port, host) else free_port()
    m = resolved.metrics
    metrics_port = m.web_port if m.web_port and not port_open(m.web_port, m.host) else free_port()
    log_path = Path(state.run_dir) / "web" / "web.log"
    cmd = [sys.executable, "-m", "pipeline.face.cli", "web", "--host", host, "--port", str(port)]
    cmd += ["--metrics-port", str(metrics_port)]
    pid = start_daemon(cmd, log_path, env=child_env(resolved))
    url = f"http://{host}:{port}"
    wait_until(lambda: web_healthy(url), 60, "the dashboard", lambda: pid_alive(pid))
    state.web = {"pid": pid, "url": url, "log": str(log_path)}
    if m.enabled:
        state.web["metrics"] = f"http://{m.host}:{metrics_port}/metrics"
    _write_state(settings, state)
    return state


def keep_stages(settings: Settings, stages: list[dict[str, Any]]) -> None:
    """Record pipeline stages (name, pid, log, metrics) left running, so ``status`` lists them and ``down`` stops
    them; each must lead its own process group."""
    state = read_state(settings)
    if state is None:
        raise ServiceError("no local services to hand the stages to (`hermeneut services up`)")
    state.stages = stages
    _write_state(settings, state)


def stop_stages(settings: Settings) -> None:
    """Stop the stages a previous main job left running (their consumer groups are the next one's)."""
    state = read_state(settings)
    if state is None or not state.stages:
        return
    for info in state.stages:
        if pid_alive(int(info["pid"])):
            stop_pid(int(info["pid"]))
    state.stages = None
    _write_state(settings, state)


def up(settings: Settings) -> LocalState:
    """Start whatever local service the settings need and is not running yet; returns the state."""
    state = read_state(settings)
    if state is not None and (
        (settings.uses_local_kafka and not _kafka_running(state.kafka))
        or (settings.uses_local_influxdb and not _influx_running(state.influxdb))
    ):
        down(settings, quiet=True)
        state = None
    if state is not None:
        return state
    run_dir = settings.services.state_dir / "runs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    state = LocalState(run_dir=str(run_dir))
    try:
        if settings.uses_local_kafka:
            k = _start_kafka(settings, run_dir)
            state.kafka = {
                "version": k.version,
                "port": k.port,
                "pid": k.pid,
                "bootstrap_servers": k.bootstrap_servers,
                "log": str(k.log_path),
            }
            _write_state(settings, state)
        if settings.uses_local_influxdb:
            i = settings.influxdb
            token = i.token.get_secret_value() if i.token else None
            p = influxdb.start(settings.services.cache_dir, i.version, run_dir / "influxdb", i.org, i.bucket, token)
            state.influxdb = {
                "version": p.version,
                "port": p.port,
                "pid": p.pid,
                "url": p.url,
                "org": p.org,
                "bucket": p.bucket,
                "token": p.token,
                "log": str(p.log_path),
            }
            _write_state(settings, state)
    except BaseException:
        down(settings, quiet=True)
        raise
    _write_state(settings, state)  # also with external servers: the run folder and the dashboard live here
    return state


def status(settings: Settings) -> dict[str, str]:
    """One line per service: where it is and whether it answers."""
    state = read_state(settings)
    lines: dict[str, str] = {}
    if settings.uses_local_kafka:
        info = state.kafka if state else None
        lines["kafka"] = (
            f"up   {info['bootstrap_servers']} (Kafka {info['version']}, pid {info['pid']}, log {info['log']})"
            if info and _kafka_running(info)
            else "down (local; `hermeneut services up` starts it)"
        )
    else:
        lines["kafka"] = f"external {settings.kafka.bootstrap_servers}"
    if settings.uses_local_influxdb:
        info = state.influxdb if state else None
        lines["influxdb"] = (
            f"up   {info['url']} (InfluxDB {info['version']}, org {info['org']}, bucket {info['bucket']}, "
            f"pid {info['pid']}, log {info['log']})"
            if info and _influx_running(info)
            else "down (local; `hermeneut services up` starts it)"
        )
    else:
        lines["influxdb"] = f"external {settings.influxdb.url}"
    web = state.web if state else None
    lines["web"] = (
        f"up   {web['url']} (dashboard and API, pid {web['pid']}, log {web['log']}"
        + (f", metrics {web['metrics']})" if web.get("metrics") else ")")
        if web and _web_running(web)
        else "down (`hermeneut services up` starts it)"
    )
    for info in (state.stages if state else None) or []:
        alive = pid_alive(int(info["pid"]))
        lines[info["name"]] = f"{'up  ' if alive else 'down'} pipeline stage (pid {info['pid']}, log {info['log']}" + (
            f", metrics {info['metrics']})" if info.get("metrics") else ")"
        )
    return lines


def down(settings: Settings, quiet: bool = False) -> None:
    """Stop the local services (data and logs stay in their run folder)."""
    state = read_state(settings)
    if state is None:
        return
    for info in (*(state.stages or ()), state.web, state.kafka, state.influxdb):
        if info and pid_alive(int(info["pid"])):
            stop_pid(int(info["pid"]))
    with contextlib.suppress(FileNotFoundError):
        state_path(settings).unlink()
    if not quiet:
        print(f"stopped; data and logs kept in {state.run_dir}")


def resolve(settings: Settings, kafka_needed: bool = True, influxdb_needed: bool = True) -> Settings:
    """The settings with local endpoints filled in; ConfigError if a needed local service is not running."""
    kafka_needed &= settings.uses_local_kafka
    influxdb_needed &= settings.uses_local_influxdb
    if not kafka_needed and not influxdb_needed:
        return settings
    state = read_state(settings)
    kafka_conf, influx_conf = settings.kafka, settings.influxdb
    if kafka_needed:
        if state is None or not state.kafka:
            raise ConfigError(
                "no Kafka configured (HERMENEUT_KAFKA__BOOTSTRAP_SERVERS) and no local one running "
                "(`hermeneut services up`)"
            )
        kafka_conf = kafka_conf.model_copy(update={"bootstrap_servers": state.kafka["bootstrap_servers"]})
    if influxdb_needed:
        if state is None or not state.influxdb:
            raise ConfigError(
                "no InfluxDB configured (HERMENEUT_INFLUXDB__URL) and no local one running (`hermeneut services up`)"
            )
        i = state.influxdb
        influx_conf = influx_conf.model_copy(
            update={"url": i["url"], "org": i["org"], "bucket": i["bucket"], "token": SecretStr(i["token"])}
        )
    return settings.model_copy(update={"kafka": kafka_conf, "influxdb": influx_conf})


def child_env(settings: Settings) -> dict[str, str]:
    """Environment that hands resolved settings to a child hermeneut process (secrets travel, never logged)."""
    return dict(os.environ) | settings_env(settings)
