"""Records of the learned-baselines and feedback topics: part of the schema, kept apart from ``events.py``
because only the training job, the scorer and the feedback command speak them.

The baselines topic (compacted, one partition) holds one :class:`BaselineRecord` per baseline id, one
:class:`ClassifierRecord` (key ``__classifier__``) and one :class:`BaselineManifest` (key ``__manifest__``)
naming the version and every id that belongs to it. The trainer publishes the records first and the manifest
last; a reader switches to a version only once it holds every record the manifest names at that version, so a
half-published version is never used. Arrays travel as tuples of floats (row-major for matrices).

The feedback topic (compacted, keyed by event id ``<gpu uuid>@<ts ms>``) holds one :class:`Feedback` per event
an operator judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

MANIFEST_KEY: Final = b"__manifest__"
CLASSIFIER_KEY: Final = b"__classifier__"
FEEDBACK_VERDICTS: Final = ("anomalous", "not-anomalous")


@dataclass(frozen=True, slots=True)
class BaselineRecord:
    """One learned baseline: robust Gaussians (one per mode) over ``features`` plus per-feature quantiles.

    ``gpu_model`` is None for a prior pooled over GPU models; ``application`` is ``"fleet"`` for the fleet-wide
    prior. ``quantiles`` holds p1, p5, p50, p95, p99 of each feature (5 x len(features), row-major); ``center``
    and ``covariance`` one Gaussian per mode (modes x len(features), modes x len(features)^2, row-major).
    Scores above ``unusual`` / ``anomalous`` (in the calibrated score's units, see processors/baselines/)
    give those verdicts.
    """

    baseline_id: str
    version: int
    application: str
    gpu_model: str | None
    phase: str
    features: tuple[str, ...]
    center: tuple[float, ...]
    covariance: tuple[float, ...]
    quantiles: tuple[float, ...]
    unusual: float
    anomalous: float
    n: int
    trained_ns: int
    #: operator feedback events ("not anomalous") the thresholds were widened to cover
    feedback_covered: int = 0
    modes: int = 1
    #: per mode, the same quantiles over the training rows closest to it (modes x 5 x len(features)); empty
    #: with one mode. Drivers compare a row with its nearest mode's band; ``quantiles`` is the whole baseline's.
    mode_quantiles: tuple[float, ...] = ()
    #: distinct GPUs the training rows came from (0: not recorded): how much history stands behind it
    gpus: int = 0
    #: the cluster tags the training rows came from (empty: not recorded); rows of another cluster are judged by
    #: it as by a prior (history from elsewhere, a simulator included, may widen a band, never condemn)
    clusters: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClassifierRecord:
    """The application classifier for GPUs without context: multinomial logistic regression over rolling-window
    statistics (see processors/classify.py). ``coef`` is classes x inputs, row-major; inputs are standardized
    with ``mean``/``scale`` first."""

    version: int
    classes: tuple[str, ...]
    inputs: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: tuple[float, ...]
    window: int
    min_confidence: float
    #: accuracy on the held-out share of the training windows
    holdout_accuracy: float
    n: int


@dataclass(frozen=True, slots=True)
class BaselineManifest:
    """A published version: which ids belong to it and what it was learned from."""

    version: int
    trained_ns: int
    range_start_ns: int
    range_end_ns: int
    ids: tuple[str, ...]
    counts: dict[str, int] = field(default_factory=dict)
    classifier: bool = False
    feedback_used: int = 0
    rows_excluded: int = 0


@dataclass(frozen=True, slots=True)
class Feedback:
    """An operator's verdict on one interpreted event (``verdict`` is one of FEEDBACK_VERDICTS)."""

    event_id: str
    cluster: str
    node: str
    gpu_uuid: str
    event_ts_ms: int
    verdict: str
    ts_ns: int
    application: str | None = None
    gpu_model: str | None = None
    note: str = ""
    user: str = ""


def event_id(gpu_uuid: str, ts_ns: int) -> str:
    """The id of an interpreted event: ``<gpu uuid>@<UTC epoch ms>`` (the precision stored in InfluxDB)."""
    return f"{gpu_uuid}@{ts_ns // 1_000_000}"


def parse_event_id(value: str) -> tuple[str, int]:
    """(gpu uuid, epoch ms) of an event id; ValueError with a readable message when it is not one."""
    uuid, sep, ms = value.rpartition("@")
    if not sep or not uuid or not ms.isdigit():
        raise ValueError(f"event id {value!r} is not <gpu uuid>@<epoch ms>")
    return uuid, int(ms)


@dataclass(frozen=True, slots=True)
class BaselineBand:
    """One point of the ``baseline`` measurement: a feature's band under one baseline, in the units of the stored
    field named ``feature`` (a RELATIVE_FIELDS or metric name). ``gpu_model`` is ``*`` for priors."""

    application: str
    gpu_model: str
    phase: str
    feature: str
    p01: float
    p05: float
    p50: float
    p95: float
    p99: float
    n: int
    version: int
    ts_ns: int
