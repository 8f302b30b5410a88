"""Published baselines: a version as the processor uses it (:class:`BaselineSet`: the baseline for any (application,
GPU model, phase), and the classifier), the check of every record read from the baselines topic, and hot reload
(:class:`BaselineStore`: the latest complete version, swapped in between batches, never inside one).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import TypeVar

import numpy as np

from pipeline.baselines import (
    CLASSIFIER_KEY,
    MANIFEST_KEY,
    BaselineManifest,
    BaselineRecord,
    ClassifierRecord,
)
from pipeline.codec import decode_record
from pipeline.errors import DecodeError
from processors.baselines.model import FLEET, QUANTILES, Baseline, baseline_id
from processors.classify import Classifier

log = logging.getLogger(__name__)
R = TypeVar("R")


class BaselineSet:
    """Every baseline of one published version, and the classifier, resolved per (application, model, phase) and
    cluster.

    A version may hold several baselines of one id: ``baselines train --cluster X`` publishes X's under keys of
    their own (:func:`cluster_key`) and keeps every other cluster's (:func:`merged`). A row is judged by its own
    cluster's baseline (one learned from that cluster alone; the newest when there are two), else by the one
    learned from the most rows, at each level of :meth:`resolve` in turn.
    """

    def __init__(
        self,
        manifest: BaselineManifest,
        records: list[BaselineRecord],
        classifier: ClassifierRecord | None = None,
    ) -> None:
        self.manifest = manifest
        self.version = manifest.version
        self.baselines: dict[str, Baseline] = {}
        self._own: dict[tuple[str, str], Baseline] = {}
        for r in records:
            shared = self.baselines.get(r.baseline_id)
            if shared is None or (r.n, r.trained_ns) > (shared.record.n, shared.record.trained_ns):
                self.baselines[r.baseline_id] = Baseline(r)
            if len(r.clusters) == 1:
                own = self._own.get((r.clusters[0], r.baseline_id))
                if own is None or r.trained_ns > own.record.trained_ns:
                    self._own[(r.clusters[0], r.baseline_id)] = Baseline(r)
        self.classifier = Classifier(classifier) if classifier is not None else None
        self._resolved: dict[tuple[str, str, str, str | None], Baseline | None] = {}

    def resolve(self, application: str, gpu_model: str, phase: str, cluster: str | None = None) -> Baseline | None:
        """The most specific baseline there is: the model's own, else the application's prior, else the fleet's;
        at each, ``cluster``'s own before another's."""
        key = (application, gpu_model, phase, cluster)
        if key not in self._resolved:
            found = None
            for candidate in (
                baseline_id(application, gpu_model, phase),
                baseline_id(application, None, phase),
                baseline_id(FLEET, None, phase),
            ):
                found = self._own.get((cluster, candidate)) if cluster is not None else None
                found = found or self.baselines.get(candidate)
                if found is not None:
                    break
            self._resolved[key] = found
        return self._resolved[key]


def cluster_key(baseline_id_: str, cluster: str) -> str:
    """The topic key (and manifest id) of a baseline learned from one cluster alone: ``<id>@<cluster>``, so that
    the same (application, model, phase) of two clusters are two records, neither replacing the other."""
    return f"{baseline_id_}@{cluster}"


def merged(
    fresh: list[BaselineRecord], cluster: str | None, previous: Mapping[str, BaselineRecord], version: int
) -> dict[str, BaselineRecord]:
    """The records of a new version by topic key (pure).

    Learned from every cluster (``cluster`` None): the fresh records alone, keyed by id, as always. Learned from one
    cluster: the fresh records under that cluster's keys, and every record of the previous version (``previous``,
    by key) that is not that cluster's own, carried into the new version unchanged but for its version number.
    Training one cluster never deletes another's baselines (issue 37)."""
    if cluster is None:
        return {r.baseline_id: r for r in fresh}
    mine = {cluster_key(r.baseline_id, cluster): r for r in fresh}
    own_suffix = cluster_key("", cluster)
    kept = {k: replace(r, version=version) for k, r in previous.items() if not k.endswith(own_suffix)}
    return kept | mine


