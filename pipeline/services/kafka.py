"""A real single-node Apache Kafka (KRaft) from Maven Central jars, cached per version, run on loopback.

There is no Kafka tarball on Maven Central, but the broker (``kafka_2.13``) and the perf tools (``kafka-tools``)
are, so a tiny generated POM resolves them into ``<cache>/kafka/<version>/libs``. Logging backends are not in
Kafka's POMs: log4j2 for 4.x, reload4j for 3.x; without one the broker logs nothing.

A broker may also serve secured listeners beside its PLAINTEXT one (:class:`Security`): SASL_SSL with
SCRAM-SHA-512 users created when the KRaft log is formatted (``--add-scram``), and SSL with client certificates
required (mTLS), both with PEM key and trust stores. The tests give it a CA and certificates they generate.
"""

from __future__ import annotations

import base64
import logging
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import ServiceError
from pipeline.services.procs import (
    free_port,
    pid_alive,
    port_open,
    run_logged,
    start_daemon,
    stop_pid,
    wait_until,
)

log = logging.getLogger(__name__)

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.hermeneut</groupId><artifactId>kafka-runtime</artifactId><version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{version}</version>
      <exclusions><exclusion><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId></exclusion></exclusions>
    </dependency>
{logging}
  </dependencies>
</project>
"""
_LOG4J2 = "\n".join(
    f"    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>{a}</artifactId>"
    f"<version>2.24.3</version></dependency>"
    for a in ("log4j-api", "log4j-core", "log4j-slf4j-impl")
)
_RELOAD4J = "\n".join(
    f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
    for g, a, v in (("org.slf4j", "slf4j-reload4j", "1.7.36"), ("ch.qos.reload4j", "reload4j", "1.2.25"))
)
_LOG4J2_PROPERTIES = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""
_LOG4J1_PROPERTIES = """log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka=WARN
"""
READY_LINE = "Kafka Server started"


def is_v4(version: str) -> bool:
    return int(version.split(".", maxsplit=1)[0]) >= 4


def logging_dependencies(version: str) -> str:
    """The POM dependencies of the logging backend this version's jars need (none is in Kafka's POMs)."""
    return _LOG4J2 if is_v4(version) else _RELOAD4J


def kafka_home(cache_dir: Path, version: str) -> Path:
    return cache_dir / "kafka" / version


def install(cache_dir: Path, version: str) -> Path:
    """Resolve the broker and tools jars for ``version`` into the cache (once); returns the libs folder."""
    home = kafka_home(cache_dir, version)
    libs = home / "libs"
    marker = home / ".complete"
    if marker.exists():
        return libs
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise ServiceError("local Kafka needs Java 17+ and Maven on PATH (Debian: openjdk-17-jre-headless maven)")
    home.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(libs, ignore_errors=True)
    pom = home / "pom.xml"
    pom.write_text(_POM.format(version=version, logging=logging_dependencies(version)))
    run_logged(
        [
            "mvn",
            "-B",
            "-f",
            str(pom),
            f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={libs}",
        ],
        home / "install.log",
        f"downloading Kafka {version} jars (count)",
        # batch mode prints "[INFO] Downloaded from central: .../x.jar (12 kB at ...)" per artifact
        progress=lambda line: 1 if "Downloaded from" in line and ".jar (" in line else 0,
    )
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise ServiceError(f"Kafka {version} jars did not resolve; see {home / 'install.log'}")
    (home / "log4j2.properties").write_text(_LOG4J2_PROPERTIES)
    (home / "log4j.properties").write_text(_LOG4J1_PROPERTIES)
    marker.touch()
    return libs


def java_cmd(cache_dir: Path, version: str, main_class: str, *args: str, heap_mb: int = 512) -> list[str]:
    """The command line for any class in the cached Kafka (broker, StorageTool, perf tools)."""
    home = kafka_home(cache_dir, version)
    logging_opt = (
        f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}"
        if is_v4(version)
        else f"-Dlog4j.configuration=file:{home / 'log4j.properties'}"
    )
    return [
        "java",
        f"-Xms{heap_mb}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseG1GC",
        "-Djava.awt.headless=true",
        logging_opt,
        "-cp",
        str(home / "libs" / "*"),
        main_class,
        *args,
    ]


@dataclass(frozen=True)
class Security:
    """Secured listeners for a local broker: ``SASL_SSL`` (SCRAM-SHA-512, ``users`` name -> password) on
    ``sasl_port`` and ``SSL`` requiring a client certificate signed by ``ca`` on ``mtls_port``. ``keystore``: the
    broker's PKCS#8 private key and certificate chain in one PEM file; ``ca``: the PEM of the CA it trusts."""

    keystore: Path
    ca: Path
    users: tuple[tuple[str, str], ...]
    sasl_port: int
    mtls_port: int

    def scram_arguments(self) -> list[str]:
        """StorageTool ``format`` arguments creating the SCRAM users (KRaft stores them in its metadata log)."""
        return [arg for name, pw in self.users for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={pw}]")]

    def properties(self, host: str = "127.0.0.1") -> tuple[list[str], list[str], list[str]]:
        """(listeners, protocol map entries, other properties) to add to server.properties."""
        listeners = [f"SASL_SSL://{host}:{self.sasl_port}", f"SSL://{host}:{self.mtls_port}"]
        return (
            listeners,
            ["SASL_SSL:SASL_SSL", "SSL:SSL"],
            [
                "sasl.enabled.mechanisms=SCRAM-SHA-512",
                "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={self.keystore.resolve()}",
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={self.ca.resolve()}",
                # clients of the SSL listener must present a certificate; SASL_SSL clients log in instead
                "ssl.client.auth=required",
                "listener.name.sasl_ssl.ssl.client.auth=none",
            ],
        )


