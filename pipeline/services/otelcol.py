"""A real OpenTelemetry Collector, built once per version from the Go module proxy, run on loopback.

What the OTLP sink (sinks/otlp) is tested against, and what an operator can run to try it: a small distribution
made with the collector builder (``go.opentelemetry.io/collector/cmd/builder``, "ocb") holding only the OTLP
receiver, the debug exporter and contrib's file exporter, all at one pinned release (:data:`VERSION`). The builder
generates the distribution's sources and resolves its modules (``--skip-compilation``); the compile is ours,
with ``go build -v``, so its packages drive a progress bar as influxd's do. The binary is cached under
``<cache>/otelcol/<version>/`` (rebuilt when the manifest changes). Measured here: the compile of its 948 packages
took 10 min 15 s on a shared 2-core machine (230 s of CPU), the module downloads about 1.5 min more; a rebuild
after a manifest change, with Go's build cache warm, 11 s.

:func:`start` runs it on a free loopback port with a generated configuration: OTLP/HTTP in, every signal (metrics,
logs) written by the file exporter as OTLP JSON, one export request per line, to a file the caller reads back.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ServiceError
from pipeline.services.procs import (
    free_port,
    go_output,
    pid_alive,
    port_open,
    run_logged,
    start_daemon,
    stop_pid,
    wait_until,
)

log = logging.getLogger(__name__)

#: the collector release the distribution is built from (builder, receiver, exporters: one release train)
VERSION = "v0.165.0"
#: the stable modules (confmap providers) of the same release train: the builder's own default for v0.165.0
STABLE_VERSION = "v1.71.0"
#: contrib's file exporter of the same train: the patch release v0.165.1, built on the same core modules
#: (v0.165.0 / v1.71.0) as v0.165.0
CONTRIB_VERSION = "v0.165.1"
BUILDER = "go.opentelemetry.io/collector/cmd/builder"
#: a module only the file exporter's tests import, which `go mod tidy` (the builder's) still resolves: the module
#: proxy serves none of its versions after v0.135.0 ("403 This module version is not available"), so the manifest
#: replaces it with that one; the binary never contains it
_TEST_ONLY = "github.com/open-telemetry/opentelemetry-collector-contrib/extension/encoding/otlpencodingextension"
_TEST_ONLY_VERSION = "v0.135.0"
NAME = "otelcol-hermeneut"


def manifest(
    version: str = VERSION, stable: str = STABLE_VERSION, contrib: str = CONTRIB_VERSION, output: Path = Path("build")
) -> str:
    """The builder's manifest (its ``dist`` block and one ``gomod`` line per component, the format of
    ``cmd/builder/internal/builder/config.go``): only what the tests and a trial need."""
    return f"""dist:
  name: {NAME}
  description: hermeneut's test collector (OTLP receiver, debug and file exporters)
  output_path: {output}
receivers:
  - gomod: go.opentelemetry.io/collector/receiver/otlpreceiver {version}
exporters:
  - gomod: go.opentelemetry.io/collector/exporter/debugexporter {version}
  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter {contrib}
providers:
  - gomod: go.opentelemetry.io/collector/confmap/provider/envprovider {stable}
  - gomod: go.opentelemetry.io/collector/confmap/provider/fileprovider {stable}
replaces:
  - {_TEST_ONLY} => {_TEST_ONLY} {_TEST_ONLY_VERSION}
"""


def config_yaml(port: int, output_file: Path, flush_interval_ms: int = 100) -> str:
    """The collector's configuration: OTLP/HTTP on ``127.0.0.1:port``; metrics and logs to ``output_file`` as OTLP
    JSON lines, flushed every ``flush_interval_ms`` (the exporter's default is 1 s: a test reading back would wait
    for it). Its own telemetry server (``:8888`` by default) is off, so two collectors never fight for a port."""
    return f"""receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {output_file}
    format: json
    flush_interval: {flush_interval_ms}ms
service:
  telemetry:
    logs:
      level: warn
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [otlp]
      exporters: [file]
    logs:
      receivers: [otlp]
      exporters: [file]
