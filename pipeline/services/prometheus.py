"""A real Prometheus on loopback: Debian's ``prometheus`` and ``promtool`` (2.42+), started by the project, never
through the package's systemd unit.

:func:`start` writes a config (the scrape jobs given, nothing else: no remote write, no alerting), runs the server
on a free 127.0.0.1 port with its TSDB in the run folder and the retention asked for, and polls ``/-/ready``.
:func:`create_blocks` loads history without waiting for scrapes: OpenMetrics text with timestamps becomes TSDB
blocks (``promtool tsdb create-blocks-from openmetrics``) in the data folder a server then starts on; blocks older
than the server's retention would be deleted at once, hence the long default. ``make test`` installs the Debian
package when it is missing (as it does Chromium); :func:`binaries` says so in one line otherwise.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ServiceError
from pipeline.services.procs import free_port, pid_alive, start_daemon, stop_pid, wait_until

log = logging.getLogger(__name__)

#: imported history is old: a server that holds it must not delete it as it starts
DEFAULT_RETENTION = "3650d"


def binaries() -> tuple[Path, Path]:
    """``prometheus`` and ``promtool``, from PATH or Debian's /usr/bin; a ServiceError when not installed."""
    found = [shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
             for name in ("prometheus", "promtool")]  # fmt: skip
    if not all(found):
        raise ServiceError(
            "Prometheus is not installed: apt-get install -y --no-install-recommends prometheus (make test does)"
        )
    return Path(str(found[0])), Path(str(found[1]))


@dataclass(frozen=True, slots=True)
class ScrapeJob:
    """One scrape job: its name, how often, and the targets (host:port) with the path to scrape."""

    name: str
    interval_s: float
    targets: tuple[str, ...]
    path: str = "/metrics"


def config_text(jobs: tuple[ScrapeJob, ...]) -> str:
    """A Prometheus config with just these scrape jobs (YAML written by hand: a handful of keys)."""
    lines = ["global:", "  scrape_interval: 15s", "scrape_configs:"]
    for job in jobs:
        lines += [
            f"  - job_name: {job.name!r}",
            f"    scrape_interval: {job.interval_s:g}s",
            f"    scrape_timeout: {min(job.interval_s, 10):g}s",
            f"    metrics_path: {job.path!r}",
            "    static_configs:",
            f"      - targets: [{', '.join(repr(t) for t in job.targets)}]",
        ]
    return "\n".join(lines) + "\n"


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


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def data_dir(run_dir: Path) -> Path:
    return run_dir / "data"


def create_blocks(openmetrics: Path, run_dir: Path, timeout_s: float = 600.0) -> None:
    """Turn OpenMetrics text with timestamps (ending in ``# EOF``) into TSDB blocks in ``run_dir``'s data folder,
    for a server started on it afterwards."""
    _prometheus, promtool = binaries()
    target = data_dir(run_dir)
    target.mkdir(parents=True, exist_ok=True)
    cmd = [str(promtool), "tsdb", "create-blocks-from", "openmetrics", str(openmetrics), str(target)]
    try:
        subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=timeout_s)
    except subprocess.CalledProcessError as exc:
        raise ServiceError(
            f"promtool could not load {openmetrics}: {(exc.stderr or exc.stdout).strip()[-400:]}"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"promtool took longer than {timeout_s:.0f}s to load {openmetrics}") from exc


def start(
    run_dir: Path,
    jobs: tuple[ScrapeJob, ...] = (),
    *,
    retention: str = DEFAULT_RETENTION,
    port: int | None = None,
    timeout_s: float = 60.0,
) -> PrometheusProcess:
    """Start Prometheus on ``run_dir`` (its data folder kept across restarts) and wait until it is ready."""
    prometheus, _promtool = binaries()
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "prometheus.yml"
    config.write_text(config_text(jobs))
    port = port or free_port()
    cmd = [
        str(prometheus),
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir(run_dir)}",
        f"--storage.tsdb.retention.time={retention}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    pid = start_daemon(cmd, run_dir / "prometheus.log")
    proc = PrometheusProcess(port, pid, run_dir)
    try:
        wait_until(lambda: ready(proc.url), timeout_s, "Prometheus", proc.alive)
    except ServiceError as exc:
        proc.stop()
        raise ServiceError(f"{exc}; see {proc.log_path}") from exc
    log.info("Prometheus ready on %s (pid %d)", proc.url, pid)
    return proc