@dataclass
class KafkaProcess:
    """A running local broker."""

    version: str
    port: int
    controller_port: int
    pid: int
    run_dir: Path
    security: Security | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "kafka.log"

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def stop(self) -> None:
        stop_pid(self.pid)


def write_server_properties(run_dir: Path, port: int, controller_port: int, security: Security | None = None) -> Path:
    data = run_dir / "data"
    data.mkdir(parents=True, exist_ok=True)
    listeners = [f"PLAINTEXT://127.0.0.1:{port}"]
    protocols = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
    extra: list[str] = []
    if security is not None:
        secured, secured_protocols, extra = security.properties()
        listeners += secured
        protocols += secured_protocols
    props = run_dir / "server.properties"
    props.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
                f"listeners={','.join(listeners)},CONTROLLER://127.0.0.1:{controller_port}",
                f"advertised.listeners={','.join(listeners)}",
                "controller.listener.names=CONTROLLER",
                "inter.broker.listener.name=PLAINTEXT",
                f"listener.security.protocol.map={','.join(protocols)}",
                f"log.dirs={data.resolve()}",
                "num.partitions=1",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=6",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                # the 128 MiB default is allocated on the heap of a 512 MiB broker
                "log.cleaner.dedupe.buffer.size=33554432",
                "auto.create.topics.enable=false",
                *extra,
                "",
            ]
        )
    )
    return props


def start(
    cache_dir: Path,
    version: str,
    run_dir: Path,
    port: int | None = None,
    controller_port: int | None = None,
    heap_mb: int = 512,
    timeout_s: float = 90,
    security: Security | None = None,
) -> KafkaProcess:
    """Format a fresh KRaft log dir under ``run_dir`` (unless one exists) and start the broker (with the secured
    listeners of ``security`` too, its SCRAM users created by the format)."""
    install(cache_dir, version)
    port = port or free_port()
    controller_port = controller_port or free_port()
    run_dir.mkdir(parents=True, exist_ok=True)
    props = write_server_properties(run_dir, port, controller_port, security)
    if not (run_dir / "data" / "meta.properties").exists():
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        result = subprocess.run(
            java_cmd(
                cache_dir,
                version,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cid}",
                "-c",
                str(props),
                *(security.scram_arguments() if security else ()),
            ),
            capture_output=True,
            text=True,
            check=False,
        )
        (run_dir / "format.log").write_text(result.stdout + result.stderr)
        if result.returncode != 0:
            raise ServiceError(f"Kafka storage format failed; see {run_dir / 'format.log'}")
    log_path = run_dir / "kafka.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    pid = start_daemon(java_cmd(cache_dir, version, "kafka.Kafka", str(props), heap_mb=heap_mb), log_path)
    proc = KafkaProcess(version, port, controller_port, pid, run_dir, security)

    def ready() -> bool:
        with log_path.open("rb") as f:
            f.seek(offset)
            ports = (port, security.sasl_port, security.mtls_port) if security else (port,)
            return READY_LINE.encode() in f.read() and all(port_open(p) for p in ports)

    try:
        wait_until(ready, timeout_s, f"Kafka {version}", proc.alive)
    except ServiceError as exc:
        proc.stop()
        raise ServiceError(f"{exc}; see {log_path}") from exc
    log.info("Kafka %s ready on %s (pid %d)", version, proc.bootstrap_servers, pid)
    return proc
