"""Which application runs on a GPU that no context source describes, inferred from its telemetry signature.

One sample is too noisy to tell LLM serving from Stable Diffusion inference, so the classifier looks at a
rolling window of each GPU's FEATURES (the last ``window`` samples): per feature its mean, standard
deviation, minimum and maximum, plus the share of samples that had it (a feature a GPU does not report is a
signal in itself, never a zero). The model is a multinomial logistic regression (scikit-learn to fit, plain
numpy to predict): it travels as arrays on the baselines topic, with no pickle for a reader to trust, and
predicts a batch of GPUs in one matrix product.

:class:`WindowBuffer` keeps the windows as one numpy array (slot per GPU x window x feature, the slots of the
processor's one slot table, processors.state), updated per batch with vector operations. Below ``min_confidence``
the answer is ``unknown``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from pipeline.baselines import ClassifierRecord
from pipeline.events import Workload
from processors.features import FEATURE_NAMES
from processors.state import GpuKey, GpuSlots, column

STATS: Final = ("mean", "std", "min", "max")
INPUTS: Final[tuple[str, ...]] = tuple(f"{f}:{s}" for s in (*STATS, "present") for f in FEATURE_NAMES)
UNKNOWN: Final = "unknown"


def named(workload: Workload | None) -> bool:
    """A context source or the classifier names the application (not nothing, not ``unknown``)."""
    return workload is not None and workload.application not in ("", UNKNOWN)


#: a GPU needs this many samples in its window before it is classified
MIN_SAMPLES: Final = 5


def window_inputs(windows: np.ndarray) -> np.ndarray:
    """Classifier inputs (rows x INPUTS) from windows (rows x samples x FEATURES), NaN where a feature was absent
    over the whole window."""
    k = windows.shape[2]
    if windows.shape[0] == 0:
        return np.empty((0, len(INPUTS)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows of a feature: NaN is the answer
        stats = [
            np.nanmean(windows, axis=1),
            np.nanstd(windows, axis=1),
            np.nanmin(windows, axis=1),
            np.nanmax(windows, axis=1),
        ]
    present = (~np.isnan(windows)).mean(axis=1)
    return np.concatenate([*stats, present], axis=1).reshape(windows.shape[0], 5 * k)


class Classifier:
    """A ClassifierRecord ready to predict."""

    def __init__(self, record: ClassifierRecord) -> None:
        self.record = record
        self.classes = record.classes
        index = {name: i for i, name in enumerate(INPUTS)}
        # inputs this processor does not compute (a newer trainer) stay at their training mean
        self._cols = np.array([index.get(name, -1) for name in record.inputs], dtype=np.int64)
        self._mean = np.array(record.mean)
        self._scale = np.array(record.scale)
        self._coef = np.array(record.coef).reshape(len(record.classes), len(record.inputs))
        self._intercept = np.array(record.intercept)

    def predict(self, inputs: np.ndarray) -> tuple[list[str], np.ndarray]:
        """(application per row, its probability); ``unknown`` below the record's min_confidence."""
        if not len(inputs):
            return [], np.empty(0)
        x = np.where(self._cols >= 0, inputs[:, np.maximum(self._cols, 0)], np.nan)
        z = np.nan_to_num((x - self._mean) / self._scale, nan=0.0)
        logits = z @ self._coef.T + self._intercept
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        best = p.argmax(axis=1)
        confidence = p[np.arange(len(p)), best]
        names = [
            self.classes[b] if c >= self.record.min_confidence else UNKNOWN
            for b, c in zip(best, confidence, strict=True)
        ]
        return names, confidence


def fit_classifier(
    inputs: np.ndarray,
    labels: np.ndarray,
    version: int,
    window: int,
    min_confidence: float,
    holdout: float = 0.2,
    seed: int = 0,
) -> ClassifierRecord | None:
    """Fit on window inputs with known applications; None with fewer than two applications to tell apart.

    A seeded ``holdout`` share is kept out of the fit to report accuracy, then the model is refitted on all.
    """
    classes = np.unique(labels)
    if len(classes) < 2:
        return None
    rng = np.random.default_rng(seed)
    test = rng.random(len(labels)) < holdout
    accuracy = float("nan")
    if test.any() and len(np.unique(labels[~test])) == len(classes):
        model, mean, scale = _fit(inputs[~test], labels[~test])
        z = np.nan_to_num((inputs[test] - mean) / scale, nan=0.0)
        accuracy = float((model.predict(z) == labels[test]).mean())
    model, mean, scale = _fit(inputs, labels)
    return ClassifierRecord(
        version=version,
        classes=tuple(str(c) for c in model.classes_),
        inputs=INPUTS,
        mean=tuple(mean.tolist()),
        scale=tuple(scale.tolist()),
        coef=tuple(np.asarray(model.coef_).ravel().tolist()),
        intercept=tuple(np.asarray(model.intercept_).tolist()),
        window=window,
        min_confidence=min_confidence,
        holdout_accuracy=accuracy if not math.isnan(accuracy) else -1.0,
        n=len(labels),
    )


