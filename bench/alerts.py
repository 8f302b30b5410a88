"""Alerting benchmark: engine cost per finding and per tick, end-to-end notification latency, and the crash
window (how many duplicates a hard kill causes), each next to a baseline measured in the same run.

    python -m bench.alerts [--quick] [--json out.json]

A. Engine (CPU only). A fleet of GPUs with active findings repeated every 60 s, as the detectors send them, and
   50 subscriptions with realistic matchers. Baseline: ``decode_record(Finding)``, the cost every consumer of
   the alerts topic pays anyway. Measured: ``AlertEngine.apply`` per finding, and ``AlertEngine.step`` (timers,
   silences, inhibition, grouping) per tick, at 1,000 and 10,000 alerts: the first step (everything new, one
   notification per group), a steady step (nothing changed) and a step after a configuration change (every
   alert re-matched against every subscription, every group re-evaluated).
B. End to end, on a fresh local Kafka and influxd: the alert manager as a child process (``hermeneut alerts
   run``) and a local HTTP receiver; findings published one by one; latency = finding published -> webhook
   received (p50/p99). Baseline: the same findings published and read back by a plain Kafka consumer.
C. Crash window. (1) Worst case: the receiver SIGKILLs the manager when the request arrives, before answering;
   the restarted manager must send it again, exactly once more. (2) Kills at a random moment 0-400 ms after a
   finding was published: nothing may be lost. Counted per alert from what the receiver got.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from alerting.admin import AlertAdmin, make_receiver, make_subscription
from alerting.engine import AlertEngine
from alerting.inhibit import parse_inhibit_rules
from alerting.model import Subscription
from pipeline import services
from pipeline.codec import decode_record, encode_record
from pipeline.config import (
    AlertSettings,
    InfluxSettings,
    KafkaSettings,
    ServiceSettings,
    Settings,
    TopicSettings,
    load_settings,
)
from pipeline.events import Finding, Severity, Workload
from pipeline.publisher import Publisher
from pipeline.services import influxdb, kafka
from pipeline.services.stages import Stage, read_stats, wait_for
from pipeline.topics import ensure_topics, topic_specs

S = 1_000_000_000
DETECTORS = ("thermal-throttling", "power-capping", "xid", "baseline-anomaly", "straggler")
APPS = ("llm-pretraining", "llm-serving", "bert-training", "rendering")


def fleet_findings(alerts: int, rounds: int, t0_ns: int) -> list[Finding]:
    """``alerts`` active conditions (8 GPUs per node, several detectors), each sent ``rounds`` times 60 s apart."""
    base = []
    for i in range(alerts):
        gpu, d = divmod(i, len(DETECTORS))
        detector = DETECTORS[d]
        node = f"node-{gpu // 8:04d}"
        wl = Workload(APPS[gpu % len(APPS)], job_id=f"job-{gpu // 64}", user=f"user-{gpu % 17}", tenant="t1")
        sev = (Severity.INFO, Severity.WARNING, Severity.CRITICAL)[i % 3]
        f = Finding(detector, sev, True, "bench", node, f"GPU-{gpu:05d}", "H100", t0_ns, t0_ns, "x", workload=wl)
        base.append(f)
    return [replace(f, ts_ns=t0_ns + r * 60 * S) for r in range(rounds) for f in base]


def subscriptions(n: int) -> list[Subscription]:
    hook = [make_receiver("kafka", "out")]
    out = []
    for i in range(n):
        match = [
            ['severity=~"warning|critical"'],
            [f'application="{APPS[i % len(APPS)]}"'],
            [f'node=~"node-{i % 10}.*"', 'severity="critical"'],
            [f'detector="{DETECTORS[i % len(DETECTORS)]}"', f'job!="job-{i}"'],
            [f'user="user-{i % 17}"'],
        ][i % 5]
        out.append(make_subscription(f"s{i}", "bench", match, hook, group_by=["node", "detector"], now_ns=0))
    return out


def _best(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def engine_part(sizes: tuple[int, ...], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    subs = subscriptions(50)
    for size in sizes:
        findings = fleet_findings(size, 3, 1_763_790_000 * S)
        payloads = [encode_record(f) for f in findings]
        decode_s = _best(lambda p=payloads: [decode_record(Finding, x) for x in p], repeats)

        def fresh() -> AlertEngine:
            e = AlertEngine(AlertSettings(group_wait_s=0), parse_inhibit_rules(AlertSettings().inhibit_rules))
            e.configure(subs, [], [])
            return e

        def apply_all(f: list[Finding] = findings) -> None:
            e = fresh()
            for x in f:
                e.apply(x)

        apply_s = _best(apply_all, repeats)
        engine = fresh()
        for f in findings:
            engine.apply(f)
        now = findings[-1].ts_ns + S
        start = time.perf_counter()
        first = engine.step(now)
        first_s = time.perf_counter() - start
        steady_s = _best(lambda e=engine, t=now: e.step(t + S), repeats)

        def reconfigure(e: AlertEngine = engine, t: int = now) -> None:
            e.configure(subs, [], [])  # what a new subscription or silence costs: everything re-evaluated
            e.step(t + 2 * S)

        reconfigure_s = _best(reconfigure, repeats)
        out[str(size)] = {
            "findings": len(findings),
            "decode_us_per_finding": decode_s / len(findings) * 1e6,
            "apply_us_per_finding": apply_s / len(findings) * 1e6,
            "apply_to_decode_ratio": apply_s / decode_s,
            "first_step_ms": first_s * 1e3,
            "notifications_first_step": len(first.notifications),
            "steady_step_ms": steady_s * 1e3,
            "reconfigured_step_ms": reconfigure_s * 1e3,
        }
    return out


class _Hook(BaseHTTPRequestHandler):
    server: _HookServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        srv = self.server
        for alert in json.loads(body)["alerts"]:
            srv.got.append((alert["labels"]["gpu"], alert["status"], time.time_ns()))
        if srv.kill_pid:
            os.kill(srv.kill_pid, signal.SIGKILL)  # the worst moment: received, not yet answered
            srv.kill_pid = 0
            return
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        return


class _HookServer(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Hook)
        self.got: list[tuple[str, str, int]] = []
        self.kill_pid = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


def _settings(base: Settings, k: kafka.KafkaProcess, i: influxdb.InfluxProcess, tag: str) -> Settings:
    s = Settings(
        cluster=f"bench-{tag}",
        group_prefix=f"bench-{tag}",
        kafka=KafkaSettings(bootstrap_servers=k.bootstrap_servers, session_timeout_s=6.0),
        influxdb=InfluxSettings(url=i.url, org=i.org, bucket=i.bucket, token=i.token),
        topics=TopicSettings.with_prefix(f"bench.{tag}"),
        services=ServiceSettings(cache_dir=base.services.cache_dir, state_dir=base.services.state_dir),
        alerts=AlertSettings(
            group_wait_s=0,
            group_interval_s=0,
            tick_s=0.05,
            retry_initial_s=0.2,
            retry_max_s=1,
            allowed_targets="127.0.0.1",  # the benchmark's receiver is on loopback
        ),
    )
    ensure_topics(s.kafka.client_config(), topic_specs(s))
    return s


def _manager(s: Settings, run_dir: Path) -> Stage:
    run_dir.mkdir(parents=True, exist_ok=True)
    log, stats = run_dir / "alerts.log", run_dir / "alerts.stats.json"
    stats.unlink(missing_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hermeneut.cli", "-v", "alerts", "run", "--stats-file", str(stats)],
            env=services.child_env(s),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    stage = Stage("alerts", proc, log, stats)
    if not wait_for(lambda: bool(read_stats(stats).get("assigned")) or not stage.alive(), 90):
        raise RuntimeError(f"alert manager did not start; see {log}")
    return stage


def _finding(s: Settings, gpu: str, active: bool = True) -> Finding:
    now = time.time_ns()
    return Finding("xid", Severity.CRITICAL, active, s.cluster, "n1", gpu, "H100", now, now, "bench")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_part(s: Settings, run_dir: Path, n: int) -> dict[str, Any]:
    hook = _HookServer()
    admin = AlertAdmin(s, state=False).start()
    admin.add(make_subscription("bench", "bench", [], [make_receiver("webhook", hook.url)], group_by=["..."]))
    admin.close()
    # baseline: Kafka alone, publish -> a consumer has it
    consumer = Consumer(s.kafka.client_config() | {"group.id": "bench-baseline", "auto.offset.reset": "latest"})
    consumer.subscribe([s.topics.feedback])
    wait_for(lambda: bool(consumer.poll(0.2) is None and consumer.assignment()), 30)
    pub = Publisher(s.kafka.client_config(), linger_ms=0)
    kafka_lat = []
    for i in range(n):
        f = _finding(s, f"K-{i}")
        pub.publish(s.topics.feedback, f.dedup_key.encode(), encode_record(f))
        pub.flush(10)
        msg = None
        while msg is None or msg.error() is not None:
            msg = consumer.poll(5)
        kafka_lat.append((time.time_ns() - decode_record(Finding, msg.value() or b"").ts_ns) / 1e6)
    consumer.close()
    manager = _manager(s, run_dir)
    sent: dict[str, int] = {}
    try:
        for i in range(n):
            f = _finding(s, f"GPU-{i}")
            sent[f"GPU-{i}"] = f.ts_ns
            pub.publish(s.topics.alerts, f.dedup_key.encode(), encode_record(f))
            pub.flush(10)
            time.sleep(0.05)
        wait_for(lambda: len(hook.got) >= n, 60)
    finally:
        manager.stop()
        pub.close()
        hook.shutdown()
    e2e = [(at - sent[gpu]) / 1e6 for gpu, status, at in hook.got if status == "firing"]
    return {
        "notifications": len(e2e),
        "kafka_p50_ms": statistics.median(kafka_lat),
        "kafka_p99_ms": _pct(kafka_lat, 0.99),
        "e2e_p50_ms": statistics.median(e2e),
        "e2e_p99_ms": _pct(e2e, 0.99),
        "e2e_to_kafka_p50_ratio": statistics.median(e2e) / statistics.median(kafka_lat),
    }


def crash_part(s: Settings, run_dir: Path, cycles: int) -> dict[str, Any]:
    hook = _HookServer()
    admin = AlertAdmin(s, state=False).start()
    admin.add(make_subscription("crash", "bench", [], [make_receiver("webhook", hook.url)], group_by=["..."]))
    admin.close()
    pub = Publisher(s.kafka.client_config(), linger_ms=0)
    rng = random.Random(7)
    manager = _manager(s, run_dir / "0")
    worst: list[int] = []
    randomly: list[int] = []
    try:
        for c in range(2 * cycles):
            gpu = f"GPU-{c}"
            worst_case = c < cycles
            if worst_case:
                hook.kill_pid = manager.proc.pid
            f = _finding(s, gpu)
            pub.publish(s.topics.alerts, f.dedup_key.encode(), encode_record(f))
            pub.flush(10)
            if not worst_case:
                time.sleep(rng.uniform(0, 0.4))
                manager.proc.kill()
            manager.proc.wait(30)
            manager = _manager(s, run_dir / str(c + 1))
            wait_for(lambda g=gpu: any(x == g for x, _, _ in hook.got), 60)
            time.sleep(1.0)  # a second duplicate would show up now
            count = sum(1 for x, _, _ in hook.got if x == gpu)
            (worst if worst_case else randomly).append(count)
            print(f"  cycle {c + 1}/{2 * cycles} ({'kill on receipt' if worst_case else 'random kill'}): {count}")
    finally:
        manager.stop()
        pub.close()
        hook.shutdown()
    return {
        "worst_case_cycles": cycles,
        "worst_case_deliveries_per_alert": worst,
        "random_kill_cycles": cycles,
        "random_kill_deliveries_per_alert": randomly,
        "lost": sum(1 for n in worst + randomly if n == 0),
        "max_duplicates": max(n - 1 for n in worst + randomly),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes and fewer cycles")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    results: dict[str, Any] = {}
    sizes = (1_000,) if args.quick else (1_000, 10_000)
    print(f"A. engine: {', '.join(map(str, sizes))} alerts x 50 subscriptions")
    results["engine"] = engine_part(sizes, 2 if args.quick else 3)
    base = load_settings()
    run_dir = Path(tempfile.mkdtemp(prefix="hermeneut-bench-alerts-"))
    print(f"starting local Kafka {base.kafka.version} and InfluxDB {base.influxdb.version} in {run_dir}")
    k = kafka.start(base.services.cache_dir, base.kafka.version, run_dir / "kafka")
    i = influxdb.start(base.services.cache_dir, base.influxdb.version, run_dir / "influxdb", "hermeneut", "telemetry")
    try:
        n = 50 if args.quick else 200
        print(f"B. end to end: {n} findings -> webhook, next to Kafka alone")
        results["latency"] = latency_part(_settings(base, k, i, "lat"), run_dir / "lat", n)
        cycles = 3 if args.quick else 8
        print(f"C. crash window: {cycles} kills on receipt, {cycles} random kills")
        results["crash"] = crash_part(_settings(base, k, i, "crash"), run_dir / "crash", cycles)
    finally:
        k.stop()
        i.stop()
    print()
    for size, e in results["engine"].items():
        print(
            f"engine {size:>6} alerts: decode {e['decode_us_per_finding']:.1f} us/finding, apply "
            f"{e['apply_us_per_finding']:.1f} us/finding (x{e['apply_to_decode_ratio']:.2f} decode); step "
            f"{e['first_step_ms']:.0f} ms first ({e['notifications_first_step']} notifications), "
            f"{e['steady_step_ms']:.1f} ms steady, {e['reconfigured_step_ms']:.0f} ms after a config change"
        )
    lat = results["latency"]
    print(
        f"latency finding -> webhook p50 {lat['e2e_p50_ms']:.0f} ms, p99 {lat['e2e_p99_ms']:.0f} ms "
        f"(Kafka alone p50 {lat['kafka_p50_ms']:.1f} ms, p99 {lat['kafka_p99_ms']:.1f} ms; "
        f"ratio p50 x{lat['e2e_to_kafka_p50_ratio']:.1f}); {lat['notifications']} notifications"
    )
    cr = results["crash"]
    print(
        f"crash window: kill on receipt -> deliveries per alert {cr['worst_case_deliveries_per_alert']}; "
        f"random kill -> {cr['random_kill_deliveries_per_alert']}; lost {cr['lost']}, "
        f"max duplicates {cr['max_duplicates']}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
