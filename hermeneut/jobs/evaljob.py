"""The evaluation job (``hermeneut evaluate``): a replay with ground truth through the real pipeline, scored.

1. Local services up (or the configured ones), an isolated topic set (``TopicSettings.with_prefix``), processor
   and sink as child processes.
2. A producer publishes history with ground truth: normally the simulator, fast-forwarded with faults; it writes
   the workload context to a *truth* topic, and a relay copies it to the pipeline's context topic for every
   node but a withheld share, so the processor has to infer those nodes' applications (that is how
   classification is measured).
3. Drain: wait until every published sample is stored or dead-lettered (progress bar).
4. Read back findings (alerts topic), ground truth (ground-truth topic) and the interpreted rows (which GPUs were
   seen when, what application was inferred where context was withheld) and score them with
   :mod:`hermeneut.jobs.evaluation`; the PAI straggler check runs on the real step-time files.

Nothing is scored from a run cut short: a simulator that stopped before the end of its history (signalled, killed,
failed) or samples neither stored nor dead-lettered after the drain is an :class:`~pipeline.errors.IncompleteRun`.
SIGINT/SIGTERM (:class:`Interrupt`) stop every process the evaluation started, within seconds, local servers only
where it started them, and nothing is scored (:class:`~pipeline.errors.RunInterrupted`).
"""

from __future__ import annotations

import atexit
import hashlib
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from tqdm import tqdm

from hermeneut.jobs.evaluation import Classification, Evaluation, classify_score, score
from hermeneut.jobs.paistragglers import PaiResult, pai_result, pai_step_windows
from hermeneut.stages import start_stage
from pipeline import services
from pipeline.codec import decode_interpreted, decode_record
from pipeline.config import Settings, TopicSettings
from pipeline.errors import IncompleteRun, InvalidEvent, RunInterrupted, ServiceError
from pipeline.events import FaultRecord, Finding, GpuContext
from pipeline.kinds import FAULTS
from pipeline.publisher import Publisher
from pipeline.services.stages import Stage, wait_for
from pipeline.topics import TopicSpec, ensure_topics, topic_specs, wait_for_topics

#: publishes history to the raw / truth-context / topology / ground-truth topics; returns samples published
Producer = Callable[[Settings, Path], int]

#: how long a child gets to stop on SIGTERM when the run failed or was interrupted (its result is discarded, so
#: there is nothing to drain) before it is killed; a finished run's stages get 60 s to commit what they did
STOP_GRACE_S = 5.0

#: the repository's copy, else the workplace's shared data (this file is hermeneut/jobs/evaljob.py)
PAI_DIRS = (
    Path(__file__).resolve().parents[2] / "tests" / "testdata" / "alibaba-pai2020-minibatch-stragglers",
    Path(__file__).resolve().parents[3] / "shared" / "data" / "alibaba-pai2020-minibatch-stragglers",
)


@dataclass
class Outcome:
    evaluation: Evaluation
    samples: int
    stored: int
    dead_lettered: int
    findings: int
    faults: int
    withheld_nodes: list[str] = field(default_factory=list)
    pai: list[PaiResult] = field(default_factory=list)
    run_dir: Path | None = None


def evaluation_settings(settings: Settings, tag: str) -> Settings:
    """The settings with an isolated topic set, consumer groups and cluster tag for one evaluation run."""
    topics = TopicSettings.with_prefix(
        f"eval-{tag}", partitions=settings.topics.partitions, replication_factor=settings.topics.replication_factor
    )
    return replace_settings(settings, topics=topics, group_prefix=f"eval-{tag}", cluster=f"eval-{tag}")


def replace_settings(settings: Settings, **changes: Any) -> Settings:
    return settings.model_copy(update=changes)


def truth_topic(settings: Settings) -> str:
    return f"{settings.topics.context}-truth"


