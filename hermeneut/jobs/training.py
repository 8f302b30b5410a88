"""``hermeneut baselines train``: learn baselines and the application classifier from stored history, version
them, publish them for running processors to hot-reload, and write the bands to InfluxDB.

The face of the Iterate loop, wiring the query layer (sinks.query.history: history, feedback, findings) to the
pure fitting code (processors.baselines.fit, processors.classify); stages are imported inside the functions, as
everywhere in ``pipeline/``. Steps:
1. read every stored sample with a known application in the range (not one the classifier inferred: the
   baselines must not learn from their own guesses), per (application, GPU model), with a progress bar;
2. leave out what must not count as normal: samples of a GPU within 60 s of an event an operator marked
   anomalous, and samples inside the windows of faults (warning and critical findings; info findings such as idle
   capacity are how the fleet runs, and are learned), counted per reason and logged;
3. per (application, GPU model, phase) with at least ``min_samples`` rows fit a baseline, per (application,
   phase) a prior pooled over models, per phase a fleet-wide prior; events marked not anomalous join the
   baseline that judged them and widen its thresholds;
4. fit the classifier on rolling windows of the same history;
5. publish records, then the manifest (version = previous + 1), tombstone ids the new version dropped, and
   write the ``baseline`` measurement. Trained for one cluster (``cluster``), the version holds that cluster's
   records under keys of their own and every other cluster's records of the previous version, unchanged
   (processors.baselines.store.merged): training one cluster never deletes another's baselines.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from pipeline.baselines import (
    CLASSIFIER_KEY,
    MANIFEST_KEY,
    BaselineBand,
    BaselineManifest,
    BaselineRecord,
    ClassifierRecord,
)
from pipeline.codec import encode_record
from pipeline.config import Settings
from pipeline.errors import ServiceError
from pipeline.events import PHASES

if TYPE_CHECKING:
    from processors.baselines.fit import LabelledRows
    from sinks.query.history import FeedbackRow, History

log = logging.getLogger(__name__)

#: samples of a GPU this close to an event marked anomalous are left out of training
FEEDBACK_EXCLUDE_NS = 60 * 10**9
#: the severities of findings whose windows are left out of training: faults, not information
FAULT_SEVERITIES: Final = frozenset({"warning", "critical"})


@dataclass
class TrainingReport:
    """What one training run learned and published."""

    version: int = 0
    rows: int = 0
    rows_excluded: int = 0
    #: rows left out of training by reason (fault findings, events marked anomalous)
    excluded_by: Counter[str] = field(default_factory=Counter)
    rows_inferred: int = 0
    baselines: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    classifier_accuracy: float | None = None
    classifier_classes: tuple[str, ...] = ()
    feedback_used: int = 0
    bands_written: int = 0
    published: bool = False
    #: baselines of other clusters a one-cluster training carried into its version unchanged
    kept: int = 0


def previous_manifest(settings: Settings, timeout_s: float = 30.0) -> BaselineManifest | None:
    """The manifest currently on the baselines topic (None before the first training)."""
    return previous_version(settings, timeout_s)[0]


def previous_version(
    settings: Settings, timeout_s: float = 30.0
) -> tuple[BaselineManifest | None, dict[str, BaselineRecord], ClassifierRecord | None]:
    """The version on the baselines topic: its manifest, its records by key (manifest id) and its classifier;
    (None, {}, None) before the first training."""
    from pipeline.mirror import TopicMirror
    from processors.baselines.store import decode_baselines_record

    mirror = TopicMirror(settings.kafka.client_config(), settings.topics.baselines, decode_baselines_record).start()
    try:
        if not mirror.wait_ready(timeout_s):
            raise ServiceError(f"could not read {settings.topics.baselines} within {timeout_s:.0f}s")
        state = mirror.snapshot()
    finally:
        mirror.stop()
    manifest = state.get(MANIFEST_KEY)
    if not isinstance(manifest, BaselineManifest):
        return None, {}, None
    records = {key: r for key in manifest.ids if isinstance(r := state.get(key.encode()), BaselineRecord)}
    classifier = state.get(CLASSIFIER_KEY)
    return manifest, records, classifier if manifest.classifier and isinstance(classifier, ClassifierRecord) else None


#: a window of rows to leave out: (cluster, gpu, start_ns, end_ns), both ends included
Window = tuple[str, str, int, int]


def _excluded(h: History, windows: list[Window]) -> np.ndarray:
    """Rows of ``h`` inside any (cluster, gpu, start, end) window. A GPU is named within its cluster (an imported
    ``<node>-gpu<i>``, a uuid reused by a simulator): a fault of GPU x in one cluster says nothing of x elsewhere."""
    out = np.zeros(len(h), dtype=bool)
    if not windows:
        return out
    gpu = np.asarray(h.gpu, dtype=object)
    cluster = np.asarray(h.cluster, dtype=object)
    for where, uuid, start, end in windows:
        out |= (cluster == where) & (gpu == uuid) & (h.ts_ns >= start) & (h.ts_ns <= end)
    return out


def left_out(
    h: History, known: np.ndarray, faults: list[Window], marked: list[Window]
) -> tuple[np.ndarray, Counter[str]]:
    """Which rows of ``h`` training uses (known applications outside fault windows and marked events), and how
    many of the known rows were left out for each reason (pure)."""
    in_fault, in_marked = _excluded(h, faults), _excluded(h, marked)
    why = Counter(
        {
            "fault findings": int((known & in_fault).sum()),
            "marked anomalous": int((known & in_marked & ~in_fault).sum()),
        }
    )
    return known & ~in_fault & ~in_marked, why


def _labelled(
    history: dict[tuple[str, str], History],
    faults: list[Window],
    marked: list[Window],
    report: TrainingReport,
) -> list[LabelledRows]:
    """Each (application, model)'s stored rows as features with their phase, less what is left out (counted)."""
    from processors.baselines.fit import LabelledRows
    from processors.features import PHASE_INDEX, features, fill_relative, infer_phase

    parts: list[LabelledRows] = []
    for (app, model), h in history.items():
        report.rows += len(h)
        known = np.array([s != "inferred" for s in h.source], dtype=bool)
        report.rows_inferred += int((~known).sum())
        use, why = left_out(h, known, faults, marked)
        report.rows_excluded += int((known & ~use).sum())
        report.excluded_by.update(why)
        if not use.any():
            continue
        models = (model,) * len(h)
        f = features(h.metrics, fill_relative(h.metrics, h.relative, models), models)
        stored_phase = np.array([PHASE_INDEX.get(p or "", -1) for p in h.phase], dtype=np.int64)
        phase = np.where(stored_phase < 0, infer_phase(f), stored_phase)
        gpu = np.unique(np.asarray(h.gpu, dtype=object), return_inverse=True)[1]
        clusters = frozenset(np.asarray(h.cluster, dtype=object)[use].tolist())
        parts.append(LabelledRows(app, model, f[use], phase[use], gpu[use], h.ts_ns[use], clusters))
    return parts


