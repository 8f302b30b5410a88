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
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from pipeline.events import Finding, InterpretedBatch, Verdict
from processors.detectors import idle

VERDICTS: Final = tuple(v.value for v in Verdict)
GPU_LABELS: Final = ("cluster", "node", "gpu", "gpu_index", "gpu_model")
FINDING_LABELS: Final = ("cluster", "node", "gpu", "detector", "severity")
#: the application of a GPU no context source knows and the classifier did not name
NO_APPLICATION: Final = "unknown"
#: a longer gap between two samples of a GPU is a silence, not time the GPU was seen
MAX_GAP_S: Final = 60.0


@dataclass(slots=True)
class _Gpu:
    labels: tuple[str, str, str, str, str]
    verdict: str
    score: float
    ts_ns: int
    #: when it was last observed, on the processor's monotonic clock
    seen: float


class Conclusions:
    """The collector of the metrics above; the processor calls :meth:`observe` with each interpreted batch and
    :meth:`findings` with the findings it sends. Thread-safe: Prometheus scrapes from another thread."""

    def __init__(self, stale_after_s: float = 180.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.stale_after_s, self.clock = stale_after_s, clock
        self._gpus: dict[str, _Gpu] = {}
        self._open: dict[str, tuple[tuple[str, ...], float]] = {}
        self._judged: Counter[str] = Counter()
        self._gpu_s: Counter[str] = Counter()
        self._idle_s: Counter[str] = Counter()
        self._lock = threading.Lock()

    def observe(self, batch: InterpretedBatch) -> None:
        """Take in a batch: its verdict counts, each GPU's latest verdict and score, and the GPU time it covers."""
        if not len(batch):
            return
        now = self.clock()
        wasted, _ = idle.condition(batch.metrics, idle.allocated(batch.workload))
        apps = [NO_APPLICATION if w is None else w.application for w in batch.workload]
        judged = Counter(v.value for v in batch.verdict)
        ts, scores, idle_rows = batch.ts_ns.tolist(), batch.score.tolist(), wasted.tolist()
        with self._lock:
            self._judged.update(judged)
            for i, uuid in enumerate(batch.gpu_uuid):
                gpu, t = self._gpus.get(uuid), ts[i]
                if gpu is None:
                    labels = (batch.cluster[i], batch.node[i], uuid, str(batch.gpu_index[i]), batch.gpu_model[i])
                    self._gpus[uuid] = _Gpu(labels, batch.verdict[i].value, scores[i], t, now)
                    continue
                gap_s = (t - gpu.ts_ns) / 1e9
                if 0 < gap_s <= MAX_GAP_S:
                    self._gpu_s[apps[i]] += gap_s
                    if idle_rows[i]:
                        self._idle_s[apps[i]] += gap_s
                if t >= gpu.ts_ns:  # a late row does not overwrite a newer verdict
                    gpu.verdict, gpu.score, gpu.ts_ns, gpu.seen = batch.verdict[i].value, scores[i], t, now

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
        self._gpus = {uuid: g for uuid, g in self._gpus.items() if g.seen >= horizon}
        self._open = {key: o for key, o in self._open.items() if o[1] >= horizon}

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            self._expire()
            gpus = list(self._gpus.values())
            open_findings = [labels for labels, _ in self._open.values()]
            judged, gpu_s, idle_s = dict(self._judged), dict(self._gpu_s), dict(self._idle_s)
        verdict = GaugeMetricFamily(
            "hermeneut_gpu_verdict",
            "1 for the latest verdict of the GPU, 0 for the others.",
            labels=[*GPU_LABELS, "verdict"],
        )
        score = GaugeMetricFamily("hermeneut_gpu_score", "The GPU's latest score against its baseline.",
                                  labels=GPU_LABELS)  # fmt: skip
        for g in gpus:
            for v in VERDICTS:
                verdict.add_metric([*g.labels, v], 1.0 if g.verdict == v else 0.0)
            if not np.isnan(g.score):
                score.add_metric(list(g.labels), g.score)
        opened = GaugeMetricFamily("hermeneut_finding_open", "1 per open finding (gpu is empty for a node's).",
                                   labels=FINDING_LABELS)  # fmt: skip
        for labels in sorted(open_findings):
            opened.add_metric(list(labels), 1.0)
        samples = CounterMetricFamily("hermeneut_processor_verdicts", "Samples judged, by verdict.", labels=["verdict"])
        for v in VERDICTS:
            samples.add_metric([v], float(judged.get(v, 0)))
        seen = CounterMetricFamily("hermeneut_gpu_seconds", "GPU time seen, per application.", labels=["application"])
        wasted = CounterMetricFamily(
            "hermeneut_gpu_idle_seconds", "GPU time held by a job but idle (< 5% utilization), per application.",
            labels=["application"],
        )  # fmt: skip
        for app in sorted(gpu_s):
            seen.add_metric([app], gpu_s[app])
            wasted.add_metric([app], idle_s.get(app, 0.0))
        yield from (verdict, score, opened, samples, seen, wasted)
