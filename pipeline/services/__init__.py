"""Local Kafka + InfluxDB (and the dashboard) for people and tests without a cluster: ``hermeneut services
up|status|down``.

Each ``up`` with nothing running gets a fresh run folder (``<state>/runs/<UTC time>/{kafka,influxdb}``) with data
and logs, which are kept after ``down``. Ports are free loopback ports. The endpoints and the generated InfluxDB
token go to ``<state>/services.json`` (mode 0600), which every other command reads when the settings name no
external servers. Where the settings name an external Kafka or InfluxDB, nothing local is started for it. Pipeline
stages the main job leaves running (:func:`keep_stages`) are listed there too, and stop with the services.

Only ``down`` stops a server. A command that needs the local servers (:func:`up`) while one recorded in
services.json is unhealthy never stops the other, never starts a new pair in a new run folder (the running stages
would keep the old addresses and the backlog would be stranded in the old folder): a server that runs but does not
answer is a :class:`~pipeline.errors.ServiceError` naming it and the way out; one whose process is gone is
restarted in place (its run folder, data and port) by ``hermeneut services up`` only, and reported by any other
command. A recorded pid is taken as the server only while its command line names the server's run folder (after a
reboot the pid may be another process's).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from pipeline.config import Settings, settings_env
from pipeline.errors import ConfigError, ServiceError
from pipeline.services import influxdb, kafka
from pipeline.services.procs import (
    answers,
    free_port,
    pid_alive,
    port_open,
    runs_in,
    start_daemon,
    stop_pid,
    wait_until,
)

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


#: a recorded server's condition: it answers; its process runs but does not answer; no process of it runs
UP, UNHEALTHY, GONE = "up", "unhealthy", "gone"


def _folder(info: dict[str, Any]) -> Path:
    """A recorded server's own run folder (its log sits there, and its command line names it)."""
    return Path(str(info["log"])).parent


def _ours(info: dict[str, Any]) -> bool:
    return runs_in(int(info["pid"]), _folder(info))


def kafka_condition(info: dict[str, Any] | None) -> str:
    if not info or not _ours(info):
        return GONE
    return UP if port_open(int(info["port"])) else UNHEALTHY


def influx_condition(info: dict[str, Any] | None) -> str:
    if not info or not _ours(info):
        return GONE
    return UP if influxdb.healthy(str(info["url"])) else UNHEALTHY


def _kafka_record(k: kafka.KafkaProcess) -> dict[str, Any]:
    return {
        "version": k.version,
        "port": k.port,
        "controller_port": k.controller_port,
        "pid": k.pid,
        "bootstrap_servers": k.bootstrap_servers,
        "log": str(k.log_path),
    }


def _influx_record(p: influxdb.InfluxProcess) -> dict[str, Any]:
    return {
        "version": p.version,
        "port": p.port,
        "pid": p.pid,
        "url": p.url,
        "org": p.org,
        "bucket": p.bucket,
        "token": p.token,
        "log": str(p.log_path),
    }


def _start_influx(settings: Settings, run_dir: Path) -> influxdb.InfluxProcess:
    i = settings.influxdb
    token = i.token.get_secret_value() if i.token else None
    return influxdb.start(settings.services.cache_dir, i.version, run_dir / "influxdb", i.org, i.bucket, token)


def _restart_kafka(settings: Settings, info: dict[str, Any]) -> kafka.KafkaProcess:
    """The recorded broker again, on its own folder (data kept), port and controller port."""
    controller = info.get("controller_port")
    return kafka.start(
        settings.services.cache_dir,
        str(info["version"]),
        _folder(info),
        port=int(info["port"]),
        controller_port=int(controller) if controller else None,
        heap_mb=settings.kafka.heap_mb,
    )


def _restart_influx(settings: Settings, info: dict[str, Any]) -> influxdb.InfluxProcess:
    """The recorded influxd again, on its own folder (data, org, bucket and token kept) and port."""
    return influxdb.start(
        settings.services.cache_dir,
        str(info["version"]),
        _folder(info),
        str(info["org"]),
        str(info["bucket"]),
        str(info["token"]),
        port=int(info["port"]),
    )


def unhealthy_line(name: str, info: dict[str, Any], condition: str) -> str:
    """What to tell the operator about a recorded server that is not up: what it is, and the way out."""
    pid, where = int(info["pid"]), info.get("url") or info.get("bootstrap_servers")
    if condition == UNHEALTHY:
        return (
            f"local {name} (pid {pid}, {where}) runs but does not answer: if it is starting or recovering, wait and "
            f"retry; if it hangs, stop it (kill {pid}) and run `hermeneut services up`, which restarts it with its "
            f"data on the same port (log: {info['log']})"
        )
    return (
        f"local {name} ({where}) is not running (its last log: {info['log']}): `hermeneut services up` restarts it "
        "with its data on the same port"
    )


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


