"""The InfluxDB schema: every measurement hermeneut writes or reads, with its tags and fields, named once here.

The writers (:mod:`sinks.influxdb.lines`, :mod:`sinks.influxdb.rollup`, :mod:`sinks.retention`) and the readers
(:mod:`sinks.query`) take the names from this module.

Schema (the README has the cardinality budget):

``gpu`` - one point per GPU sample, timestamp in milliseconds.
  tags   ``cluster``, ``node``, ``gpu`` (uuid), ``gpu_index``, ``gpu_model``, ``application`` (when known).
         Together they identify one GPU (application adds at most a handful of series per GPU over a retention
         period). Nothing job-scoped is a tag: job ids and users would multiply series without bound.
  fields every sample: its moving readings (float, units in the name; the ``FieldSpec``s that are neither a
         limit nor a state), ``verdict`` (string), ``score`` (float, when scored), ``job_id`` (when known).
         On change, and at each GPU's first sample of every 10 minutes: the state and counter readings
         (``FieldSpec.state``: P-state, PCIe link, error totals, process count, memory clock) and the
         interpretation: ``phase``, ``baseline`` (the id it was judged against), ``user``, ``app_source`` /
         ``app_confidence`` (who said which application, e.g. ``inferred`` 0.93); a reader fills them forward
         per GPU. A row that is not normal carries ``explanation``, ``drivers``, ``phase`` and ``baseline``
         every time. Relative values (``*_ratio*``) are not stored: they are a reading over a limit of
         ``gpu_info``, divided per point by the query layer (the 1-minute rollups keep them). docs/performance.md
         has the per-sample field budget and how it was measured.
``gpu_info`` - the GPU's limits (``FieldSpec.limit``: memory total, power limit, max clocks, thermal
  thresholds, max PCIe link), same tags but ``application``, written when they change and every 10 minutes.
  Repeating them every second cost InfluxDB a quarter of its per-point work for values that never change.
``gpu_event`` - one point per discrete event (XID, ECC, row remap, GPU lost...): GPU tags plus ``kind`` and
  ``code`` (both bounded); fields ``detail``, ``dedup_key``.
``nic`` - one point per InfiniBand/RoCE port reading: tags ``cluster``, ``node``, ``device``, ``port``.
``nvlink`` - per link (tag ``link``): state, error counters and throughput, written when the state or an error
  counter changes and every 10 minutes (per-GPU NVLink totals are in ``gpu`` every sample).
``gpu_process`` - the processes on a GPU (``count``, ``processes`` as "pid name MiB; ..."), on change and every
  10 minutes.
``finding`` - every detector finding (from the alerts topic): tags ``cluster``, ``node``, ``gpu``, ``detector``,
  ``severity``, ``application`` (when known); fields ``active`` (1/0), ``summary``, ``action``, ``since_ns``,
  ``job_id``, ``maintenance`` (why its node was out of service on purpose, when it was), and the evidence as
  ``ev_<name>``.

``baseline`` - the learned bands, written by ``hermeneut baselines train``: tags ``application``, ``gpu_model``
  (``*`` for priors), ``phase``, ``feature`` (the stored field it describes); fields ``p01`` ``p05`` ``p50``
  ``p95`` ``p99`` (in that field's units), ``n``, ``version``; timestamp = training time.
``feedback`` - operators' verdicts on events (``hermeneut feedback``): tags ``cluster``, ``gpu``,
  ``application``, ``gpu_model``; fields ``verdict``, ``note``, ``user``, ``event_ts_ms``, ``event_id``.
``notification`` - what the alert manager did with each notification (``pipeline.notifications``: every delivery
  attempt and every notification held back), one point per alert per attempt: tags ``cluster``,
  ``receiver_kind`` (webhook/slack/email/kafka, ``-`` for held ones), ``subscription`` (id), ``detector``,
  ``status`` (firing/resolved), ``outcome`` (:data:`pipeline.notifications.OUTCOMES`); fields ``dedup_key``,
  ``fingerprint``, ``attempt``, ``http_status``, ``error``, ``latency_ms``, ``group_key``, ``summary``,
  ``receiver``, ``owner``, ``delivery_id``, ``reason``.

The 1-minute rollups (``<bucket>_1m``, :mod:`sinks.influxdb.rollup`) are ``gpu`` points with the ``gpu`` tags and
``<field>_mean``, ``_max``, ``_min``, ``_count`` of :data:`ROLLUP_FIELDS`; the per-job summaries (``<bucket>_jobs``,
:mod:`sinks.retention`) are ``job`` points with p50/p95/max of :data:`JOB_FIELDS` per 10 minutes.
"""

from __future__ import annotations

from typing import Final

GPU: Final = "gpu"
GPU_INFO: Final = "gpu_info"
GPU_EVENT: Final = "gpu_event"
NIC: Final = "nic"
NVLINK: Final = "nvlink"
GPU_PROCESS: Final = "gpu_process"
FINDING: Final = "finding"
BASELINE: Final = "baseline"
FEEDBACK: Final = "feedback"
NOTIFICATION: Final = "notification"
#: per-job summaries in the jobs bucket (sinks/retention.py)
JOB: Final = "job"
#: the tags of each measurement a query reads
TAGS: Final[dict[str, tuple[str, ...]]] = {
    GPU: ("cluster", "node", "gpu", "gpu_index", "gpu_model", "application"),
    GPU_INFO: ("cluster", "node", "gpu", "gpu_index", "gpu_model"),
    GPU_EVENT: ("cluster", "node", "gpu", "gpu_index", "kind", "code"),
    FINDING: ("cluster", "node", "gpu", "detector", "severity", "application"),
    BASELINE: ("application", "gpu_model", "phase", "feature"),
    JOB: ("job_id", "application", "gpu_model", "cluster"),
    NOTIFICATION: ("cluster", "receiver_kind", "subscription", "detector", "status", "outcome"),
}

#: the fields kept in the 1-minute rollups, each as <field>_mean, _max, _min and _count
ROLLUP_FIELDS: Final = (
    "utilization_gpu_percent",
    "utilization_memory_percent",
    "memory_used_bytes",
    "sm_clock_mhz",
    "temperature_gpu_celsius",
    "temperature_memory_celsius",
    "power_watts",
    "sm_active_percent",
    "tensor_active_percent",
    "dram_active_percent",
    "power_ratio_of_limit",
    "memory_used_ratio",
    "sm_clock_ratio_of_max",
    "temperature_ratio_of_slowdown",
    "score",
)
#: the fields summarized per job (p50/p95/max per 10 minutes) in the jobs bucket
JOB_FIELDS: Final = ("utilization_gpu_percent", "memory_used_bytes", "power_watts")