def _kept(settings: Settings, feedback: list[FeedbackRow], report: TrainingReport) -> dict[str, list[np.ndarray]]:
    """The rows operators marked not anomalous, as features by the baseline that judged them (kept in its band)."""
    from processors.baselines.model import baseline_id
    from processors.features import features, fill_relative, infer_phase
    from sinks.query.history import stored_event

    keep: dict[str, list[np.ndarray]] = {}
    for fb in feedback:
        if fb.verdict != "not-anomalous":
            continue
        event = stored_event(settings, fb.gpu, fb.event_ts_ms)
        if event is None or not event.application:
            continue
        models = (event.gpu_model,)
        one = event.metrics[None, :]
        f = features(one, fill_relative(one, event.relative[None, :], models), models)
        phase_name = PHASES[int(infer_phase(f)[0])]
        keep.setdefault(event.baseline or baseline_id(event.application, event.gpu_model, phase_name), []).append(f)
        report.feedback_used += 1
    return keep


def train(
    settings: Settings,
    range_s: float,
    min_samples: int | None = None,
    stride: str | None = None,
    now_ns: int | None = None,
    progress: bool = True,
    echo: Callable[[str], Any] = log.info,
    cluster: str | None = None,
) -> TrainingReport:
    """Learn from the last ``range_s`` seconds of history (of one cluster tag, or all) and publish a new version
    (see module docstring)."""
    from processors.baselines.fit import fit_version
    from processors.baselines.store import merged
    from sinks.query.history import feedback_rows, finding_windows, training_history

    cfg = settings.baselines
    min_samples = cfg.min_samples if min_samples is None else min_samples
    stop_ns = now_ns or time.time_ns()
    start_ns = stop_ns - int(range_s * 1e9)
    report = TrainingReport()
    previous, previous_records, previous_classifier = previous_version(settings)
    version = (previous.version if previous else 0) + 1

    history = training_history(settings, start_ns, stop_ns, stride, cluster=cluster, progress=progress)
    feedback = feedback_rows(settings)
    # faults (warning and critical findings) and what operators marked anomalous are left out; information
    # (idle capacity, a narrow link from the first sample, a young baseline anomaly) is how the fleet runs
    found = finding_windows(settings, start_ns, stop_ns)
    faults = [(w.cluster, w.gpu, w.start_ns, w.end_ns) for w in found if w.severity in FAULT_SEVERITIES]
    marked = [
        (fb.cluster, fb.gpu, fb.event_ts_ms * 10**6 - FEEDBACK_EXCLUDE_NS, fb.event_ts_ms * 10**6 + FEEDBACK_EXCLUDE_NS)
        for fb in feedback
        if fb.verdict == "anomalous"
    ]

    parts = _labelled(history, faults, marked, report)
    keep = _kept(settings, feedback, report)

    log.info(
        "training: %d of %d known rows left out: %s",
        report.rows_excluded,
        report.rows,
        dict(report.excluded_by) or "none",
    )
    trained_ns = time.time_ns()
    fitted = fit_version(
        parts, version, trained_ns, min_samples, cfg.classifier_window, cfg.classifier_min_confidence, keep
    )
    records, classifier = fitted.records, fitted.classifier
    report.baselines = {r.baseline_id: r.n for r in records}
    report.skipped = fitted.skipped
    if classifier is not None:
        report.classifier_accuracy = classifier.holdout_accuracy
        report.classifier_classes = classifier.classes
    report.version = version
    if not records:
        echo(f"nothing to publish: no (application, model, phase) has {min_samples} known samples in range")
        return report
    # one cluster's training keeps every other cluster's baselines (and the classifier when it fits none)
    keyed = merged(records, cluster, previous_records, version)
    report.kept = len(keyed) - len(records)
    if cluster is not None and classifier is None and previous_classifier is not None:
        classifier = replace(previous_classifier, version=version)
    manifest = BaselineManifest(
        version=version,
        trained_ns=trained_ns,
        range_start_ns=start_ns,
        range_end_ns=stop_ns,
        ids=tuple(keyed),
        counts={key: r.n for key, r in keyed.items()},
        classifier=classifier is not None,
        feedback_used=report.feedback_used,
        rows_excluded=report.rows_excluded,
    )
    publish(settings, manifest, list(keyed.values()), classifier, previous, keys=list(keyed))
    report.published = True
    report.bands_written = write_bands(settings, records)
    return report


