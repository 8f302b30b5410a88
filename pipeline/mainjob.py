"""The main job (``hermeneut run``) and the stage processes it, the tests and the benchmarks start.

``main_job``: local services up (installing what is missing), topics, processor and sink as child processes,
a simulated fleet published in real time for a bounded time, a drain until every sample is accounted for,
then a report (produced / processed / dead-lettered / stored, end-to-end latency) and a trend query read back
from InfluxDB. Ctrl-C stops everything, local services included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pipeline import services
from pipeline.config import Settings
from pipeline.topics import ensure_topics, topic_specs


def read_stats(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return data


def wait_for(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return check()


@dataclass
class Stage:
    """A hermeneut stage running as a child process, with its log and stats file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    stats_file: Path

    def stats(self) -> dict[str, Any]:
        return read_stats(self.stats_file)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int:
        if self.alive():
            self.proc.terminate()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start_stage(name: str, settings: Settings, run_dir: Path, *extra: str) -> Stage:
    """Start ``hermeneut <name>`` with the (resolved) settings handed over through the environment."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log, stats = run_dir / f"{name}.log", run_dir / f"{name}.stats.json"
    stats.unlink(missing_ok=True)
    env = services.child_env(settings) | {"PYTHONUNBUFFERED": "1"}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "-v", name, "--stats-file", str(stats), *extra],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    return Stage(name, proc, log, stats)


def _bar(total: float, desc: str) -> tqdm[Any]:
    return tqdm(total=total, desc=desc, unit="", dynamic_ncols=True, mininterval=0.5, leave=True)


#: the main job's fleet is small and its run short: a baseline of its own needs fewer samples than in production
MAIN_JOB_MIN_SAMPLES = 100


def train_midway(settings: Settings, duration_s: float, stop: threading.Event, result: dict[str, Any]) -> None:
    """Halfway through the run, learn baselines from the history so far and publish them (the running processor
    takes them up without a restart); the outcome or the reason it failed goes to ``result["training"]``."""
    from pipeline.errors import HermeneutError
    from pipeline.training import train

    if duration_s < 40 or stop.wait(duration_s / 2):
        result["training"] = "run too short to learn baselines midway (needs --duration 40 or more)"
        return
    try:
        result["training"] = train(settings, duration_s, MAIN_JOB_MIN_SAMPLES, progress=False, echo=lambda _line: None)
    except HermeneutError as exc:
        result["training"] = f"training failed: {exc}"


def print_training(outcome: Any, processor_stats: dict[str, Any]) -> None:
    from pipeline.training import TrainingReport

    if not isinstance(outcome, TrainingReport):
        print(f"\nBaselines: {outcome or 'not trained'}")
        return
    accuracy = "" if outcome.classifier_accuracy is None else f", classifier accuracy {outcome.classifier_accuracy:.3f}"
    print(
        f"\nBaselines: version {outcome.version} learned midway from {outcome.rows} samples: "
        f"{len(outcome.baselines)} baselines{accuracy}; the processor "
        + (
            "switched to it without a restart"
            if processor_stats.get("baselines_version") == outcome.version
            else f"is on version {processor_stats.get('baselines_version')}"
        )
    )


def main_job(settings: Settings, nodes: int, gpus: int, duration_s: float, stop_services: bool) -> bool:
    """Run the whole path once; returns True when every produced sample was processed and accounted for."""
    from pipeline.publisher import Publisher
    from producers.simulator import Fleet
    from producers.simulator.run import run_simulation
    from sinks.query import TrendQuery, format_table, run_trend
    from sinks.retention import setup as storage_setup

    print("1/5 local services (first run installs Kafka and builds InfluxDB; later runs start in seconds)")
    state = services.up(settings)
    settings = services.resolve(settings)
    ensure_topics(settings.kafka.client_config(), topic_specs(settings))
    storage_setup(settings)
    run_dir = Path(state.run_dir) / "pipeline" / time.strftime("%H%M%S")
    stages: list[Stage] = []
    interrupted = False
    try:
        print(f"2/5 processor and sink (logs in {run_dir})")
        stages = [start_stage("process", settings, run_dir), start_stage("sink", settings, run_dir)]
        if not wait_for(lambda: all(s.stats().get("assigned") or not s.alive() for s in stages), 120):
            print(f"processor/sink did not join their consumer groups within 120 s; see {run_dir}")
            return False
        fleet = Fleet(nodes, gpus, cluster=settings.cluster, seed=0)
        print(f"3/5 simulating {nodes} nodes x {gpus} GPUs for {duration_s:.0f}s at {settings.sample_interval_s}s")
        stop = threading.Event()
        sim_stats = run_dir / "simulate.stats.json"
        thread_result: dict[str, Any] = {}
        publisher = Publisher(settings.kafka.client_config())

        def simulate() -> None:
            thread_result["report"] = run_simulation(
                fleet, publisher, settings.topics.raw, settings.sample_interval_s, stop, duration_s, sim_stats,
                topics=settings.topics,
            )  # fmt: skip

        # cold start: rows stay unscored until baselines exist; learn once from the first half of the run
        trainer = threading.Thread(
            target=train_midway, args=(settings, duration_s, stop, thread_result), name="trainer", daemon=True
        )
        sim = threading.Thread(target=simulate, name="simulator")
        sim.start()
        trainer.start()
        with _bar(round(duration_s), "simulating (s)") as bar:
            started = time.monotonic()
            while sim.is_alive():
                sim.join(0.5)
                bar.update(min(round(time.monotonic() - started), round(duration_s)) - bar.n)
                dead = [s.name for s in stages if not s.alive()]
                if dead:
                    stop.set()
                    sim.join()
                    print(f"stage {', '.join(dead)} exited early; see {run_dir}")
                    return False
        trainer.join(120)
        report = thread_result["report"]
        produced = report.samples
        print("4/5 draining: waiting until every sample is stored or dead-lettered")
        processor, sink = stages

        def accounted() -> int:
            p, s = processor.stats(), sink.stats()
            return int(s.get("points_written", 0)) + int(p.get("dead_lettered", 0)) + int(s.get("dead_lettered", 0))

        with _bar(produced, "samples accounted for") as bar:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and accounted() < produced:
                bar.update(max(0, accounted() - bar.n))
                time.sleep(0.5)
            bar.update(max(0, accounted() - bar.n))
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the pipeline and the local services")
        return False
    finally:
        for stage in reversed(stages):
            stage.stop()
        if interrupted or stop_services:
            services.down(settings, quiet=True)
    p, s = processor.stats(), sink.stats()
    print("5/5 report")
    rows = [
        ("samples produced", report.samples),
        ("messages delivered to Kafka", f"{publisher.stats.delivered}/{publisher.stats.published}"),
        ("processed ok", p.get("samples_ok", 0)),
        ("dead-lettered", int(p.get("dead_lettered", 0)) + int(s.get("dead_lettered", 0))),
        ("stored in InfluxDB", s.get("points_written", 0)),
        ("late simulator rounds", report.late_rounds),
    ]
    for label, value in rows:
        print(f"  {label:32} {value:>10}")
    if s.get("latency_p50_s") is not None:
        print(f"  {'latency sample->stored p50/p99':32} {s['latency_p50_s']:.3f}s / {s['latency_p99_s']:.3f}s")
    print("\nTrend read back from InfluxDB: mean power per GPU model, 10 s windows")
    trend = TrendQuery("power_watts", "gpu_model", "10s", f"{int(duration_s) + 120}s", "mean")
    print(format_table(run_trend(settings, trend)))
    i = settings.influxdb
    print(
        f"\nWhere to look:\n  InfluxDB   {i.url}  org={i.org} bucket={i.bucket} "
        f"(token in {services.state_path(settings)})\n"
        f"  Kafka      {settings.kafka.bootstrap_servers}  topics {settings.topics.raw}, "
        f"{settings.topics.interpreted}, {settings.topics.dead_letter}\n"
        f"  logs       {run_dir}\n"
        "  more       hermeneut trend --field temperature_gpu_celsius --by node --fn max\n"
        "  stop       hermeneut services down"
        if not stop_services
        else f"\nLogs and data: {state.run_dir}"
    )
    print_training(thread_result.get("training"), p)
    stored = int(s.get("points_written", 0))
    lost = produced - stored - int(p.get("dead_lettered", 0)) - int(s.get("dead_lettered", 0))
    return bool(publisher.stats.delivered == publisher.stats.published and lost == 0)
