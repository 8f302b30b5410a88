"""The main job (``hermeneut run``) and the stage processes it, the tests and the benchmarks start.

``main_job`` shows the whole system on a simulated fleet, end to end, on real servers:
1. local services up (installing what is missing), topics, storage buckets and rollup tasks, the dashboard;
2. processor, sink and alert manager as child processes, and a subscription for the local operators;
3. learn: a stretch of healthy history (fast-forwarded) goes through the pipeline, baselines and the workload
   classifier are learned from it in InfluxDB and published; the running processor takes them up;
4. live: the fleet in real time, with a few faults injected, judged against what it learned;
5. a drain until every sample is stored or dead-lettered;
6. a report: produced / processed / dead-lettered / stored, latency, verdicts, findings, notifications, a trend
   read back from InfluxDB, and where to look, the stages' ``/metrics`` among them. Unless told to stop the local
   services, the stages keep running with them (``hermeneut services status|down``). Ctrl-C stops everything,
   local services included.
"""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from hermeneut.stages import ENTRY, start_stage
from pipeline import services
from pipeline.config import Settings
from pipeline.errors import HermeneutError
from pipeline.kinds import DEMO_FAULTS
from pipeline.services.stages import Stage, wait_for
from pipeline.topics import ensure_topics, topic_specs

if TYPE_CHECKING:
    from hermeneut.jobs.training import TrainingReport
    from producers.simulator import Fleet

#: the demo's fleet is small and its history short: a baseline of its own needs fewer samples than in production
MAIN_JOB_MIN_SAMPLES = 100
OPERATORS = "local operators"


def ensure_operator_subscription(settings: Settings) -> None:
    """A subscription for the people running this: every warning or critical alert to the notifications topic
    (created once; see it with ``hermeneut alerts list --subscriptions``)."""
    from alerting.admin import AlertAdmin, subscription_from_json

    admin = AlertAdmin(settings, state=False).start()
    try:
        if any(s.name == OPERATORS for s in admin.subscriptions()):
            return
        admin.add(
            subscription_from_json(
                {
                    "name": OPERATORS,
                    "owner": "hermeneut run",
                    "match": ['severity=~"warning|critical"'],
                    "receivers": [{"kind": "kafka", "topic": settings.topics.notifications}],
                    "group_by": ["detector", "node"],
                    "group_wait": "5s",
                }
            )
        )
    finally:
        admin.close()


def _bar(total: float, desc: str, unit: str = "") -> tqdm[Any]:
    return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, mininterval=0.5, leave=True)


def _drain(stages: list[Stage], produced: int, timeout_s: float) -> int:
    processor, sink = stages[0], stages[1]

    def accounted() -> int:
        p, s = processor.stats(), sink.stats()
        return int(s.get("points_written", 0)) + int(p.get("dead_lettered", 0)) + int(s.get("dead_lettered", 0))

    with _bar(produced, "samples stored or dead-lettered", "sample") as bar:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and accounted() < produced and all(s.alive() for s in stages):
            bar.update(max(0, accounted() - bar.n))
            time.sleep(0.5)
        bar.update(max(0, accounted() - bar.n))
    return accounted()


def _demo_fleet(settings: Settings, nodes: int, gpus: int, seed: int, learn_s: float, mix: str) -> Fleet:
    """The simulated fleet: healthy while it is learned, then the demo's faults, each for half an hour."""
    from producers.simulator import Fleet
    from producers.simulator.plan import FaultPlan, Injection

    injections = tuple(Injection(fault, learn_s + at_s, 1800.0) for fault, at_s in DEMO_FAULTS)
    plan = FaultPlan(rate_scale=0.0, injections=injections)
    return Fleet(nodes, gpus, cluster=settings.cluster, seed=seed, faults=plan, extras=True, mix=mix)