def withheld(node: str, share: float, seed: int) -> bool:
    """Whether a node's context is withheld: a stable hash, so the same seed withholds the same nodes."""
    digest = hashlib.sha256(f"{seed}/{node}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


class ContextRelay:
    """Copies the truth context topic to the pipeline's context topic except for withheld nodes, and keeps the
    truth timeline per GPU (data time -> application) for scoring the classifier."""

    def __init__(self, settings: Settings, share: float, seed: int) -> None:
        self.settings, self.share, self.seed = settings, share, seed
        self.timeline: dict[str, list[tuple[int, str]]] = {}
        self.withheld_nodes: set[str] = set()
        self.relayed = 0
        self._stop = threading.Event()
        self._last_ts = 0
        self._thread = threading.Thread(target=self._run, name="context-relay", daemon=True)

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def start(self) -> ContextRelay:
        self._thread.start()
        return self

    def _run(self) -> None:
        conf = self.settings.kafka.client_config()
        consumer = Consumer(
            conf
            | {
                "group.id": f"relay-{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe([truth_topic(self.settings)])
        publisher = Publisher(conf)
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, timeout=0.2):
                    if msg.error() is not None:
                        continue
                    key, value = msg.key() or b"", msg.value()
                    self._record(key, value)
                    node = key.decode(errors="replace").split("/")[1] if key.count(b"/") >= 2 else ""
                    if withheld(node, self.share, self.seed):
                        self.withheld_nodes.add(node)
                        continue
                    publisher.publish(self.settings.topics.context, key, value)
                    self.relayed += 1
                publisher.poll(0)
        finally:
            consumer.close()
            publisher.close(30)

    def _record(self, key: bytes, value: bytes | None) -> None:
        gpu = key.decode(errors="replace").rsplit("/", 1)[-1]
        if value is None:
            # a tombstone carries no time: the GPU is free from about the last context change seen
            self.timeline.setdefault(gpu, []).append((self._last_ts, "idle"))
            return
        try:
            ctx = decode_record(GpuContext, value)
        except InvalidEvent:
            return
        self._last_ts = max(self._last_ts, ctx.ts_ns)
        app = ctx.workload.application if ctx.workload is not None else "idle"
        self.timeline.setdefault(ctx.gpu_uuid, []).append((ctx.ts_ns, app))

    def stop(self, last_records_s: float = 1.0) -> None:
        time.sleep(last_records_s)  # the last context records
        self._stop.set()
        self._thread.join(60)

    def truth_at(self, gpu: str, ts_ns: np.ndarray) -> list[str | None]:
        """The true application of ``gpu`` at each timestamp (None before its first context record)."""
        events = sorted(self.timeline.get(gpu, []))
        if not events:
            return [None] * len(ts_ns)
        times = np.array([t for t, _ in events], dtype=np.int64)
        idx = np.searchsorted(times, ts_ns, side="right") - 1
        return [events[i][1] if i >= 0 else None for i in idx.tolist()]


def read_topic(settings: Settings, topic: str, timeout_s: float = 600.0) -> Iterator[tuple[bytes, bytes | None]]:
    """Every record of ``topic``, from the beginning of each partition up to its end when the read started.

    Bounded by the high watermarks rather than by an idle time, so a slow caller (decoding between reads) cannot
    end the read early; ``timeout_s`` only guards against a broker that stops answering.
    """
    consumer = Consumer(
        settings.kafka.client_config()
        | {"group.id": f"eval-reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False}
    )
    try:
        # a topic created a moment ago may not be in this broker's metadata yet (pipeline.topics.wait_for_topics)
        found, pending = wait_for_topics(consumer, [topic], 30.0)
        if pending:
            raise ServiceError(f"topic {topic} has no readable metadata after 30 s")
        partitions = found[topic].partitions
        ends: dict[int, int] = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} timed out with partitions {sorted(ends)} unfinished")
            for m in consumer.consume(1000, timeout=0.5):
                if m.error() is not None:
                    continue
                p, offset = m.partition() or 0, m.offset() or 0
                if p in ends:
                    yield m.key() or b"", m.value()
                    if offset + 1 >= ends[p]:
                        del ends[p]
    finally:
        consumer.close()


def collect(
    settings: Settings, relay: ContextRelay
) -> tuple[list[Finding], list[FaultRecord], dict[tuple[str, str, str], tuple[int, int]], Classification]:
    """Findings, ground truth, each GPU's first/last sample time, and the classification of withheld nodes."""
    # only the evaluated replay counts, not the history the baselines were learned from (its own cluster tag)
    mine = settings.cluster
    findings = [
        f
        for _k, v in read_topic(settings, settings.topics.alerts)
        if v and (f := decode_record(Finding, v)).cluster == mine
    ]
    truth = [
        r
        for _k, v in read_topic(settings, settings.topics.ground_truth)
        if v and (r := decode_record(FaultRecord, v)).cluster == mine
    ]
    observed: dict[tuple[str, str, str], tuple[int, int]] = {}
    pairs: list[tuple[str | None, str]] = []
    for _k, value in read_topic(settings, settings.topics.interpreted):
        if not value:
            continue
        b = decode_interpreted(value)
        rows_by_gpu: dict[tuple[str, str, str], list[int]] = {}
        for i, key in enumerate(zip(b.cluster, b.node, b.gpu_uuid, strict=True)):
            if key[0] == mine:
                rows_by_gpu.setdefault(key, []).append(i)
        for key, rows in rows_by_gpu.items():
            ts = b.ts_ns[rows]
            first, last = observed.get(key, (int(ts.min()), int(ts.max())))
            observed[key] = (min(first, int(ts.min())), max(last, int(ts.max())))
            if key[1] not in relay.withheld_nodes:
                continue
            for i, true in zip(rows, relay.truth_at(key[2], ts), strict=True):
                if true is not None:
                    wl = b.workload[i]
                    pairs.append((wl.application if wl is not None else None, true))
    return findings, truth, observed, classify_score(pairs)


def pai_check() -> list[PaiResult]:
    """The straggler function on the Alibaba PAI step times, against the stragglers its README names."""
    from processors.detectors.stragglers import StragglerParams, scan

    folder = next((d for d in PAI_DIRS if d.is_dir()), None)
    if folder is None:
        return []
    params = StragglerParams()
    return [pai_result(job, scan(pai_step_windows(folder / f"job_{job}_norm.csv"), params)) for job in (1, 2, 3, 4)]


def stop_all(stages: Sequence[Stage], grace_s: float) -> None:
    """SIGTERM to every stage at once, then each gets up to ``grace_s`` before SIGKILL. A signal meanwhile
    (RunInterrupted, raised once) cuts the wait to :data:`STOP_GRACE_S` and is raised once every stage is gone."""
    for stage in stages:
        if stage.alive():
            stage.proc.terminate()
    interrupted: RunInterrupted | None = None
    for stage in stages:
        try:
            stage.stop(grace_s)
        except RunInterrupted as exc:
            interrupted, grace_s = exc, STOP_GRACE_S
            stage.stop(grace_s)
    if interrupted is not None:
        raise interrupted


def _drain(stages: tuple[Stage, Stage], samples: int, timeout_s: float) -> tuple[int, int]:
    processor, sink = stages

    def accounted() -> tuple[int, int]:
        p, s = processor.stats(), sink.stats()
        dead = int(p.get("dead_lettered", 0)) + int(s.get("dead_lettered", 0))
        return int(s.get("points_written", 0)), dead

    with tqdm(total=samples, desc="stored or dead-lettered", unit="sample", dynamic_ncols=True) as bar:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stored, dead = accounted()
            bar.update(max(0, stored + dead - bar.n))
            if stored + dead >= samples or not all(s.alive() for s in stages):
                break
            time.sleep(0.5)
    return accounted()


def learning_cluster(settings: Settings) -> str:
    """The cluster tag of the history baselines are learned from before an evaluated replay."""
    return f"{settings.cluster}-learn"


def learn(
    ev: Settings, stages: tuple[Stage, Stage], run_dir: Path, produce: Producer, history_s: float, timeout_s: float
) -> int:
    """Publish a labelled history under the learning cluster tag, store it, train on it and wait until the running
    processor uses the new version; returns the samples it published."""
    from hermeneut.jobs.training import train

    cluster = learning_cluster(ev)
    samples = produce(replace_settings(ev, cluster=cluster), run_dir)
    stored, dead = _drain(stages, samples, timeout_s)
    if stored + dead < samples:
        raise RuntimeError(f"the learning history was not stored ({stored} of {samples}); see {run_dir}")
    report = train(ev, history_s + 600, cluster=cluster)
    if not report.published:
        raise RuntimeError("no baselines could be learned from the learning history")
    processor = stages[0]
    if not wait_for(lambda: processor.stats().get("baselines_version") == report.version, 120):
        raise RuntimeError(f"the processor did not take up baselines version {report.version}; see {run_dir}")
    return samples


def run_evaluation(
    settings: Settings,
    produce: Producer,
    run_dir: Path,
    seed: int = 0,
    withhold_share: float = 0.25,
    tolerance_s: float = 30.0,
    drain_timeout_s: float = 1800.0,
    learn_from: tuple[Producer, float] | None = None,
) -> Outcome:
    """Run one evaluation on resolved settings (see module docstring); the stages are stopped at the end.

    ``learn_from`` (a producer and the seconds of history it publishes): before the replay, baselines and the
    application classifier are learned from that history, labelled and fault-free, under a cluster tag of its
    own, as ``hermeneut baselines train`` would; without it the processor has none (nothing is inferred).
    """
    ev = evaluation_settings(settings, f"{seed}-{uuid.uuid4().hex[:6]}")
    conf = ev.kafka.client_config()
    truth_spec = next(s for s in topic_specs(ev) if s.name == ev.topics.context)
    truth_copy = TopicSpec(truth_topic(ev), truth_spec.partitions, truth_spec.replication_factor, truth_spec.config)
    ensure_topics(conf, [*topic_specs(ev), truth_copy])
    stages: list[Stage] = []
    relay = ContextRelay(ev, withhold_share, seed)
    finished = False
    try:
        stages += [start_stage("process", ev, run_dir), start_stage("sink", ev, run_dir)]
        relay.start()
        if not wait_for(lambda: all(s.stats().get("assigned") or not s.alive() for s in stages), 120):
            raise RuntimeError(f"processor/sink did not join their groups within 120 s; see {run_dir}")
        pair = (stages[0], stages[1])
        learned = learn(ev, pair, run_dir, *learn_from, drain_timeout_s) if learn_from else 0
        samples = produce(
            replace_settings(ev, topics=ev.topics.model_copy(update={"context": truth_topic(ev)})), run_dir
        )
        stored, dead = _drain(pair, learned + samples, drain_timeout_s)
        if stored + dead < learned + samples:
            died = [s.name for s in stages if not s.alive()]
            why = f"the {' and '.join(died)} exited" if died else f"drain timed out after {drain_timeout_s:g} s"
            raise IncompleteRun(
                f"{learned + samples - stored - dead} of {learned + samples} samples neither stored nor dead-lettered "
                f"({why}): the run is truncated, not scored; see {run_dir}"
            )
        stored -= learned
        # let the processor's 1 s timer publish what time passing concludes
        time.sleep(3.0)
        finished = True
    finally:
        # a failed or interrupted run is discarded: its stages get seconds, not a drain
        stop_all(stages, 60.0 if finished else STOP_GRACE_S)
        if relay.started:
            relay.stop(1.0 if finished else 0.0)
    findings, truth, observed, classification = collect(ev, relay)
    end_ns = max((last for _first, last in observed.values()), default=time.time_ns())
    evaluation = score(
        findings, truth, observed, run_end_ns=end_ns, tolerance_s=tolerance_s, classification=classification
    )
    faults = len({(r.node, r.gpu_uuid, r.fault, r.start_ns) for r in truth if r.fault in FAULTS})
    return Outcome(
        evaluation, samples, stored, dead, len(findings), faults, sorted(relay.withheld_nodes), pai_check(), run_dir
    )


def simulated(sim: Stage, rounds: float, what: str) -> int:
    """Wait for a fast-forwarding simulator and return the samples it published, or IncompleteRun when it did not
    publish its whole history: a simulator stopped by a signal drains and exits 0 with the rounds it got to, and
    a run scored on those would be scored as complete. Stopped (seconds) if the wait ends another way."""
    try:
        code = sim.proc.wait()
    finally:
        stop_all([sim], STOP_GRACE_S)
    stats = sim.stats()
    done = int(stats.get("fast_forward_rounds", 0))
    lost = int(stats.get("undelivered", 0)) + int(stats.get("failed", 0))
    if code != 0 or done < int(rounds) or lost:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        raise IncompleteRun(
            f"{what} {how} after {done} of {int(rounds)} rounds ({lost} messages undelivered): the run is truncated, "
            f"not scored; see {sim.log}"
        )
    return int(stats.get("samples", 0))


def _simulator(
    settings: Settings, run_dir: Path, nodes: int, gpus: int, seed: int, history_s: int, *more: str
) -> Stage:
    """The simulator as a child process fast-forwarding ``history_s`` of a seeded fleet; ``more``: fault options."""
    fleet = ("--nodes", str(nodes), "--gpus", str(gpus), "--seed", str(seed), "--fast-forward", str(history_s))
    return start_stage("simulate", settings, run_dir, *fleet, *more)


def learning_producer(nodes: int, gpus: int, hours: float, seed: int) -> Callable[[Settings, Path], int]:
    """The simulator, fault-free and fully labelled, as the history baselines are learned from."""

    def produce(settings: Settings, run_dir: Path) -> int:
        history_s = int(hours * 3600)
        sim = _simulator(settings, run_dir, nodes, gpus, seed, history_s)
        return simulated(sim, history_s / settings.sample_interval_s, "the learning simulator")

    return produce


def simulator_producer(
    nodes: int, gpus: int, hours: float, seed: int, faults_per_class: float
) -> Callable[[Settings, Path], int]:
    """The simulator as the producer: fast-forwarded history with a balanced fault mix (each class expected
    ``faults_per_class`` times over the run), as a child process."""
    from producers.simulator.plan import FaultPlan

    plan = FaultPlan.for_evaluation(nodes, hours * 3600, faults_per_class)

    def produce(settings: Settings, run_dir: Path) -> int:
        history_s = int(hours * 3600)
        sim = _simulator(
            settings,
            run_dir,
            nodes,
            gpus,
            seed,
            history_s,
            "--faults",
            "--fault-mix",
            "balanced",
            "--fault-rate-scale",
            repr(plan.rate_scale),
        )
        return simulated(sim, history_s / settings.sample_interval_s, "the simulator")

    return produce


class Interrupt:
    """SIGINT/SIGTERM during an evaluation. The first raises :class:`~pipeline.errors.RunInterrupted` in the main
    thread wherever it waits (a child, the drain, a read), so each ``finally`` on the way out stops what it started
    (:data:`STOP_GRACE_S` each); later signals are ignored while that runs. Before this, SIGINT was a
    KeyboardInterrupt that waited up to 60 s per stage and never stopped the simulator, and SIGTERM killed this
    process and left its processor, sink and servers running.

    ``after(fn, ...)``: at exit, only if interrupted, ``fn(...)``: the local servers this run started go after its
    stages (which would otherwise wait on a broker that is gone)."""

    def __init__(self) -> None:
        self.signum = 0

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum:
            return
        self.signum = signum
        raise RunInterrupted(
            signum,
            f"interrupted by {signal.Signals(signum).name}: every process this evaluation "
            "started is stopped; nothing is scored",
        )

    def install(self) -> Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self)
        return self

    def after(self, fn: Callable[..., object], *args: Any) -> None:
        atexit.register(lambda: fn(*args) if self.signum else None)


def local_services(settings: Settings) -> Settings:
    """Start the local services where none are configured, and fill in their endpoints. From here on SIGINT and
    SIGTERM stop the evaluation (:class:`Interrupt`); the local servers go too if this call started them, never a
    pair that was running before (pipeline.services: only ``down`` stops a server someone else started)."""
    interrupt = Interrupt()
    if threading.current_thread() is threading.main_thread():
        interrupt.install()
    if settings.uses_local_kafka or settings.uses_local_influxdb:
        fresh = services.read_state(settings) is None
        services.up(settings)
        if fresh:  # a new run folder and servers of this process's own (services.up stops them if it fails)
            interrupt.after(services.down, settings, True)
    return services.resolve(settings)
