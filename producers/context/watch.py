"""The context watch loop of one node: poll every source, merge, publish what changed to the context topic.

Emits :class:`~pipeline.events.GpuContext` records keyed ``gpu_key(cluster, node, uuid)``:

- a record when a GPU's merged workload is new or differs from the last one published;
- a **tombstone** (null value) when no source knows a workload for a GPU any more (the job ended). Not a record
  with ``workload=None``: "nobody knows" is the processor's cue to classify from telemetry (a miner started
  outside the scheduler is then still caught), and compaction drops the key instead of keeping it forever;
- every ``reassert_s`` (10 min) the whole current state again, plus the tombstones of that period, so a record
  lost to a failed delivery is repaired and the compacted topic always converges to the truth.

Sized by construction: the free-text fields of a workload (job id, user, tenant, model, framework) are cut to
:data:`TEXT_MAX` characters, so a record is a few hundred bytes whatever a scheduler or an annotation says; a
record the context topic still refuses (:class:`~pipeline.errors.RecordTooLarge`, a cluster with a tiny limit) is
counted (``too_large``) and logged, never a crash of the loop.

Sources fail independently: one that raises :class:`~producers.context.base.SourceUnavailable` keeps its last
observation (logged once when it starts failing and once when it recovers) and is retried with backoff and
jitter; the others go on. ``manual`` records (``hermeneut context set``) come from the topic itself, through a
callable the CLI backs with a :class:`~pipeline.mirror.TopicMirror`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.codec import encode_record
from pipeline.errors import RecordTooLarge, SourceUnavailable
from pipeline.events import GpuContext, Workload, gpu_key
from pipeline.metrics import PUBLISHER_FIELDS, Field, counter, gauge
from producers.context.base import MANUAL, Backoff, ContextSource, Observation
from producers.context.merge import diff, merge_observations

log = logging.getLogger(__name__)

#: (key, value or None for a tombstone)
Sink = Callable[[bytes, bytes | None], object]
#: the longest free text a published workload carries (job names and annotations can be anything)
TEXT_MAX: Final = 256


#: the watch's counters as ``/metrics`` shows them (:meth:`Watcher.values` plus its publisher's)
WATCH_FIELDS: tuple[Field, ...] = (
    counter("steps", "hermeneut_context_polls_total", "Polls of every source (one merge each)."),
    counter("published", "hermeneut_context_records_total", "Workload records published (new or changed)."),
    counter("tombstones", "hermeneut_context_tombstones_total", "Tombstones published (a job ended)."),
    counter("reasserts", "hermeneut_context_reasserts_total", "Times the whole state was published again."),
    counter("source_failures", "hermeneut_context_source_failures_total", "Failed polls, by source.", "source"),
    gauge("source_up", "hermeneut_context_source_up", "1 while the source answers, by source.", "source"),
    gauge("gpus", "hermeneut_context_gpus", "GPUs of the node with a known workload."),
    # "published" is the watch's own count of records here, not the publisher's of messages
    *(f for f in PUBLISHER_FIELDS if f.key != "published"),
)


@dataclass
class WatchStats:
    steps: int = 0
    published: int = 0
    tombstones: int = 0
    reasserts: int = 0
    too_large: int = 0
    source_failures: dict[str, int] = field(default_factory=dict)
    failing: list[str] = field(default_factory=list)


@dataclass
class _SourceState:
    source: ContextSource
    backoff: Backoff
    last: Observation = field(default_factory=dict)
    failing: bool = False


class Watcher:
    """Merges the sources of one node and publishes changes; drive it with :meth:`step` or :meth:`run`."""

    def __init__(
        self,
        cluster: str,
        node: str,
        sources: Sequence[ContextSource],
        sink: Sink,
        *,
        manual: Callable[[], Observation] | None = None,
        published: Mapping[str, Workload] | None = None,
        reassert_s: float = 600.0,
        backoff_initial_s: float = 5.0,
        backoff_max_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cluster, self.node, self.sink = cluster, node, sink
        self._sources = [_SourceState(s, Backoff(backoff_initial_s, backoff_max_s, clock=clock)) for s in sources]
        self._manual = manual
        # what the topic holds for this node: from the topic at start-up, so a restart publishes only changes
        self._published: dict[str, Workload] = dict(published or {})
        self._ended_since_assert: set[str] = set()
        self.reassert_s, self.clock, self.clock_ns = reassert_s, clock, clock_ns
        self._last_assert = clock()
        self.stats = WatchStats()

    def values(self) -> dict[str, Any]:
        """The counters, per source too, and how many GPUs have a workload (for the stats file and /metrics)."""
        up = {s.source.name: int(not s.failing) for s in self._sources}
        return dataclasses.asdict(self.stats) | {"source_up": up, "gpus": len(self._published)}

    @property
    def current(self) -> dict[str, Workload]:
        """What was last published for each GPU of the node."""
        return dict(self._published)

    def _poll(self, state: _SourceState) -> None:
        if not state.backoff.ready():
            return
        name = state.source.name
        try:
            state.last = state.source.poll()
        except SourceUnavailable as exc:
            self.stats.source_failures[name] = self.stats.source_failures.get(name, 0) + 1
            delay = state.backoff.fail()
            if not state.failing:
                log.warning(
                    "context source %s failed (%s); keeping its last state, retrying in %.0fs", name, exc, delay
                )
            state.failing = True
            return
        if state.failing:
            log.info("context source %s recovered after %d failures", name, state.backoff.failures)
        state.failing = False
        state.backoff.ok()

    def _record(self, uuid: str, workload: Workload) -> bytes:
        texts = {name: getattr(workload, name) for name in ("job_id", "user", "tenant", "model", "framework")}
        cut = {name: value[:TEXT_MAX] for name, value in texts.items() if value is not None and len(value) > TEXT_MAX}
        workload = dataclasses.replace(workload, **cut) if cut else workload
        return encode_record(GpuContext(self.cluster, self.node, uuid, self.clock_ns(), workload))

    def _send(self, key: bytes, value: bytes | None) -> None:
        try:
            self.sink(key, value)
        except RecordTooLarge as exc:
            self.stats.too_large += 1
            log.error("context of %s not published: %s", key.decode(errors="replace"), exc)

    def step(self, force_reassert: bool = False) -> int:
        """Poll, merge, publish; returns how many records (tombstones included) were published."""
        for state in self._sources:
            self._poll(state)
        observations: dict[str, Observation] = {f"{i}:{s.source.name}": s.last for i, s in enumerate(self._sources)}
        if self._manual is not None:
            observations[MANUAL] = {u: w for u, w in self._manual().items() if w.source == MANUAL}
        desired = merge_observations(observations)
        changes = diff(self._published, desired)
        reassert = force_reassert or self.clock() - self._last_assert >= self.reassert_s
        upserts = desired if reassert else changes.upserts
        # a GPU that got a workload again must not get an old tombstone re-sent after its new record
        ended = (set(changes.ended) | (self._ended_since_assert if reassert else set())) - desired.keys()
        for uuid, workload in upserts.items():
            self._send(gpu_key(self.cluster, self.node, uuid), self._record(uuid, workload))
        for uuid in sorted(ended):
            self._send(gpu_key(self.cluster, self.node, uuid), None)
        if reassert:
            self._last_assert = self.clock()
            self._ended_since_assert = set(changes.ended)
            self.stats.reasserts += 1
        else:
            self._ended_since_assert = (self._ended_since_assert | set(changes.ended)) - desired.keys()
        self._published = desired
        self.stats.steps += 1
        self.stats.published += len(upserts)
        self.stats.tombstones += len(ended)
        self.stats.failing = [s.source.name for s in self._sources if s.failing]
        if changes:
            log.info(
                "node %s: %d workloads changed, %d ended (%d GPUs with a workload)",
                self.node,
                len(changes.upserts),
                len(changes.ended),
                len(desired),
            )
        return len(upserts) + len(ended)

    def run(self, stop: threading.Event, interval_s: float, after_step: Callable[[], bool] | None = None) -> None:
        """Step every ``interval_s`` until ``stop`` is set. ``after_step`` returning True forces a re-assert
        on the next step (the CLI uses it when a delivery failed)."""
        force = False
        while not stop.is_set():
            self.step(force_reassert=force)
            force = after_step() if after_step is not None else False
            stop.wait(interval_s)
