"""What the processor concluded, as Prometheus metrics: for people who keep Prometheus, Grafana and Alertmanager.

Each processor exposes the GPUs of the partitions it reads (Prometheus adds or joins across processors)::

    hermeneut_gpu_verdict{cluster,node,gpu,gpu_index,gpu_model,verdict}  1 for the GPU's latest verdict, 0 for each
                                                                      other one (a state set, as kube-state-metrics
                                                                      exposes a pod's phase)
    hermeneut_gpu_score{cluster,node,gpu,gpu_index,gpu_model}         its latest score (absent while unscored)
    hermeneut_finding_open{cluster,node,gpu,detector,severity}        1 per open finding (gpu="" for a node's)
    hermeneut_processor_verdicts_total{verdict}                       samples judged, by verdict
    hermeneut_gpu_seconds_total{application}                          GPU time seen, per application
    hermeneut_gpu_idle_seconds_total{application}                     of it, held by a job but idle (the idle-
                                                                      capacity detector's condition): wasted

The labels identify a GPU (``gpu`` is its uuid; index and model are functions of it, so they add no series) or take
a value from a fixed vocabulary (verdict, detector, severity, application). Nothing that grows without bound is a
label: no job id, user, phase or score. The budget (README, "Prometheus metrics and their cardinality budget"): per
GPU 4 verdict series and 1 score series, plus one series per open finding; 10,000 GPUs stay near 50,000 series.

A GPU not heard of for ``stale_after_s``, and an open finding not repeated for as long (detectors repeat an open
finding every ``detectors.repeat_s``), leave the exposition: the node went away, or its partition moved to another
processor, which exposes it from then on. Time is counted on the data's clock: the gap between a GPU's consecutive
samples, at most ``MAX_GAP_S``.

The fleet-health state (issue 12, not built yet) belongs here, beside the verdict, as
``hermeneut_gpu_health_state{...,state}``: a state set over its states, with the same GPU labels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final

import numpy as np
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipeline.events import APPLICATIONS, Finding, InterpretedBatch, Verdict
from processors.detectors import idle

VERDICTS: Final = tuple(v.value for v in Verdict)
GPU_LABELS: Final = ("cluster", "node", "gpu", "gpu_index", "gpu_model")
FINDING_LABELS: Final = ("cluster", "node", "gpu", "detector", "severity")
#: the application of a GPU no context source knows and the classifier did not name
NO_APPLICATION: Final = "unknown"
#: a longer gap between two samples of a GPU is a silence, not time the GPU was seen
MAX_GAP_S: Final = 60.0
_VERDICT_CODE: Final = {v: i for i, v in enumerate(Verdict)}
_APP_CODE: Final = {a: i for i, a in enumerate(APPLICATIONS)}
_NO_APP: Final = _APP_CODE[NO_APPLICATION]


class Conclusions:
    """The collector of the metrics above; the processor calls :meth:`observe` with each interpreted batch and
    :meth:`findings` with the findings it sends. Per GPU, the latest verdict, score and sample time are arrays
    indexed by a row per GPU, so a batch updates them with vector operations. Thread-safe: Prometheus scrapes from
    another thread."""

    def __init__(self, stale_after_s: float = 180.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s, self.clock = stale_after_s, clock
        self._row: dict[str, int] = {}
        self._labels: list[tuple[str, str, str, str, str]] = []
        self._verdict = np.zeros(0, dtype=np.int64)
        self._score = np.zeros(0)
        #: the latest sample time per GPU (-1: none yet) and when it was last observed (processor's monotonic clock)
        self._ts = np.zeros(0, dtype=np.int64)
        self._seen = np.zeros(0)
        self._open: dict[str, tuple[tuple[str, ...], float]] = {}
        self._judged = np.zeros(len(VERDICTS), dtype=np.int64)
        self._gpu_s = np.zeros(len(APPLICATIONS))
        self._idle_s = np.zeros(len(APPLICATIONS))
        self._lock = threading.Lock()

    def _rows(self, batch: InterpretedBatch, now: float) -> np.ndarray:
        """Each row's GPU row, new GPUs added (one dictionary look-up per sample: the only per-sample Python)."""
        row = self._row
        rows = np.fromiter((row.get(u, -1) for u in batch.gpu_uuid), dtype=np.int64, count=len(batch))
        for i in np.flatnonzero(rows < 0).tolist():
            uuid = batch.gpu_uuid[i]
            if uuid not in row:
                row[uuid] = len(self._labels)
                self._labels.append(
                    (batch.cluster[i], batch.node[i], uuid, str(batch.gpu_index[i]), batch.gpu_model[i])
                )
            rows[i] = row[uuid]
        grown = len(self._labels) - len(self._ts)
        if grown:
            self._verdict = np.r_[self._verdict, np.zeros(grown, dtype=np.int64)]
            self._score = np.r_[self._score, np.full(grown, np.nan)]
            self._ts = np.r_[self._ts, np.full(grown, -1, dtype=np.int64)]
            self._seen = np.r_[self._seen, np.full(grown, now)]
        return rows

    def observe(self, batch: InterpretedBatch) -> None:
        """Take in a batch: its verdict counts, each GPU's latest verdict and score, and the GPU time it covers."""
        n = len(batch)
        if not n:
            return
        now = self.clock()
        wasted, _ = idle.condition(batch.metrics, idle.allocated(batch.workload))
        apps = np.fromiter(
            (_NO_APP if w is None else _APP_CODE.get(w.application, _NO_APP) for w in batch.workload),
            dtype=np.int64,
            count=n,
        )
        verdicts = np.fromiter((_VERDICT_CODE[v] for v in batch.verdict), dtype=np.int64, count=n)
        with self._lock:
            rows = self._rows(batch, now)
            order = np.lexsort((batch.ts_ns, rows))  # by GPU, then time
            r, ts, stored = rows[order], batch.ts_ns[order], self._ts[rows[order]]
            first = np.r_[True, r[1:] != r[:-1]]
            # the GPU's previous sample: the batch's previous row of it, or the latest before the batch; a late row
            # (older than what was seen) counts no time and does not move the clock back
            prev = np.maximum(np.where(first, stored, np.r_[0, ts[:-1]]), stored)
            gap_s = (ts - prev) / 1e9
            counted = (prev >= 0) & (gap_s > 0) & (gap_s <= MAX_GAP_S)
            np.add.at(self._gpu_s, apps[order][counted], gap_s[counted])
            idle_time = counted & wasted[order]
            np.add.at(self._idle_s, apps[order][idle_time], gap_s[idle_time])
            self._judged += np.bincount(verdicts, minlength=len(VERDICTS))
            last = np.r_[r[1:] != r[:-1], True]
            newest = last & (ts >= stored)
            taken, gpus = order[newest], r[newest]
            self._verdict[gpus], self._score[gpus], self._ts[gpus] = verdicts[taken], batch.score[taken], ts[newest]
            self._seen[r[last]] = now

    def findings(self, findings: Sequence[Finding]) -> None:
        """Take in findings as they are sent: an active one opens (or refreshes) its finding, a clear closes it."""
        now = self.clock()
        with self._lock:
            for f in findings:
                if f.active:
                    labels = (f.cluster, f.node, f.gpu_uuid or "", f.detector, f.severity.value)
                    self._open[f.dedup_key] = (labels, now)
                else:
                    self._open.pop(f.dedup_key, None)

    def _expire(self) -> None:
        horizon = self.clock() - self.stale_after_s
        self._open = {key: o for key, o in self._open.items() if o[1] >= horizon}
        keep = np.flatnonzero(self._seen >= horizon)
        if len(keep) < len(self._seen):
            self._labels = [self._labels[i] for i in keep.tolist()]
            self._row = {labels[2]: i for i, labels in enumerate(self._labels)}
            for name in ("_verdict", "_score", "_ts", "_seen"):
                setattr(self, name, getattr(self, name)[keep])

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            self._expire()
            gpus = list(zip(self._labels, self._verdict.tolist(), self._score.tolist(), strict=True))
            open_findings = [labels for labels, _ in self._open.values()]
            judged, gpu_s, idle_s = self._judged.tolist(), self._gpu_s.tolist(), self._idle_s.tolist()
        verdict = GaugeMetricFamily(
            "hermeneut_gpu_verdict",
            "1 for the latest verdict of the GPU, 0 for the others.",
            labels=[*GPU_LABELS, "verdict"],
        )
        score = GaugeMetricFamily(
            "hermeneut_gpu_score", "The GPU's latest score against its baseline.", labels=GPU_LABELS
        )
        for gpu, code, value in gpus:
            for i, v in enumerate(VERDICTS):
                verdict.add_metric([*gpu, v], 1.0 if code == i else 0.0)
            if value == value:  # noqa: PLR0124  # not NaN: scored
                score.add_metric(list(gpu), value)
        opened = GaugeMetricFamily(
            "hermeneut_finding_open", "1 per open finding (gpu is empty for a node's).", labels=FINDING_LABELS
        )
        for labels in sorted(open_findings):
            opened.add_metric(list(labels), 1.0)
        samples = CounterMetricFamily("hermeneut_processor_verdicts", "Samples judged, by verdict.", labels=["verdict"])
        for v, count in zip(VERDICTS, judged, strict=True):
            samples.add_metric([v], float(count))
        seen = CounterMetricFamily("hermeneut_gpu_seconds", "GPU time seen, per application.", labels=["application"])
        wasted = CounterMetricFamily(
            "hermeneut_gpu_idle_seconds",
            "GPU time held by a job but idle (< 5% utilization), per application.",
            labels=["application"],
        )
        for app, total, held_idle in zip(APPLICATIONS, gpu_s, idle_s, strict=True):
            if total:
                seen.add_metric([app], total)
                wasted.add_metric([app], held_idle)
        yield from (verdict, score, opened, samples, seen, wasted)
