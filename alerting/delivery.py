"""Delivery workers: one queue and one thread per receiver, so a dead receiver only ever delays itself.

A worker takes its oldest delivery and sends it; a transient failure is retried with exponential backoff and
full jitter (``retry_initial_s`` doubling up to ``retry_max_s``) until the delivery is ``retry_max_age_s`` old,
then it is given up (outcome ``failed``); a permanent failure is given up at once. Deliveries to one receiver
go out in order (a resolved notice never overtakes its firing one). Every attempt is reported to the manager
as an :class:`Attempt` (it records it in the history and, once final, removes the delivery from the outbox).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from alerting.model import Delivery, Receiver
from alerting.receivers import Sender, SendResult
from pipeline.config import AlertSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Attempt:
    delivery: Delivery
    receiver: Receiver
    attempt: int
    result: SendResult
    final: bool
    at_ns: int
    latency_ms: float

    @property
    def outcome(self) -> str:
        if self.result.ok:
            return "delivered"
        return "failed" if self.final else "retrying"


def backoff_s(attempt: int, initial_s: float, max_s: float, rand: Callable[[], float] = random.random) -> float:
    """Full-jitter exponential backoff before retry number ``attempt`` (1-based)."""
    ceiling: float = min(max_s, initial_s * 2.0 ** (attempt - 1))
    return rand() * ceiling + initial_s / 2


class _Worker:
    def __init__(self, key: str, pool: DeliveryPool) -> None:
        self.key = key
        self.pool = pool
        self.todo: deque[tuple[Delivery, Receiver]] = deque()
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"deliver-{key}", daemon=True)

    def _run(self) -> None:
        pool = self.pool
        while not pool.stopping.is_set():
            if not self.todo:
                self.wake.wait(0.2)
                self.wake.clear()
                continue
            delivery, receiver = self.todo[0]
            self._deliver(delivery, receiver)
            self.todo.popleft()

    def _deliver(self, d: Delivery, r: Receiver) -> None:
        pool, cfg = self.pool, self.pool.cfg
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            sender = pool.senders.get(r.kind)
            try:
                result = sender(d, r) if sender else SendResult(False, error=f"no sender for {r.kind}")
            except Exception as exc:  # a sender bug must not kill the worker; counted as a permanent failure
                log.exception("sender %s failed", r.kind)
                result = SendResult(False, error=f"{type(exc).__name__}: {exc}"[:300])
            now_ns = pool.clock_ns()
            old = now_ns - d.created_ns >= cfg.retry_max_age_s * 1e9
            final = result.ok or not result.retry or old or pool.stopping.is_set()
            if pool.stopping.is_set() and not result.ok and result.retry:
                return  # not given up: it stays in the outbox and the next run delivers it
            pool.report(Attempt(d, r, attempt, result, final, now_ns, (time.monotonic() - started) * 1000))
            if final:
                return
            if pool.stopping.wait(backoff_s(attempt, cfg.retry_initial_s, cfg.retry_max_s)):
                return


class DeliveryPool:
    """The delivery workers of one alert manager; ``results`` receives every :class:`Attempt`."""

    def __init__(
        self,
        cfg: AlertSettings,
        senders: dict[str, Sender],
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cfg = cfg
        self.senders = senders
        self.clock_ns = clock_ns
        self.results: queue.Queue[Attempt] = queue.Queue()
        self.stopping = threading.Event()
        self._workers: dict[str, _Worker] = {}
        self._queued: set[str] = set()

    def submit(self, d: Delivery, r: Receiver) -> None:
        """Queue a delivery (a delivery id already queued in this run is ignored)."""
        if d.id in self._queued:
            return
        self._queued.add(d.id)
        key = f"{d.subscription_id}/{d.receiver_index}"
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = _Worker(key, self)
            worker.thread.start()
        worker.todo.append((d, r))
        worker.wake.set()

    def report(self, a: Attempt) -> None:
        if a.final:
            self._queued.discard(a.delivery.id)
        self.results.put(a)

    def in_flight(self) -> int:
        return sum(len(w.todo) for w in self._workers.values())

    def close(self, grace_s: float = 5.0) -> None:
        """Stop every worker: a send under way finishes (bounded by the HTTP/SMTP timeout), backoffs end now."""
        deadline = time.monotonic() + grace_s
        self.stopping.set()
        for w in self._workers.values():
            w.wake.set()
            w.thread.join(max(0.0, deadline - time.monotonic()) + 0.1)
