"""A real InfluxDB 2.x ``influxd``, built once per version from the Go module proxy, run on loopback.

``go install`` refuses the module (it has replace directives), so the module source is copied out of the
module cache and built in place. Its cgo part links libflux, a Rust library that influxdata's ``pkg-config``
wrapper builds with cargo; libflux denies warnings, so every new rustc lint would break it: a ``RUSTC_WRAPPER``
caps lints to warnings, and ``RUSTUP_TOOLCHAIN=stable`` overrides flux's pinned old toolchain.
A cold build takes 20-40 minutes on 2 cores; the binary is cached under ``<cache>/influxdb/<version>/``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ServiceError
from pipeline.services.procs import free_port, go_output, pid_alive, run_logged, start_daemon, stop_pid, wait_until

log = logging.getLogger(__name__)

MODULE = "github.com/influxdata/influxdb/v2"
#: Go's garbage collector target: a collection when the heap has grown 400% over what survived the last one
#: (Go's default is 100). Measured on a raw write of the sink's own lines, influxd spent 15-25% less CPU per point
#: (68-74 -> 51-62 µs) for a resident set of 0.5-1 GB instead of 0.3; 800 saved nothing more (docs/performance.md;
#: https://go.dev/doc/gc-guide)
GOGC = "400"
#: the cache size at which influxd writes its in-memory cache to a TSM file (influxd's default: 25 MiB). The cache
#: counts each series-and-field key's bytes again after every snapshot (tsdb/engine/tsm1/cache.go, WriteMulti), and
#: a 10,000-GPU fleet's ~193,000 keys a second (171 bytes each) fill 25 MiB by themselves: influxd snapshotted about
#: once a second, a TSM file of one value per key each time, to be compacted again. At 64 MiB it is about every 11 s:
#: influxd's CPU per sample in live 10,000-GPU runs went from 98.2-99.7 to 74.7-75.2 µs; 128 and 256 MiB saved no
#: more, and the heap grows with the size (docs/performance.md)
CACHE_SNAPSHOT_BYTES = 64 * 2**20
#: influxd's environment as measured; an operator's own settings (the same variables) win
ENVIRONMENT: dict[str, str] = {
    "GOGC": GOGC,
    "INFLUXD_STORAGE_CACHE_SNAPSHOT_MEMORY_SIZE": str(CACHE_SNAPSHOT_BYTES),
}
_RUSTC_WRAPPER = """#!/bin/sh
# Cap lints so libflux's deny(warnings) does not turn new rustc lints into errors.
rustc="$1"; shift
for arg in "$@"; do
  if [ "$arg" = "--crate-name" ]; then exec "$rustc" "$@" --cap-lints warn; fi
