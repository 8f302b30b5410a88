"""Kafka's MirrorMaker 2 from the same Maven Central release as the local broker: several clusters, each with its
own Kafka, replicated into a central one (docs/performance.md, "100,000 GPUs").

MirrorMaker 2 runs its own Connect workers (``connect-mirror`` and ``connect-runtime``, resolved into
``<cache>/kafka/<version>/mirrormaker-libs``, apart from the broker's libs). It copies each record's key, value,
headers and partition unchanged into ``<source alias>.<topic>`` on the target, so the cluster tag inside every
message is kept and a processor reading the copy sees exactly what one reading the source would
(tests/integration/test_mirrormaker.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ServiceError
from pipeline.services import kafka
from pipeline.services.procs import pid_alive, run_logged, start_daemon, stop_pid

log = logging.getLogger(__name__)

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.hermeneut</groupId><artifactId>mirrormaker-runtime</artifactId><version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-mirror</artifactId><version>{version}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId><version>{version}</version></dependency>
{logging}
  </dependencies>
</project>
"""
MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"


def install(cache_dir: Path, version: str) -> Path:
    """Resolve MirrorMaker 2's jars for ``version`` into the cache (once); returns the libs folder."""
    home = kafka.kafka_home(cache_dir, version)
    libs = home / "mirrormaker-libs"
    marker = home / ".mirrormaker-complete"
    if marker.exists():
        return libs
    kafka.install(cache_dir, version)  # the logging configuration lives there
    pom = home / "mirrormaker-pom.xml"
    pom.write_text(_POM.format(version=version, logging=kafka.logging_dependencies(version)))
    run_logged(
        [
            "mvn",
            "-B",
            "-f",
            str(pom),
            f"{kafka.MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={libs}",
        ],
        home / "mirrormaker-install.log",
        f"downloading MirrorMaker 2 {version} jars (count)",
        progress=lambda line: 1 if "Downloaded from" in line and ".jar (" in line else 0,
    )
    if not any(libs.glob("connect-mirror-*.jar")):
        raise ServiceError(f"MirrorMaker 2 {version} jars did not resolve; see {home / 'mirrormaker-install.log'}")
    marker.touch()
    return libs


def properties(sources: dict[str, str], target: tuple[str, str], topics: str) -> str:
    """A dedicated MirrorMaker 2 configuration: every ``sources`` cluster (alias -> bootstrap servers) into
    ``target`` (alias, bootstrap servers), the topics matching the ``topics`` regex, one replica (a local test)."""
    alias, servers = target
    lines = [f"clusters = {', '.join([*sources, alias])}", f"{alias}.bootstrap.servers = {servers}"]
    for source, source_servers in sources.items():
        lines += [
            f"{source}.bootstrap.servers = {source_servers}",
            f"{source}->{alias}.enabled = true",
            # a .properties value: its backslashes (the regex's escapes) are escaped once more
            f"{source}->{alias}.topics = {topics.replace(chr(92), chr(92) * 2)}",
            f"{alias}->{source}.enabled = false",
        ]
    lines += [
        f"{name} = 1"
        for name in (
            "replication.factor",
            "checkpoints.topic.replication.factor",
            "heartbeats.topic.replication.factor",
            "offset-syncs.topic.replication.factor",
            "offset.storage.replication.factor",
            "status.storage.replication.factor",
            "config.storage.replication.factor",
        )
    ]
    # new topics are found within seconds (the default looks every 10 minutes)
    lines += ["refresh.topics.interval.seconds = 2", "sync.topic.acls.enabled = false", ""]
    return "\n".join(lines)


@dataclass
class MirrorMakerProcess:
    pid: int
    log_path: Path

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def stop(self) -> None:
        stop_pid(self.pid)


def start(cache_dir: Path, version: str, run_dir: Path, config: str) -> MirrorMakerProcess:
    """Start MirrorMaker 2 with ``config`` (see :func:`properties`); it connects to the clusters as it starts."""
    libs = install(cache_dir, version)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "mm2.properties"
    path.write_text(config)
    cmd = kafka.java_cmd(cache_dir, version, MAIN_CLASS, str(path), heap_mb=256)
    cmd[cmd.index("-cp") + 1] = str(libs / "*")
    pid = start_daemon(cmd, run_dir / "mm2.log")
    log.info("MirrorMaker 2 started (pid %d), log %s", pid, run_dir / "mm2.log")
    return MirrorMakerProcess(pid, run_dir / "mm2.log")