"""


def home(cache_dir: Path, version: str) -> Path:
    return cache_dir / "otelcol" / version


def binary_path(cache_dir: Path, version: str) -> Path:
    return home(cache_dir, version) / NAME


def install(
    cache_dir: Path, version: str = VERSION, stable: str = STABLE_VERSION, contrib: str = CONTRIB_VERSION
) -> Path:
    """Build the collector for ``version`` unless the cache has it; returns the binary's path."""
    binary = binary_path(cache_dir, version)
    root = home(cache_dir, version)
    spec, src = root / "builder.yaml", root / "src"
    wanted = manifest(version, stable, contrib, src)
    # a binary built from another manifest (a component added here since) is built again
    if binary.exists() and spec.exists() and spec.read_text() == wanted:
        return binary
    if shutil.which("go") is None:
        raise ServiceError("building the OpenTelemetry Collector needs Go on PATH (https://go.dev/dl/)")
    root.mkdir(parents=True, exist_ok=True)
    build_log = root / "build.log"
    print(f"Building the OpenTelemetry Collector {version} once (cold: about 10 min on 2 cores); log: {build_log}")
    tools = root / "tools"
    shutil.rmtree(src, ignore_errors=True)
    binary.unlink(missing_ok=True)  # never an old binary beside the new manifest
    env = os.environ | {"GOBIN": str(tools), "CGO_ENABLED": "0"}
    if not (tools / "builder").exists():
        go_output(["install", f"{BUILDER}@{version}"], env=env)
    spec.write_text(wanted)
    # the builder writes the distribution's main package and go.mod, resolves its modules (checking that every
    # component is of the core's release) and downloads them; the compile is ours
    run_logged(
        [str(tools / "builder"), f"--config={spec}", "--skip-compilation"],
        build_log,
        f"generating otelcol {version} (builder, module downloads)",
        env=env,
    )
    packages = len(go_output(["list", "-deps", "."], cwd=src, env=env).split())

    def go_progress(line: str) -> int:
        # `go build -v` prints each package it compiles as a bare import path
        return int(bool(line) and " " not in line and not line.startswith(("#", "go:")))

    run_logged(
        ["go", "build", "-v", "-trimpath", "-ldflags=-s -w", "-o", str(binary), "."],
        build_log,
        f"building otelcol {version} (Go packages)",
        cwd=src,
        env=env,
        total=packages,
        progress=go_progress,
    )
    shutil.rmtree(src, ignore_errors=True)
    if not binary.exists():
        raise ServiceError(f"the collector build produced no binary; see {build_log}")
    return binary


@dataclass
class CollectorProcess:
    """A running local collector: where it takes OTLP/HTTP and the file its file exporter writes."""

    version: str
    port: int
    pid: int
    run_dir: Path
    output_file: Path

    @property
    def endpoint(self) -> str:
        """The OTLP/HTTP base URL (the signals' paths, ``/v1/metrics`` and ``/v1/logs``, go after it)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "otelcol.log"

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def stop(self) -> None:
        stop_pid(self.pid)


def start(
    cache_dir: Path, run_dir: Path, version: str = VERSION, port: int | None = None, timeout_s: float = 60
) -> CollectorProcess:
    """Start the collector (built first if need be) with its file exporter writing to ``run_dir/otlp.jsonl``,
    and wait until its OTLP/HTTP port answers."""
    binary = install(cache_dir, version)
    port = port or free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    output = run_dir / "otlp.jsonl"
    config = run_dir / "otelcol.yaml"
    config.write_text(config_yaml(port, output))
    pid = start_daemon([str(binary), f"--config=file:{config}"], run_dir / "otelcol.log")
    proc = CollectorProcess(version, port, pid, run_dir, output)
    try:
        wait_until(lambda: port_open(port), timeout_s, f"OpenTelemetry Collector {version}", proc.alive)
    except ServiceError as exc:
        proc.stop()
        raise ServiceError(f"{exc}; see {proc.log_path}") from exc
    log.info("OpenTelemetry Collector %s ready on %s (pid %d)", version, proc.endpoint, pid)
    return proc
