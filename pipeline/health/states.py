"""The health vocabulary: the states a GPU or node can be in, the remedies (strongest last), and the shape of a
rule that maps a finding kind onto them (the rules themselves are the ``health`` column of pipeline.kinds)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class Health(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"
    #: held out of service on purpose by its scheduler (a drain, a maintenance reservation, a cordon)
    MAINTENANCE = "maintenance"


class Remedy(StrEnum):
    NONE = "none"
    RESTART_JOB = "restart job"
    RESET_GPU = "reset GPU"
    REBOOT_NODE = "reboot node"
    DRAIN = "drain"
    INSPECT = "hardware inspection"
    RMA = "RMA"


#: how bad a state is (unknown sits between: not known healthy, not shown to be ill; maintenance is nobody's alarm)
BADNESS: Final = {Health.HEALTHY: 0, Health.MAINTENANCE: 1, Health.UNKNOWN: 2, Health.DEGRADED: 3, Health.UNHEALTHY: 4}
#: how strong a remedy is (its place in :class:`Remedy`, strongest last)
STRENGTH: Final = {r: i for i, r in enumerate(Remedy)}


@dataclass(frozen=True, slots=True)
class Rule:
    """What a finding kind does to its GPU: the state at warning and at critical severity, the remedy, and why."""

    warning: Health
    critical: Health
    remedy: Remedy
    source: str