def start_web(settings: Settings, entry: tuple[str, ...]) -> LocalState:
    """The dashboard (``<entry> web``, ``entry`` the face's command line) as a local service on the resolved
    servers, on ``web.port`` when it is free (else a free port); it stops with ``services down``."""
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
    cmd = [*entry, "web", "--host", host, "--port", str(port)]
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


def up(settings: Settings, restart: bool = False) -> LocalState:
    """Start whatever local service the settings need and is not running yet; returns the state.

    A server recorded in services.json that runs but does not answer is a ServiceError (one line: which, and the
    way out); one whose process is gone is restarted in place when ``restart`` (``hermeneut services up``), else a
    ServiceError too. Nothing running is ever stopped, and a new run folder is made only when none is recorded."""
    state = read_state(settings)
    if state is None:
        return _start_fresh(settings)
    recorded: dict[str, tuple[dict[str, Any] | None, str]] = {}
    if settings.uses_local_kafka:
        recorded["Kafka"] = state.kafka, kafka_condition(state.kafka)
    if settings.uses_local_influxdb:
        recorded["InfluxDB"] = state.influxdb, influx_condition(state.influxdb)
    problems = [
        unhealthy_line(name, info, condition)
        for name, (info, condition) in recorded.items()
        if info and (condition == UNHEALTHY or (condition == GONE and not restart))
    ]
    if problems:
        raise ServiceError("; ".join(problems))
    conditions = {name: condition for name, (_info, condition) in recorded.items()}
    run_dir = Path(state.run_dir)
    if conditions.get("Kafka") == GONE:
        if state.kafka:
            print(f"restarting the local Kafka in {_folder(state.kafka)} on port {state.kafka['port']}")
        k = _restart_kafka(settings, state.kafka) if state.kafka else _start_kafka(settings, run_dir)
        state.kafka = _kafka_record(k)
        _write_state(settings, state)
    if conditions.get("InfluxDB") == GONE:
        if state.influxdb:
            print(f"restarting the local InfluxDB in {_folder(state.influxdb)} on port {state.influxdb['port']}")
        i = _restart_influx(settings, state.influxdb) if state.influxdb else _start_influx(settings, run_dir)
        state.influxdb = _influx_record(i)
        _write_state(settings, state)
    return state


def _start_fresh(settings: Settings) -> LocalState:
    """A new run folder and the local servers the settings need, recorded as they come up."""
    run_dir = settings.services.state_dir / "runs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    state = LocalState(run_dir=str(run_dir))
    try:
        if settings.uses_local_kafka:
            state.kafka = _kafka_record(_start_kafka(settings, run_dir))
            _write_state(settings, state)
        if settings.uses_local_influxdb:
            state.influxdb = _influx_record(_start_influx(settings, run_dir))
            _write_state(settings, state)
    except BaseException:
        down(settings, quiet=True)  # only what this call started: nothing was recorded before it
        raise
    _write_state(settings, state)  # also with external servers: the run folder and the dashboard live here
    return state


def _not_up(info: dict[str, Any] | None, condition: str) -> str:
    if info and condition == UNHEALTHY:
        return f"not answering (pid {info['pid']} runs; log {info['log']})"
    return "down (local; `hermeneut services up` starts it)"


def status(settings: Settings) -> dict[str, str]:
    """One line per service: where it is and whether it answers."""
    state = read_state(settings)
    lines: dict[str, str] = {}
    if settings.uses_local_kafka:
        info = state.kafka if state else None
        condition = kafka_condition(info)
        lines["kafka"] = (
            f"up   {info['bootstrap_servers']} (Kafka {info['version']}, pid {info['pid']}, log {info['log']})"
            if info and condition == UP
            else _not_up(info, condition)
        )
    else:
        lines["kafka"] = f"external {settings.kafka.bootstrap_servers}"
    if settings.uses_local_influxdb:
        info = state.influxdb if state else None
        condition = influx_condition(info)
        lines["influxdb"] = (
            f"up   {info['url']} (InfluxDB {info['version']}, org {info['org']}, bucket {info['bucket']}, "
            f"pid {info['pid']}, log {info['log']})"
            if info and condition == UP
            else _not_up(info, condition)
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
    for info in (*(state.stages or ()), state.web):
        if info and pid_alive(int(info["pid"])):
            stop_pid(int(info["pid"]))
    for info in (state.kafka, state.influxdb):
        if info and _ours(info):  # a pid another process took after a reboot is left alone
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
