"""The context watch as a real process against the real Kafka: Slurm jobs come and go through the shipped
prolog/epilog scripts, a static file and Slurm merge, `context set`/`clear` override and hand back, and everything
is read back through TopicMirror exactly as the processor will read it. A restarted watch publishes nothing new."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaException, TopicPartition

from hermeneut.cli import cli
from pipeline.codec import decode_record
from pipeline.config import KafkaSettings, ServiceSettings, Settings, TopicSettings, settings_env
from pipeline.events import GpuContext, Workload, gpu_key
from pipeline.mirror import TopicMirror
from pipeline.services import child_env, kafka
from pipeline.services.stages import read_stats, wait_for
from pipeline.topics import ensure_topics, topic_specs
from producers.context.inventory import GpuInventory
from producers.context.slurm import EPILOG, PROLOG
from tests.fakes.kubernetes import POD_RESOURCES, TOKEN, Kubelet, serve_api
from tests.integration.harness import consume_all

pytestmark = pytest.mark.integration

DATA = Path(__file__).parents[1] / "testdata" / "context"
INVENTORY_FILE = DATA / "nvidia-smi-L-8xH100.txt"
INVENTORY = GpuInventory.parse(INVENTORY_FILE.read_text())
GPU = {i: INVENTORY.uuids[i] for i in range(8)}
NODE = "gpu01"


@pytest.fixture
def kafka_settings(kafka_server: kafka.KafkaProcess, defaults: Settings, tmp_path: Path) -> Settings:
    """Own topics and cluster on the session's Kafka (this test needs no InfluxDB)."""
    tag = uuid.uuid4().hex[:8]
    s = Settings(
        cluster=f"test-{tag}",
        group_prefix=f"test-{tag}",
        kafka=KafkaSettings(bootstrap_servers=kafka_server.bootstrap_servers, session_timeout_s=6.0),
        topics=TopicSettings.with_prefix(f"t{tag}", partitions=3),
        services=ServiceSettings(cache_dir=defaults.services.cache_dir, state_dir=tmp_path / "state"),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    consumer = Consumer(s.kafka.client_config() | {"group.id": f"leaders-{tag}"})
    try:
        for topic in (s.topics.context, s.topics.topology):
            count = len(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
            assert wait_for(lambda t=topic, n=count: _leaders(consumer, t, n), 30), f"{topic} has no leaders"
    finally:
        consumer.close()
    return s


def _leaders(consumer: Consumer, topic: str, partitions: int) -> bool:
    """True once every partition answers (a freshly created topic needs a moment to elect its leaders)."""
    try:
        for p in range(partitions):
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
    except KafkaException:
        return False
    return True


@contextmanager
def watching(settings: Settings, run_dir: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Path]:
    """`hermeneut context watch` as a child process; yields its stats file; stops it with SIGTERM."""
    run_dir.mkdir(parents=True, exist_ok=True)
    stats, log = run_dir / "watch.stats.json", run_dir / "watch.log"
    stats.unlink(missing_ok=True)
    command = [sys.executable, "-m", "hermeneut.cli", "-v", "context", "watch", "--node", NODE]
    command += ["--inventory", str(INVENTORY_FILE), "--interval", "0.5", "--stats-file", str(stats), *args]
    with log.open("ab") as out:
        proc = subprocess.Popen(command, env=child_env(settings) | (env or {}), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield stats
    finally:
        proc.terminate()
        code = proc.wait(30)
        assert code == 0, log.read_text()[-3000:]


def slurm(script: Path, jobs: Path, **env: str) -> None:
    done = subprocess.run(
        ["bash", str(script)], env={"PATH": os.environ["PATH"], "HERMENEUT_SLURM_DIR": str(jobs), **env}, check=False
    )
    assert done.returncode == 0


def test_watch_publishes_merges_ends_and_yields_to_manual(
    kafka_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = kafka_settings
    jobs = tmp_path / "jobs"
    static = tmp_path / "context.toml"
    static.write_text(
        '[[gpu]]\nnode = "gpu01"\ngpu = "0"\napplication = "idle"\njob_id = "spare"\n\n'
        '[[gpu]]\nnode = "gpu01"\ngpu = "7"\napplication = "llm-serving"\nframework = "vllm"\n'
    )
    slurm(
        PROLOG,
        jobs,
        SLURM_JOB_ID="4315",
        SLURM_JOB_USER="chen",
        SLURM_JOB_ACCOUNT="assistant",
        SLURM_JOB_GPUS="6,7",
        SLURM_JOB_NUM_NODES="1",
    )
    mirror = TopicMirror(s.kafka.client_config(), s.topics.context, lambda v: decode_record(GpuContext, v)).start()
    assert mirror.wait_ready(30)

    def on(i: int) -> Workload | None:
        record = mirror.get(gpu_key(s.cluster, NODE, GPU[i]))
        return record.workload if record else None

    def known() -> set[int]:
        return {i for i in GPU if on(i) is not None}

    try:
        with watching(s, tmp_path / "run1", "--static", str(static), "--slurm-dir", str(jobs)) as stats:
            assert wait_for(lambda: known() == {0, 6, 7}, 60), known()
            assert on(0) == Workload("idle", "spare", source="static", confidence=1.0)
            assert on(6) == Workload("unknown", "4315", "chen", "slurm", 0.0, tenant="assistant", job_gpus=2)
            # two sources merged: the static file's class, the job's identity
            assert on(7) == Workload(
                "llm-serving", "4315", "chen", "static", 1.0, tenant="assistant", framework="vllm", job_gpus=2
            )

            slurm(
                PROLOG,
                jobs,
                SLURM_JOB_ID="4400",
                SLURM_JOB_USER="ana",
                SLURM_JOB_GPUS="2,3",
                SLURM_JOB_NUM_NODES="2",
                SLURM_JOB_COMMENT="application=llm-finetuning model=meta-llama/Llama-3.1-8B",
            )
            assert wait_for(lambda: known() == {0, 2, 3, 6, 7}, 30), known()
            assert on(2) == Workload(
                "llm-finetuning", "4400", "ana", "slurm", 0.95, model="meta-llama/Llama-3.1-8B", job_gpus=4
            )

            slurm(EPILOG, jobs, SLURM_JOB_ID="4315")  # the job ended: tombstone for 6, 7 falls back to the file
            assert wait_for(lambda: known() == {0, 2, 3, 7} and on(7).job_id is None, 30), known()  # type: ignore[union-attr]
            assert on(7) == Workload("llm-serving", source="static", confidence=1.0, framework="vllm")

            for name, value in settings_env(s).items():
                monkeypatch.setenv(name, value)
            result = CliRunner().invoke(
                cli, ["context", "set", "--node", NODE, "--gpu", GPU[2], "--app", "bert-training", "--user", "ops"]
            )
            assert result.exit_code == 0, result.output
            manual = Workload("bert-training", user="ops", source="manual", confidence=1.0)
            assert wait_for(lambda: on(2) == manual, 30)
            steps = read_stats(stats)["steps"]
            assert wait_for(lambda: read_stats(stats)["steps"] >= steps + 3, 30)
            assert on(2) == manual  # the watch honours the person over Slurm

            result = CliRunner().invoke(cli, ["context", "clear", "--node", NODE, "--gpu", GPU[2]])
            assert result.exit_code == 0, result.output
            assert wait_for(lambda: on(2) is not None and on(2).source == "slurm", 30)  # type: ignore[union-attr]

            shown = CliRunner().invoke(cli, ["context", "show", "--node", NODE])
            assert shown.exit_code == 0, shown.output
            rows = [line.split() for line in shown.output.splitlines()[1:]]
            assert [(r[1], r[2], r[3]) for r in rows] == sorted(
                [
                    (GPU[0], "idle", "static"),
                    (GPU[2], "llm-finetuning", "slurm"),
                    (GPU[3], "llm-finetuning", "slurm"),
                    (GPU[7], "llm-serving", "static"),
                ]
            )
            final = read_stats(stats)
        # every record in the topic was a change: 3 first, 2 for job 4400, 4315's end (tombstone for 6, update
        # of 7), set + clear by the CLI, and the watch's re-publication of 2 after the clear
        records = consume_all(s, s.topics.context, 11, timeout_s=30)
        assert len(records) == 11, [(m.key(), m.value() is None) for m in records]
        assert sum(m.value() is None for m in records) == 2
        assert final["published"] == 8 and final["tombstones"] == 1 and final["failed"] == 0

        # a restart with the same jobs publishes nothing (it starts from what the topic holds)
        with watching(s, tmp_path / "run2", "--static", str(static), "--slurm-dir", str(jobs)) as stats:
            assert wait_for(lambda: read_stats(stats).get("steps", 0) >= 4, 30)
            again = read_stats(stats)
        assert again["published"] == 0 and again["tombstones"] == 0
        # ...and one started after the jobs ended tombstones what they left behind
        slurm(EPILOG, jobs, SLURM_JOB_ID="4400")
        static.write_text("")
        with watching(s, tmp_path / "run3", "--static", str(static), "--slurm-dir", str(jobs)):
            assert wait_for(lambda: known() == set(), 30), known()
    finally:
        mirror.stop()


def test_watch_with_kubernetes_and_processes(kafka_settings: Settings, tmp_path: Path) -> None:
    """`--kubernetes --processes` wired by the CLI: a kubelet gRPC socket, an API server, nvidia-smi and /proc."""
    s = kafka_settings
    kubelet = Kubelet(tmp_path / "kubelet.sock", POD_RESOURCES).start()
    api = serve_api()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    # GPU 4 holds no pod, but a miner runs on it; nvidia-smi and /proc tell
    bin_dir, proc = tmp_path / "bin", tmp_path / "proc"
    bin_dir.mkdir()
    xml = (
        f"<nvidia_smi_log><gpu id='00000000:45:00.0'><uuid>{GPU[4]}</uuid><processes><process_info>"
        "<pid>202</pid><type>C</type><process_name>./t-rex</process_name><used_memory>1200 MiB</used_memory>"
        "</process_info></processes></gpu></nvidia_smi_log>"
    )
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho "{xml}"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    (proc / "202").mkdir(parents=True)
    (proc / "202" / "cmdline").write_bytes(b"./t-rex\0-a\0kawpow\0-o\0stratum+tcp://rvn.2miners.com:6060\0")
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HERMENEUT_CONTEXT__KUBELET_SOCKET": str(kubelet.socket),
        "HERMENEUT_CONTEXT__KUBERNETES_API": f"http://127.0.0.1:{api.server_address[1]}",
        "HERMENEUT_CONTEXT__KUBERNETES_TOKEN_FILE": str(token),
        "HERMENEUT_CONTEXT__PROC_ROOT": str(proc),
    }
    mirror = TopicMirror(s.kafka.client_config(), s.topics.context, lambda v: decode_record(GpuContext, v)).start()
    try:
        assert mirror.wait_ready(30)

        def on(i: int) -> Workload | None:
            record = mirror.get(gpu_key(s.cluster, NODE, GPU[i]))
            return record.workload if record else None

        with watching(s, tmp_path / "run", "--kubernetes", "--processes", env=env):
            assert wait_for(lambda: all(on(i) is not None for i in (0, 1, 2, 3, 4, 5)), 60)
            assert on(0) == on(1) and on(0).job_id == "assistant/vllm-qwen-6b7c9d"  # type: ignore[union-attr]
            assert on(2) == Workload(
                "llm-finetuning",
                "ml/llama-ft",
                "ana",
                "kubernetes",
                0.95,
                "ml",
                "meta-llama/Llama-3.1-70B",
                "pytorch",
                8,
            )
            assert on(4) == Workload("hashing", source="process", confidence=0.7, framework="t-rex")
            kubelet.pods = POD_RESOURCES[1:]  # the vLLM pod was deleted
            assert wait_for(lambda: on(0) is None and on(1) is None, 30)
        assert on(2) is not None and on(6) is None and on(7) is None
    finally:
        mirror.stop()
        kubelet.stop()
        api.shutdown()
        api.server_close()


def test_watch_once_publishes_and_exits(
    kafka_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = kafka_settings
    static = tmp_path / "farm.csv"
    static.write_text("node,gpu,application,job_id\n*,*,rendering,farm\n")
    for name, value in settings_env(s).items():
        monkeypatch.setenv(name, value)
    args = ["context", "watch", "--once", "--node", NODE, "--inventory", str(INVENTORY_FILE), "--static", str(static)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "published 8 records and 0 tombstones" in result.output
    records = consume_all(s, s.topics.context, 8, timeout_s=30)
    contexts = [decode_record(GpuContext, m.value()) for m in records]
    assert sorted(c.gpu_uuid for c in contexts) == sorted(GPU.values())
    assert {c.workload for c in contexts} == {Workload("rendering", "farm", source="static", confidence=1.0)}
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "published 0 records and 0 tombstones" in again.output