def _learned(settings: Settings, processor: Stage, learn_s: float) -> TrainingReport | str:
    """Baselines learned from the healthy history and taken up by the running processor, or why not."""
    from hermeneut.jobs.training import TrainingReport, train

    try:
        training = train(settings, learn_s + 60, MAIN_JOB_MIN_SAMPLES, "5s", progress=True, echo=lambda _l: None)
    except HermeneutError as exc:
        return f"training failed: {exc}"
    if isinstance(training, TrainingReport):
        wait_for(lambda: processor.stats().get("baselines_version") == training.version, 60)
    return training


def _live(sim: threading.Thread, stop: threading.Event, stages: list[Stage], duration_s: float) -> list[str]:
    """Run the live simulation to its end with a progress bar; the stages that died under it (then it stops)."""
    sim.start()
    with _bar(round(duration_s), "simulating (s)") as bar:
        started = time.monotonic()
        while sim.is_alive():
            sim.join(0.5)
            bar.update(min(round(time.monotonic() - started), round(duration_s)) - bar.n)
            dead = [s.name for s in stages if not s.alive()]
            if dead:
                stop.set()
                sim.join()
                return dead
    return []


def main_job(
    settings: Settings,
    nodes: int,
    gpus: int,
    duration_s: float,
    stop_services: bool,
    learn_s: float = 900.0,
    seed: int = 0,
    mix: str = "default",
) -> bool:
    """Run the whole system once (see module docstring); True when every produced sample was delivered and is
    accounted for (stored or dead-lettered)."""
    from pipeline.publisher import Publisher
    from producers.agent import AgentReport, NodeAgent
    from producers.simulator.source import SimulatorSource
    from sinks.retention import setup as storage_setup

    print("1/6 local services (the first run installs Kafka and builds InfluxDB; later runs start in seconds)")
    state = services.up(settings)
    settings = services.resolve(settings)
    ensure_topics(settings.kafka.client_config(), topic_specs(settings))
    storage_setup(settings)
    state = services.start_web(settings, ENTRY)
    services.stop_stages(settings)  # a previous run's stages would share this run's consumer groups
    url = state.web["url"] if state.web else "(dashboard not running)"
    run_dir = Path(state.run_dir) / "pipeline" / time.strftime("%H%M%S")
    stages: list[Stage] = []
    publishers: list[Publisher] = []
    interrupted = False
    ok = kept = False
    try:
        print(f"2/6 processor, sink and alert manager (logs in {run_dir}); dashboard at {url}")
        stages = [
            start_stage("process", settings, run_dir, session=True),
            start_stage("sink", settings, run_dir, session=True),
            start_stage("alerts", settings, run_dir, command=("alerts", "run"), session=True),
        ]
        if not wait_for(lambda: all(s.stats().get("assigned") or not s.alive() for s in stages), 120):
            print(f"the stages did not join their consumer groups within 120 s; see {run_dir}")
            return False
        ensure_operator_subscription(settings)
        stop = threading.Event()
        source = SimulatorSource.of(_demo_fleet(settings, nodes, gpus, seed, learn_s, mix))
        reports: list[AgentReport] = []

        def simulate(duration_s: float, **kwargs: Any) -> None:
            publishers.append(Publisher(settings.kafka.client_config()))
            agent = NodeAgent(
                source,
                publishers[-1],
                settings.topics,
                settings.sample_interval_s,
                shutdown_grace_s=60.0,
                stats_file=run_dir / "simulate.stats.json",
            )
            reports.append(agent.run(stop, duration_s, **kwargs))

        print(f"3/6 learning: {learn_s / 60:.0f} simulated minutes of healthy history from {nodes} nodes x {gpus} GPUs")
        simulate(fast_forward_s=learn_s, duration_s=0.0, progress=True)
        _drain(stages, reports[0].samples, 300)
        training = _learned(settings, stages[0], learn_s)
        print(f"4/6 live: {duration_s:.0f}s in real time, with {len(DEMO_FAULTS)} faults injected")
        live_from_ns = time.time_ns()
        sim = threading.Thread(target=simulate, kwargs={"duration_s": duration_s}, name="simulator")
        dead = _live(sim, stop, stages, duration_s)
        if dead:
            print(f"stage {', '.join(dead)} exited early; see {run_dir}")
            return False
        produced = sum(r.samples for r in reports)
        print("5/6 draining: waiting until every sample is stored or dead-lettered")
        accounted = _drain(stages, produced, 180)
        time.sleep(2.0)  # the alert manager's group wait for what the last samples concluded
        stats = [s.stats() for s in stages]
        published = sum(p.stats.published for p in publishers)
        delivered = sum(p.stats.delivered for p in publishers)
        print("6/6 report")
        keep = not stop_services
        web = (state.web or {}).get("metrics")
        report(
            settings,
            stats,
            reports,
            produced,
            published,
            delivered,
            training,
            live_from_ns,
            url,
            run_dir,
            metrics_lines(stages, web, keep),
        )
        ok = delivered == published and accounted == produced
        if keep:
            services.keep_stages(settings, [stage.kept() for stage in stages])
            kept = True
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping the pipeline and the local services")
        return False
    finally:
        for stage in reversed(stages):
            if not kept:
                stage.stop()
        for p in publishers:
            p.close(10)
        publishers.clear()  # the producers go now, not after Kafka (each would log its refused reconnects)
        if interrupted or stop_services:
            services.down(settings, quiet=True)
    return ok