def decode_baselines_record(payload: bytes) -> BaselineRecord | ClassifierRecord | BaselineManifest:
    """Any record of the baselines topic, checked so that using it cannot fail; DecodeError when it is none of
    them or does not hold together (the mirror then skips and counts it)."""
    record = _decoded_as(BaselineRecord, payload)
    if record is not None:
        _check_baseline(record)
        return record
    classifier = _decoded_as(ClassifierRecord, payload)
    if classifier is not None:
        _check_classifier(classifier)
        return classifier
    return decode_record(BaselineManifest, payload)


def _decoded_as(kind: type[R], payload: bytes) -> R | None:
    """``payload`` as a ``kind``; None when it is another kind of record (any other problem is raised)."""
    try:
        return decode_record(kind, payload)
    except DecodeError as exc:
        if not exc.detail.startswith("expected a"):
            raise
        return None


def _check_baseline(r: BaselineRecord) -> None:
    k, m = len(r.features), r.modes
    sizes = (len(r.center), len(r.covariance), len(r.quantiles), len(r.mode_quantiles) or m * len(QUANTILES) * k)
    if k == 0 or m < 1 or sizes != (m * k, m * k * k, len(QUANTILES) * k, m * len(QUANTILES) * k):
        raise DecodeError("inconsistent", f"{r.baseline_id}: {k} features but arrays of sizes {sizes}")
    values = np.array([*r.center, *r.covariance, *r.quantiles, *r.mode_quantiles, r.unusual, r.anomalous])
    if not np.isfinite(values).all():
        raise DecodeError("nan", f"{r.baseline_id}: non-finite values")
    try:
        np.linalg.cholesky(np.array(r.covariance).reshape(m, k, k))
    except np.linalg.LinAlgError as exc:
        raise DecodeError("inconsistent", f"{r.baseline_id}: covariance is not positive definite") from exc


def _check_classifier(r: ClassifierRecord) -> None:
    c, n = len(r.classes), len(r.inputs)
    sizes = (len(r.mean), len(r.scale), len(r.coef), len(r.intercept))
    if c < 2 or sizes != (n, n, c * n, c):
        raise DecodeError("inconsistent", f"classifier: {c} classes x {n} inputs but arrays of sizes {sizes}")
    values = np.array([*r.mean, *r.scale, *r.coef, *r.intercept])
    if not np.isfinite(values).all() or min(r.scale) <= 0 or r.window < 1:
        raise DecodeError("inconsistent", "classifier: non-finite values, a non-positive scale or window")


class BaselineStore:
    """The latest complete version on the baselines topic, fed by a TopicMirror's ``on_change``.

    A version becomes current only once its manifest and every record it names (at that version) are here;
    readers take :meth:`current` between batches, so a swap never happens inside one.
    """

    def __init__(self) -> None:
        self._records: dict[bytes, BaselineRecord | ClassifierRecord | BaselineManifest] = {}
        self._current: BaselineSet | None = None

    def on_change(self, key: bytes, value: BaselineRecord | ClassifierRecord | BaselineManifest | None) -> None:
        if value is None:
            self._records.pop(key, None)
        else:
            self._records[key] = value
        self._maybe_switch()

    def _maybe_switch(self) -> None:
        manifest = self._records.get(MANIFEST_KEY)
        if not isinstance(manifest, BaselineManifest):
            return
        if self._current is not None and manifest.version <= self._current.version:
            return
        records = [self._records.get(i.encode()) for i in manifest.ids]
        if not all(isinstance(r, BaselineRecord) and r.version == manifest.version for r in records):
            return
        classifier = self._records.get(CLASSIFIER_KEY)
        if manifest.classifier and not (
            isinstance(classifier, ClassifierRecord) and classifier.version == manifest.version
        ):
            return
        self._current = BaselineSet(
            manifest,
            [r for r in records if isinstance(r, BaselineRecord)],
            classifier if manifest.classifier and isinstance(classifier, ClassifierRecord) else None,
        )
        log.info("baselines version %d ready: %d baselines", manifest.version, len(manifest.ids))

    def current(self) -> BaselineSet | None:
        return self._current
