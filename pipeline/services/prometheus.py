"""A real Prometheus server on loopback, for tests and people: Debian's ``prometheus`` (2.42, with ``promtool``),
started on a free port with a generated config and its TSDB in a run folder, never through the package's systemd
unit. ``make test`` installs the package when it is missing (``apt-get install --no-install-recommends
prometheus``); here a missing binary is a ServiceError that says so.

The config is written as JSON, which Prometheus reads as YAML. :func:`start` waits until ``/-/ready``;
:meth:`PrometheusProcess.query` asks the HTTP API an instant query; :func:`check_rules` runs ``promtool check
rules`` (:func:`promtool` any other promtool command). :func:`create_blocks` loads history without waiting for scrapes:
OpenMetrics text with timestamps becomes TSDB blocks (``promtool tsdb create-blocks-from openmetrics``) in the data
folder a server then starts on; blocks older than the server's retention would be deleted at once, hence the long
default retention.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ServiceError
from pipeline.services.procs import answers, free_port, pid_alive, start_daemon, stop_pid, wait_until

log = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install -y --no-install-recommends prometheus (or `make tools`)"

#: imported history is old: a server that holds it must not delete it as it starts
DEFAULT_RETENTION = "3650d"


def binary(name: str = "prometheus") -> Path:
    """``prometheus`` or ``promtool`` on PATH, else a ServiceError naming the package."""
    found = shutil.which(name)
    if found is None:
        raise ServiceError(f"{name} is not installed: {INSTALL_HINT}")
    return Path(found)


def data_dir(run_dir: Path) -> Path:
    return run_dir / "data"


def scrape_config(
    targets: Mapping[str, Sequence[str]],
    *,
    interval_s: float = 15.0,
    rule_files: Sequence[Path] = (),
    evaluation_interval_s: float | None = None,
) -> dict[str, Any]:
    """A Prometheus config scraping ``targets`` (job -> URLs of one scheme and path, e.g. ``/metrics``) every
    ``interval_s``, with ``rule_files`` loaded. Pure."""
    jobs = []
    for job, urls in targets.items():
        parts = [urllib.parse.urlsplit(url) for url in urls]
        if len({(p.scheme, p.path) for p in parts}) != 1:
            raise ValueError(f"the targets of job {job} need one scheme and one path, got {list(urls)}")
        scheme, path = parts[0].scheme, parts[0].path
        static = [{"targets": [p.netloc for p in parts]}]
        jobs.append({"job_name": job, "scheme": scheme, "metrics_path": path, "static_configs": static})
    every = f"{interval_s:g}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": f"{evaluation_interval_s or interval_s:g}s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": jobs,
    }


@dataclass
class PrometheusProcess:
    """A running local Prometheus."""

    port: int
    pid: int
    run_dir: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "prometheus.log"

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def stop(self) -> None:
        stop_pid(self.pid)

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``: the ``data`` of a successful answer; a ServiceError otherwise."""
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        except OSError as exc:
            raise ServiceError(f"Prometheus at {self.url} did not answer: {exc}") from exc
        if body.get("status") != "success":
            raise ServiceError(f"Prometheus: {body.get('errorType', 'error')}: {body.get('error', body)}")
        return body["data"]

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) per series of the answer."""
        data = self.api("query", query=promql)
        if data["resultType"] == "scalar":
            return [({}, float(data["result"][1]))]
        return [(r["metric"], float(r["value"][1])) for r in data["result"]]

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health (``up``/``down``) and last error."""
        active: list[dict[str, Any]] = self.api("targets")["activeTargets"]
        return active


def start(
    run_dir: Path,
    config: Mapping[str, Any] | None = None,
    *,
    port: int | None = None,
    retention: str = DEFAULT_RETENTION,
    timeout_s: float = 60.0,
) -> PrometheusProcess:
    """Start Prometheus on 127.0.0.1 with ``config`` (see :func:`scrape_config`; none: scrape nothing) and its TSDB
    in ``data_dir(run_dir)``, kept across restarts; returns once it is ready."""
    prometheus = binary("prometheus")
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file = run_dir / "prometheus.yml"
    config_file.write_text(json.dumps(config if config is not None else scrape_config({}), indent=2))
    port = port or free_port()
    cmd = [
        str(prometheus),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir(run_dir)}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    pid = start_daemon(cmd, run_dir / "prometheus.log")
    proc = PrometheusProcess(port, pid, run_dir)
    try:
        wait_until(lambda: answers(f"{proc.url}/-/ready"), timeout_s, "Prometheus", proc.alive)
    except ServiceError as exc:
        proc.stop()
        raise ServiceError(f"{exc}; see {proc.log_path}") from exc
    log.info("Prometheus ready on %s (pid %d)", proc.url, pid)
    return proc


def promtool(*args: str | Path, timeout_s: float = 600.0) -> str:
    """``promtool <args>``: its report, or a ServiceError with it when promtool says no."""
    cmd = [str(binary("promtool")), *map(str, args)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"promtool {' '.join(map(str, args[:2]))} took longer than {timeout_s:.0f}s") from exc
    report = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        raise ServiceError(f"promtool {' '.join(map(str, args[:2]))} failed: {report}")
    return report


def check_rules(*rule_files: Path) -> str:
    """``promtool check rules``: syntax, expressions and names of alerting and recording rule files."""
    return promtool("check", "rules", *rule_files)


def create_blocks(openmetrics: Path, run_dir: Path, timeout_s: float = 600.0) -> None:
    """Turn OpenMetrics text with timestamps (ending in ``# EOF``) into TSDB blocks in ``run_dir``'s data folder,
    for a server started on it afterwards."""
    target = data_dir(run_dir)
    target.mkdir(parents=True, exist_ok=True)
    promtool("tsdb", "create-blocks-from", "openmetrics", openmetrics, target, timeout_s=timeout_s)