def finding_line(severity: str, summary: str, width: int = 118) -> str:
    """A finding for the report: its severity, then its whole summary wrapped at words (never cut mid-word)."""
    return textwrap.fill(
        summary, width, initial_indent=f"  {severity:8} ", subsequent_indent=" " * 11, break_long_words=False
    )


def metrics_lines(stages: list[Stage], web: str | None, kept: bool) -> str:
    """The "where to look" lines of the ``/metrics`` of the stages and the dashboard."""
    lines = [f"  metrics    {s.metrics_url}  ({s.name})\n" for s in stages if s.metrics_url]
    if web:
        lines.append(f"  metrics    {web}  (web)\n")
    if not lines:
        return "  metrics    off (metrics.enabled is false)\n"
    until = "until `hermeneut services down`" if kept else "no more: the stages stopped with the job"
    return "".join(lines) + f"             Prometheus text; the stages keep serving {until}\n"


def report(
    settings: Settings,
    stats: list[dict[str, Any]],
    sims: list[Any],
    produced: int,
    published: int,
    delivered: int,
    training: Any,
    live_from_ns: int,
    url: str,
    run_dir: Path,
    metrics: str,
) -> None:
    """What the main job did and saw, read back from the stages' counters, Kafka and InfluxDB."""
    from hermeneut.jobs.training import TrainingReport
    from sinks.query import AnomalyQuery, Scope, Store, TrendQuery, anomalies, format_table, run_trend
    from sinks.query.alerts import HistoryQuery, run_history

    p, s = stats[0], stats[1]
    dead = int(p.get("dead_lettered", 0)) + int(s.get("dead_lettered", 0))
    rows: list[tuple[str, Any]] = [
        ("samples produced", produced),
        ("messages delivered to Kafka", f"{delivered}/{published}"),
        ("processed ok", p.get("samples_ok", 0)),
        ("dead-lettered", dead),
        ("stored in InfluxDB", s.get("points_written", 0)),
        ("late simulator rounds", sum(r.late_rounds for r in sims)),
    ]
    for label, value in rows:
        print(f"  {label:32} {value:>10}")
    if s.get("recent_latency_p50_s") is not None:
        p50, p99 = s["recent_latency_p50_s"], s["recent_latency_p99_s"]
        print(f"  {'latency sample->stored p50/p99':32} {p50:.3f}s / {p99:.3f}s (the last 30 s of live samples)")
    if isinstance(training, TrainingReport):
        switched = p.get("baselines_version") == training.version
        accuracy = (
            "" if training.classifier_accuracy is None else f"; workload classifier {training.classifier_accuracy:.0%}"
        )
        print(
            f"\nLearned baselines version {training.version} from {training.rows} stored samples: "
            f"{len(training.baselines)} baselines (application x GPU model x phase){accuracy}; the running processor "
            + ("switched to it without a restart" if switched else f"is on version {p.get('baselines_version')}")
        )
    else:
        print(f"\nBaselines: {training}")
    span = f"{max(60, (time.time_ns() - live_from_ns) // 10**9 + 5)}s"
    mine = Scope(cluster=settings.cluster)  # this run's fleet, whatever else the database holds
    with Store.from_settings(settings) as store:
        history = anomalies(store, AnomalyQuery(span, scope=mine))
    totals = {k: sum(getattr(w, k) for w in history.windows) for k in ("samples", "unusual", "anomalous")}
    if totals["samples"]:
        print(
            f"Live part judged: {totals['samples']} samples, {totals['unusual']} unusual, "
            f"{totals['anomalous']} anomalous ({totals['anomalous'] / totals['samples']:.2%})"
        )
    started = [f for f in history.findings if f.active]
    by_detector: dict[str, set[str]] = {}
    for f in started:
        by_detector.setdefault(f.detector, set()).add(f"{f.node}/{f.gpu[:12]}")
    print(f"Findings: {', '.join(f'{d} on {len(g)} GPU(s)' for d, g in sorted(by_detector.items())) or 'none'}")
    for f in sorted(started, key=lambda f: f.time_ns)[:8]:
        print(finding_line(f.severity, f.summary))
    notified = run_history(settings, HistoryQuery(span, limit=10_000))
    outcomes: dict[str, int] = {}
    for n in notified:
        outcomes[n.outcome] = outcomes.get(n.outcome, 0) + 1
    print(f"Notifications to '{OPERATORS}': {', '.join(f'{v} {k}' for k, v in sorted(outcomes.items())) or 'none yet'}")
    print_health(settings)
    print("\nTrend read back from InfluxDB: p95 of power relative to each GPU's limit, per GPU model, 30 s windows")
    print(format_table(run_trend(settings, TrendQuery("power_ratio_of_limit", "gpu_model", "30s", span, "p95", mine))))
    i = settings.influxdb
    print(
        f"\nWhere to look:\n  dashboard  {url}  (fleet, GPU, job, topology, alerts, right-sizing)\n"
        f"  InfluxDB   {i.url}  org={i.org} bucket={i.bucket} (token in {services.state_path(settings)})\n"
        f"  Kafka      {settings.kafka.bootstrap_servers}  topics {settings.topics.raw}, "
        f"{settings.topics.interpreted}, {settings.topics.alerts}, {settings.topics.dead_letter}\n"
        + metrics
        + f"  logs       {run_dir}\n"
        "  try        hermeneut health | hermeneut top hot | hermeneut anomalies | hermeneut alerts list --firing\n"
        "             hermeneut rightsize\n"
        "  stop       hermeneut services down"
    )


