"""What the query integration tests share: the fleet they write, the aggregates computed here, their settings."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from influxdb_client.client.influxdb_client import InfluxDBClient
from pydantic import SecretStr

from hermeneut.stages import start_stage
from pipeline.config import InfluxSettings, KafkaSettings, ServiceSettings, Settings, TopicSettings, WebSettings
from pipeline.services import kafka
from pipeline.services.stages import Stage, wait_for
from pipeline.topics import ensure_topics, topic_specs

from .conftest import InfluxServer

NS = 1_000_000_000
MIN = 60 * NS
ROUNDS = 180
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
#: (node, gpu uuid, index, model, power limit, slowdown temperature)
GPUS = (
    ("n0", "GPU-a", 0, H100, 700.0, 87.0),
    ("n0", "GPU-b", 1, H100, 700.0, 87.0),
    ("n1", "GPU-c", 0, A100, 400.0, 85.0),
    ("n1", "GPU-d", 1, A100, 400.0, 85.0),
)
THROTTLING = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def expected(values: list[float], fn: str, backend: str) -> float:
    """What ``fn`` of ``values`` is, computed here (ranks as each backend defines them)."""
    a = np.sort(np.asarray(values, dtype=np.float64))
    n = len(a)
    if fn.startswith("p"):
        q = float(fn[1:])
        if backend == "flux":
            rank = math.ceil(q / 100 * float(n))
            return float(a[max(rank, 1) - 1])
        return float(a[math.floor(float(n) * q / 100.0 + 0.5) - 1])
    simple: dict[str, Callable[[np.ndarray], Any]] = {
        "mean": np.mean, "max": np.max, "min": np.min, "sum": np.sum, "count": len, "median": np.median,
        "stddev": lambda x: np.std(x, ddof=1),
    }  # fmt: skip
    return float(simple[fn](a))


def query_settings(
    kafka_server: kafka.KafkaProcess, influx: InfluxServer, base: Settings, state: Path, bucket: str | None = None
) -> Settings:
    tag = uuid.uuid4().hex[:8]
    p = influx.proc
    s = Settings(
        cluster=f"q-{tag}",
        group_prefix=f"q-{tag}",
        kafka=KafkaSettings(bootstrap_servers=kafka_server.bootstrap_servers, session_timeout_s=6.0),
        influxdb=InfluxSettings(url=p.url, org=p.org, bucket=bucket or p.bucket, token=p.token, flush_interval_s=0.1),
        topics=TopicSettings.with_prefix(f"q{tag}", partitions=2),
        services=ServiceSettings(cache_dir=base.services.cache_dir, state_dir=state),
        web=WebSettings(token=SecretStr("integration-token")),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return s


def own_bucket(influx: InfluxServer) -> str:
    p = influx.proc
    name = f"q{uuid.uuid4().hex[:8]}"
    with InfluxDBClient(url=p.url, token=p.token, org=p.org) as client:
        client.buckets_api().create_bucket(bucket_name=name, org=p.org)
    return name


def start_ns() -> int:
    """A whole minute, far enough back that three minutes of samples end before now."""
    return (time.time_ns() // MIN - 8) * MIN


@contextmanager
def running_sink(settings: Settings, run_dir: Path) -> Iterator[Stage]:
    sink = start_stage("sink", settings, run_dir)
    try:
        assert wait_for(lambda: bool(sink.stats().get("assigned")), 90), "sink did not get partitions"
        yield sink
    finally:
        sink.stop()