done
exec "$rustc" "$@"
"""


def influx_home(cache_dir: Path, version: str) -> Path:
    return cache_dir / "influxdb" / version


def binary_path(cache_dir: Path, version: str) -> Path:
    return influx_home(cache_dir, version) / "influxd"


def install(cache_dir: Path, version: str) -> Path:
    """Build ``influxd`` for ``version`` unless the cache has it; returns the binary's path."""
    binary = binary_path(cache_dir, version)
    if binary.exists():
        return binary
    missing = [tool for tool in ("go", "cargo", "rustc", "gcc", "pkg-config") if shutil.which(tool) is None]
    if missing:
        raise ServiceError(
            f"building influxd needs {', '.join(missing)} on PATH (Go, Rust via rustup, Debian gcc pkg-config)"
        )
    home = influx_home(cache_dir, version)
    home.mkdir(parents=True, exist_ok=True)
    build_log = home / "build.log"
    print(f"Building InfluxDB {version} from source once (cold: 20-40 min on 2 cores); log: {build_log}")
    module = json.loads(go_output(["mod", "download", "-json", f"{MODULE}@{version}"]))
    src = home / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(module["Dir"], src)
    for path in [src, *src.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    tools = home / "tools"
    tools.mkdir(exist_ok=True)
    go_output(["build", "-o", str(tools / "pkg-config"), "github.com/influxdata/pkg-config"], cwd=src)
    wrapper = tools / "rustc-wrapper"
    wrapper.write_text(_RUSTC_WRAPPER)
    wrapper.chmod(0o755)
    env = os.environ | {
        "PKG_CONFIG": str(tools / "pkg-config"),
        "RUSTC_WRAPPER": str(wrapper),
        "RUSTUP_TOOLCHAIN": os.environ.get("HERMENEUT_RUSTUP_TOOLCHAIN", "stable"),
        "CGO_ENABLED": "1",
    }
    # the flux version influxdb's go.mod requires; on a fresh machine it is not in the module cache yet
    flux = json.loads(go_output(["mod", "download", "-json", "github.com/influxdata/flux"], cwd=src))
    flux_dir = Path(flux["Dir"])
    crates = (flux_dir / "libflux" / "Cargo.lock").read_text().count("\nname = ")
    packages = len(
        go_output(
            ["list", "-deps", "-tags", "sqlite_foreign_keys,sqlite_json", "./cmd/influxd"], cwd=src, env=env
        ).split()
    )
    gocache = Path(go_output(["env", "GOCACHE"]).strip())
    target = gocache / "pkgconfig" / "github.com" / "influxdata" / f"flux@{flux['Version']}" / "libflux"

    def crates_built() -> int:
        return min(crates, sum(1 for _ in target.glob("target/*/release/deps/*.rlib")))

    go_done = 0

    def go_progress(line: str) -> int:
        nonlocal go_done
        # `go build -v` prints each package it compiles as a bare import path
        if line and " " not in line and not line.startswith(("#", "go:")):
            go_done += 1
            return 1
        return 0

    run_logged(
        ["go", "build", "-v", "-tags", "sqlite_foreign_keys,sqlite_json", "-o", str(binary), "./cmd/influxd"],
        build_log,
        f"building influxd {version} (Rust crates + Go packages)",
        cwd=src,
        env=env,
        total=crates + packages,
        progress=go_progress,
        poll=lambda: go_done + crates_built(),
    )
    shutil.rmtree(src, ignore_errors=True)
    if not binary.exists():
        raise ServiceError(f"influxd build produced no binary; see {build_log}")
    return binary


@dataclass
class InfluxProcess:
    """A running local influxd with its onboarding credentials."""

    version: str
    port: int
    pid: int
    run_dir: Path
    org: str
    bucket: str
    token: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "influxd.log"

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def stop(self) -> None:
        stop_pid(self.pid)


def _http(method: str, url: str, body: dict[str, object] | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def healthy(url: str) -> bool:
    try:
        status, body = _http("GET", f"{url}/health", timeout=2.0)
    except OSError:
        return False
    return status == 200 and b'"pass"' in body


def onboard(url: str, org: str, bucket: str, token: str) -> None:
    """First-run setup: user, org, bucket and an operator token of our choosing (2.x stores it hashed)."""
    status, body = _http(
        "POST",
        f"{url}/api/v2/setup",
        {
            "username": "hermeneut",
            "password": secrets.token_urlsafe(18),
            "org": org,
            "bucket": bucket,
            "token": token,
        },
    )
    if status not in (200, 201):
        raise ServiceError(f"InfluxDB onboarding failed with HTTP {status}: {body[:200]!r}")


def start(
    cache_dir: Path,
    version: str,
    run_dir: Path,
    org: str,
    bucket: str,
    token: str | None = None,
    port: int | None = None,
    timeout_s: float = 60,
    env: Mapping[str, str] | None = None,
) -> InfluxProcess:
    """Start influxd on ``run_dir`` (onboarding it the first time) and wait until it is healthy; ``env`` adds to
    (or replaces) the measured :data:`ENVIRONMENT`, and an operator's own variables win over both."""
    binary = install(cache_dir, version)
    port = port or free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    first_run = not (run_dir / "influxd.bolt").exists()
    token = token or secrets.token_urlsafe(32)
    cmd = [
        str(binary),
        f"--bolt-path={run_dir / 'influxd.bolt'}",
        f"--engine-path={run_dir / 'engine'}",
        f"--sqlite-path={run_dir / 'influxd.sqlite'}",
        f"--http-bind-address=127.0.0.1:{port}",
        "--reporting-disabled",
        "--log-level=warn",
    ]
    pid = start_daemon(cmd, run_dir / "influxd.log", env={**ENVIRONMENT, **(env or {}), **os.environ})
    proc = InfluxProcess(version, port, pid, run_dir, org, bucket, token)
    try:
        wait_until(lambda: healthy(proc.url), timeout_s, f"InfluxDB {version}", proc.alive)
        if first_run:
            onboard(proc.url, org, bucket, token)
    except ServiceError as exc:
        proc.stop()
        raise ServiceError(f"{exc}; see {proc.log_path}") from exc
    log.info("InfluxDB %s ready on %s (pid %d)", version, proc.url, pid)
    return proc