def publish(
    settings: Settings,
    manifest: BaselineManifest,
    records: list[BaselineRecord],
    classifier: ClassifierRecord | None,
    previous: BaselineManifest | None = None,
    keys: list[str] | None = None,
) -> None:
    """Records first, the manifest last (readers switch on a complete manifest); tombstones for dropped ids.
    ``keys``: each record's key (its manifest id); by default its baseline id.

    Every record is checked against the topic's size limit (read from the cluster) before the first is sent: a
    version that cannot be published whole is refused with one line, never published in part."""
    from pipeline.publisher import Publisher
    from pipeline.sizing import read_limits

    topic = settings.topics.baselines
    limits = read_limits(settings.kafka.client_config(), [topic], settings.kafka.request_timeout_s)
    keys = keys or [record.baseline_id for record in records]
    out = [(key.encode(), encode_record(record)) for key, record in zip(keys, records, strict=True)]
    out += [(CLASSIFIER_KEY, encode_record(classifier))] if classifier is not None else []
    out.append((MANIFEST_KEY, encode_record(manifest)))
    for key, value in out:
        if not limits.fits(topic, key, value):
            raise ServiceError(
                f"baseline record {key.decode()} is {len(value)} bytes, over {topic}'s limit of "
                f"{limits.limit(topic)} (max.message.bytes): version {manifest.version} not published"
            )
    pub = Publisher(settings.kafka.client_config(), limits=limits)
    for key, value in out:
        pub.publish(topic, key, value)
    dropped = set(previous.ids) - set(manifest.ids) if previous else set()
    for bid in sorted(dropped):
        pub.publish(topic, bid.encode(), None)  # a tombstone
    if pub.close(60) or pub.stats.failed:
        raise ServiceError(f"could not publish baselines version {manifest.version} to {topic}: {pub.last_error}")
    log.info("published baselines version %d (%d baselines)", manifest.version, len(records))


def bands(record: BaselineRecord) -> list[BaselineBand]:
    """The ``baseline`` measurement points of one record, in the units of the stored fields they describe."""
    from processors.baselines.model import QUANTILES
    from processors.features import LINK_METRIC, link_capacity

    k = len(record.features)
    q = np.array(record.quantiles).reshape(len(QUANTILES), k)
    out = []
    for j, feature in enumerate(record.features):
        name, factor = feature, 1.0
        if feature in LINK_METRIC and record.gpu_model is not None:
            capacity = link_capacity(record.gpu_model, feature)
            if capacity == capacity:  # noqa: PLR0124 (known)
                name, factor = LINK_METRIC[feature], capacity
        p01, p05, p50, p95, p99 = (float(v) * factor for v in q[:, j])
        out.append(
            BaselineBand(
                record.application,
                record.gpu_model or "*",
                record.phase,
                name,
                p01,
                p05,
                p50,
                p95,
                p99,
                record.n,
                record.version,
                record.trained_ns,
            )
        )
    return out


def write_bands(settings: Settings, records: list[BaselineRecord]) -> int:
    """Write every record's bands to InfluxDB; returns the number of points."""
    from sinks.influxdb.lines import baseline_band_line
    from sinks.influxdb.write import InfluxWriter

    lines = [baseline_band_line(b) for r in records for b in bands(r)]
    writer = InfluxWriter.from_settings(settings.influxdb)
    try:
        writer.write(lines)
    finally:
        writer.close()
    return len(lines)
