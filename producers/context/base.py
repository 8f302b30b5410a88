"""What every workload-context source shares: the source contract, its errors and the confidence scale.

A source answers one question per poll: *which workload runs on which GPU of this node, as far as I know?*
It returns an :data:`Observation` (GPU uuid -> :class:`~pipeline.events.Workload`) and says nothing about GPUs
it knows nothing about. A source that cannot answer right now (API server down, ``squeue`` timing out) raises
:class:`SourceUnavailable`; the watch loop then keeps its last answer and retries with backoff.

``Workload.confidence`` is the confidence in ``application`` (0..1); ``application == "unknown"`` always has
confidence 0, so a source that knows the job but not its class never outweighs one that knows the class.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Final, Protocol

from pipeline.events import APPLICATIONS, Workload

#: GPU uuid (``GPU-...`` or ``MIG-...``) -> what runs there
Observation = Mapping[str, Workload]

#: A person said so (``hermeneut context set``): overrides everything until cleared.
MANUAL: Final = "manual"

#: Confidence of an application a scheduler was told explicitly (annotation, job comment).
DECLARED_CONFIDENCE: Final = 0.95
#: Ceiling for an application guessed from names (job name, pod labels, image, container args).
HINT_CONFIDENCE_CAP: Final = 0.6
#: Ceiling for an application inferred from the processes on the GPU: below any scheduler's declaration.
PROCESS_CONFIDENCE_CAP: Final = 0.7

_KNOWN: Final = frozenset(APPLICATIONS)


class ContextSource(Protocol):
    """A source of workload context for the GPUs of one node."""

    name: str

    def poll(self) -> Observation:
        """The current workload per GPU uuid; raises :class:`SourceUnavailable` when it cannot tell now."""
        ...


def is_application(value: str) -> bool:
    return value in _KNOWN


class Backoff:
    """When to try a failing source again: exponential from ``initial_s`` to ``max_s``, with +-``jitter``."""

    def __init__(
        self,
        initial_s: float = 5.0,
        max_s: float = 300.0,
        jitter: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.initial_s, self.max_s, self.jitter, self.clock = initial_s, max_s, jitter, clock
        self._rng = rng or random.Random()
        self.failures = 0
        self._next = 0.0

    def ready(self) -> bool:
        return self.clock() >= self._next

    def fail(self) -> float:
        """Note a failure; returns the delay until the next attempt."""
        delay = min(self.max_s, self.initial_s * 2.0**self.failures)
        delay *= 1.0 + self._rng.uniform(-self.jitter, self.jitter)
        self.failures += 1
        self._next = self.clock() + delay
        return delay

    def ok(self) -> None:
        self.failures = 0
        self._next = 0.0
