"""The whole pipeline over secured Kafka listeners of a real broker, started by the project's own code
(pipeline/services/kafka.py) with a CA and certificates made here: SASL_SSL with SCRAM-SHA-512 users created when
its KRaft log was formatted, and SSL requiring a client certificate (mTLS). The producer (``hermeneut simulate``,
the collector's agent loop), the processor (faust, aiokafka), the sink and the alert manager (librdkafka) each run
as a real process over the secured listener: every sample is stored once, a finding is notified. A wrong password,
a missing or foreign client certificate, and a CA that does not match stop a stage at start-up with one line."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from alerting.admin import AlertAdmin, make_receiver, make_subscription
from hermeneut.stages import start_stage
from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings, TopicSettings
from pipeline.services import child_env, kafka
from pipeline.services.procs import free_port
from pipeline.services.stages import wait_for
from pipeline.topics import ensure_topics, topic_specs

from .alerting_parts import HttpReceiver, fault, publish_findings, start_manager, tail, with_alerts
from .conftest import InfluxServer
from .harness import running_pipeline, stored_points, wait_stored
from .tls import Pki, make_pki

pytestmark = pytest.mark.integration

USER, PASSWORD = "hermeneut", "scram-s3cret"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, defaults: Settings) -> Iterator[tuple[kafka.KafkaProcess, Pki]]:
    folder = tmp_path_factory.mktemp("secured-kafka")
    pki = make_pki(folder / "pki")
    security = kafka.Security(pki.broker_keystore, pki.ca, ((USER, PASSWORD),), free_port(), free_port())
    broker = kafka.start(defaults.services.cache_dir, defaults.kafka.version, folder / "kafka", security=security)
    yield broker, pki
    broker.stop()


def client(broker: kafka.KafkaProcess, pki: Pki, how: str) -> KafkaSettings:
    """Client settings for one secured listener: ``scram`` (SASL_SSL, SCRAM-SHA-512) or ``mtls`` (SSL)."""
    security = broker.security
    assert security is not None
    common = {"ssl_cafile": pki.ca, "session_timeout_s": 6.0}
    if how == "scram":
        return KafkaSettings(
            bootstrap_servers=f"127.0.0.1:{security.sasl_port}", security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512", sasl_username=USER, sasl_password=SecretStr(PASSWORD), **common,
        )  # fmt: skip
    return KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{security.mtls_port}", security_protocol="SSL",
        ssl_certfile=pki.client_cert, ssl_keyfile=pki.client_key, **common,
    )  # fmt: skip


def settings_for(k: KafkaSettings, influx: InfluxServer, defaults: Settings, tmp_path: Path, tag: str) -> Settings:
    p = influx.proc
    s = Settings(
        cluster=f"sec-{tag}",
        group_prefix=f"sec-{tag}",
        kafka=k,
        influxdb=InfluxSettings(url=p.url, org=p.org, bucket=p.bucket, token=p.token, flush_interval_s=0.1),
        topics=TopicSettings.with_prefix(f"sec{tag}", partitions=2),
        services=ServiceSettings(cache_dir=defaults.services.cache_dir, state_dir=tmp_path / "state"),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return with_alerts(s)


@pytest.mark.parametrize("how", ["scram", "mtls"])
def test_every_stage_runs_over_the_secured_listener(
    how: str,
    secured: tuple[kafka.KafkaProcess, Pki],
    influx_server: InfluxServer,
    defaults: Settings,
    tmp_path: Path,
) -> None:
    broker, pki = secured
    s = settings_for(client(broker, pki, how), influx_server, defaults, tmp_path, f"{how}{time.time_ns() % 10**8}")
    http = HttpReceiver().start()
    admin = AlertAdmin(s).start()
    try:
        admin.add(make_subscription("ops", "alice", ['detector="thermal-throttling"'],
                                    [make_receiver("webhook", http.url("/hook"))], group_by=["..."]))  # fmt: skip
        with running_pipeline(s, tmp_path / "run") as (processor, sink):
            manager = start_manager(s, tmp_path / "alerts")
            try:
                producer = start_stage("simulate", s, tmp_path / "run", "--nodes", "2", "--gpus", "4", "--seed", "3",
                                       "--fast-forward", "30", "--no-extras")  # fmt: skip
                assert producer.proc.wait(180) == 0, tail(producer)
                produced = producer.stats()["samples"]
                assert produced >= 2 * 4 * 30
                wait_stored(sink, produced, timeout_s=120)
                publish_findings(s, [fault(s, True)])
                assert wait_for(lambda: len(http.on("/hook")) >= 1, 60), tail(manager)
                time.sleep(1.0)  # a second notice would show up now
            finally:
                manager.stop()
            processed = processor.stats()
    finally:
        admin.close()
        http.stop()
    keys = {(r["gpu"], r["_time"]) for r in stored_points(s)}
    assert len(keys) == produced, f"stored {len(keys)} distinct points of {produced} produced"
    assert processed["samples_ok"] >= produced and processed["dead_lettered"] == 0
    [notice] = http.on("/hook")
    assert notice.json()["status"] == "firing"


def _start_up_error(s: Settings, *command: str) -> tuple[int, str]:
    """Run ``hermeneut <command>`` with these settings; its exit code and what it wrote on stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "hermeneut.cli", *command],
        env=child_env(s) | {"HERMENEUT_METRICS__ENABLED": "false"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stderr.strip()


def test_wrong_credentials_stop_each_stage_at_start_up_with_one_line(
    secured: tuple[kafka.KafkaProcess, Pki], influx_server: InfluxServer, defaults: Settings, tmp_path: Path
) -> None:
    broker, pki = secured
    scram = client(broker, pki, "scram")
    mtls = client(broker, pki, "mtls")
    cases = [
        (scram.model_copy(update={"sasl_password": SecretStr("wrong")}), "process", "SASL authentication error"),
        (scram.model_copy(update={"sasl_password": SecretStr("wrong")}), "sink", "SASL authentication error"),
        (scram.model_copy(update={"sasl_password": SecretStr("wrong")}), "alerts run", "SASL authentication error"),
        (scram.model_copy(update={"sasl_username": "nobody"}), "simulate --duration 1", "SASL authentication error"),
        (scram.model_copy(update={"ssl_cafile": pki.stranger_ca}), "process", "certificate verify failed"),
        (mtls.model_copy(update={"ssl_certfile": None, "ssl_keyfile": None}), "process", "alert"),
        (mtls.model_copy(update={"ssl_certfile": pki.stranger_cert, "ssl_keyfile": pki.stranger_key}), "sink", "alert"),
    ]
    p = influx_server.proc
    influx = InfluxSettings(url=p.url, org=p.org, bucket=p.bucket, token=p.token)
    for k, command, reason in cases:
        s = Settings(kafka=k, influxdb=influx, services=ServiceSettings(cache_dir=defaults.services.cache_dir,
                                                                        state_dir=tmp_path / "state"))  # fmt: skip
        code, stderr = _start_up_error(s, *command.split())
        assert code == 2, (command, code, stderr[-2000:])
        assert stderr.startswith("hermeneut: invalid configuration: Kafka at 127.0.0.1:") and "\n" not in stderr
        assert reason in stderr and "refused" in stderr, stderr
        assert PASSWORD not in stderr and "wrong" not in stderr  # no password is ever shown
