"""dcgm-exporter readings, from saved scrapes or from Prometheus, as imported rows: one mapping for both.

Each scrape (the samples of one timestamp) goes through :func:`producers.dcgm_exporter.to_batches`, the live
dcgm-exporter source's own mapping (identity from ``UUID``/``gpu``/``Hostname``/``modelName``, MIG instances from
``GPU_I_PROFILE``/``GPU_I_ID``, units, DCGM's blank values, limits from the catalogue, an XID event when
``DCGM_FI_DEV_XID_ERRORS`` changes), and the workload labels dcgm-exporter adds (``pod``, ``namespace``,
``container`` from its Kubernetes mapping, ``hpc_job`` from its HPC job mapping) become the GPU's workload: job
``hpc_job`` or ``<namespace>/<pod>``, tenant the namespace, application as configured (else ``unknown``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.events import GpuEvent, GpuSample, Workload
from producers.dcgm_exporter import PromSample, ScrapeStats, to_batches, workload_labels
from producers.importers.rows import Rows, rows_of


def workload_of(labels: dict[str, str] | None, application: str) -> Workload | None:
    """The workload dcgm-exporter's labels name; None when they name none (no pod, no job: nothing runs)."""
    if not labels:
        return None
    namespace, pod = labels.get("namespace"), labels.get("pod")
    job = labels.get("hpc_job") or (f"{namespace}/{pod}" if namespace and pod else pod)
    if job is None:
        return None
    return Workload(
        application or "unknown",
        job_id=job,
        source="import",
        confidence=1.0 if application else 0.0,
        tenant=namespace,
        framework=None,
    )


@dataclass
class Scrapes:
    """Turns scrapes into rows, remembering each GPU's last XID across them (an event is a change)."""

    cluster: str
    node: str
    application: str = ""
    stats: ScrapeStats = field(default_factory=ScrapeStats)
    last_xid: dict[str, float] = field(default_factory=dict)

    def rows(self, scrapes: Sequence[tuple[int, list[PromSample]]], origin: str, original: bytes) -> Rows:
        """Rows of ``(ts_ns, samples)`` scrapes; every row is from ``origin`` (a file, a query) with ``original``
        as its bytes."""
        samples: list[GpuSample] = []
        workloads: list[Workload | None] = []
        events: list[GpuEvent] = []
        labelled = False
        for ts_ns, scrape in scrapes:
            labels = workload_labels(scrape, self.node)
            labelled |= bool(labels)
            for batch in to_batches(scrape, self.cluster, self.node, ts_ns, self.last_xid, self.stats):
                samples.extend(batch.samples)
                events.extend(batch.events)
                workloads.extend(workload_of(labels.get(s.gpu_uuid), self.application) for s in batch.samples)
        n = len(samples)
        return rows_of(samples, (origin,) * n, (original,) * n, tuple(workloads) if labelled else None, tuple(events))