def print_health(settings: Settings) -> None:
    """The health of this run's fleet now: GPUs and nodes by state, and each GPU that is not healthy with its
    remedy and the findings behind it (``hermeneut health``)."""
    from alerting.admin import AlertAdmin
    from hermeneut.views.health import HealthQuery, counted, fleet_health, health_json, node_topologies
    from sinks.query import Store

    q = HealthQuery(cluster=settings.cluster)
    topologies = node_topologies(settings)
    admin = AlertAdmin(settings).start()
    try:
        with Store.from_settings(settings) as store:
            data = health_json(fleet_health(admin, store, q, time.time_ns(), settings.health, topologies), q)
    finally:
        admin.close()
    gpus, nodes = data["gpus_by_state"], data["nodes_by_state"]
    print(f"Health: {counted(gpus, 'GPUs')}; {counted(nodes, 'nodes')}")
    for i in data["incidents"]:
        print(f"  fleet incident: {i['detector']} on {i['gpus']} of {i['of_gpus']} GPUs at once (no per-GPU remedy)")
    for a in data["gpus"]:
        why = ", ".join(sorted({r["detector"] for r in a["reasons"]})) or "no sample lately"
        print(f"  {a['node']}/{a['gpu'][:12]}  {a['state']:9} -> {a['remedy']:19} ({why})")