def _fit(inputs: np.ndarray, labels: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
    from sklearn.linear_model import LogisticRegression

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(inputs, axis=0)
        scale = np.nanstd(inputs, axis=0)
    mean = np.nan_to_num(mean)
    scale = np.where(np.isfinite(scale) & (scale > 1e-9), scale, 1.0)
    z = np.nan_to_num((inputs - mean) / scale, nan=0.0)
    model = LogisticRegression(C=1.0, max_iter=2000)
    model.fit(z, labels)
    return model, mean, scale


def history_windows(
    f: np.ndarray, gpu: np.ndarray, ts_ns: np.ndarray, window: int, stride: int
) -> tuple[np.ndarray, np.ndarray]:
    """Training windows from history: per GPU, its rows in time order cut into windows of ``window`` samples
    every ``stride`` samples. Returns (windows x window x FEATURES, the row index each window ends at)."""
    order = np.lexsort((ts_ns, gpu))
    cuts = np.flatnonzero(np.diff(gpu[order])) + 1
    out: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    for rows in np.split(order, cuts):
        if len(rows) < window:
            continue
        view = np.lib.stride_tricks.sliding_window_view(f[rows], window, axis=0)[::stride]
        out.append(np.moveaxis(view, 2, 1))
        ends.append(rows[window - 1 :: stride][: len(view)])
    if not out:
        return np.empty((0, window, f.shape[1])), np.empty(0, dtype=np.int64)
    return np.concatenate(out), np.concatenate(ends)


def arrival_ranks(slot: np.ndarray) -> np.ndarray:
    """Each row's rank among the rows of its slot, in arrival (row) order: 0 for a slot's first row."""
    order = np.argsort(slot, kind="stable")
    s = slot[order]
    starts = np.r_[0, np.flatnonzero(np.diff(s)) + 1]
    rank = np.empty(len(s), dtype=np.int64)
    rank[order] = np.arange(len(s)) - np.repeat(starts, np.diff(np.r_[starts, len(s)]))
    return rank


@dataclass(eq=False)
class _Windows:
    #: per slot: its last ``window`` FEATURES rows (a ring, see WindowBuffer.update) and how many it was given
    data: np.ndarray = column(np.nan)
    count: np.ndarray = column(0, dtype=np.int64)


class WindowBuffer:
    """The last ``window`` FEATURES rows of every GPU, as one array indexed by the slots of ``slots`` (the
    interpreter's slot table; its own when built alone)."""

    def __init__(self, window: int, features: int = len(FEATURE_NAMES), slots: GpuSlots | None = None) -> None:
        self.window = window
        self.table = slots if slots is not None else GpuSlots()
        self._windows = self.table.attach(_Windows(np.full((0, window, features), np.nan)))

    def slots(self, keys: list[GpuKey]) -> np.ndarray:
        """The slots of these GPUs (new ones get the next)."""
        return self.table.slots(keys)

    def update(self, slot: np.ndarray, f: np.ndarray) -> None:
        """Append rows (in arrival order) to their GPUs' windows."""
        if not len(slot):
            return
        count = self._windows.count
        rank = arrival_ranks(slot)
        per_gpu = np.bincount(slot, minlength=len(count))[slot]
        recent = rank >= per_gpu - self.window  # only the last `window` rows of a GPU can stay
        position = (count[slot[recent]] + rank[recent]) % self.window
        self._windows.data[slot[recent], position] = f[recent]
        np.add.at(count, slot, 1)

    def windows(self, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(windows of these slots, samples each holds)."""
        return self._windows.data[slot], np.minimum(self._windows.count[slot], self.window)
