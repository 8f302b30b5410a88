"""The InfluxDB 2.x edge: interpreted events -> line protocol (pure), and the only write/query I/O.

Schema (one measurement for now; the README has the cardinality budget):

``gpu`` - one point per GPU sample, timestamp in milliseconds.
  tags   ``cluster``, ``node``, ``gpu`` (uuid), ``gpu_index``, ``gpu_model``, ``application`` (when known).
         Together they identify one GPU (application adds at most a handful of series per GPU over a retention
         period). Nothing job-scoped is a tag: job ids and users would multiply series without bound.
  fields every canonical metric present in the sample (float, units in the name), the relative values
         (``*_ratio*``), ``verdict`` (string), ``score`` (float, when scored), ``job_id`` / ``user`` (strings,
         when known).

A replayed event has the same measurement, tags and timestamp, so InfluxDB overwrites instead of duplicating.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Final, cast

import urllib3
from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.domain.write_precision import WritePrecision
from influxdb_client.rest import ApiException

from pipeline.events import InterpretedBatch, InterpretedEvent

log = logging.getLogger(__name__)

MEASUREMENT: Final = "gpu"
_MS: Final = cast(WritePrecision, WritePrecision.MS)
_TAG_ESCAPES = str.maketrans({",": r"\,", "=": r"\=", " ": r"\ ", "\n": "", "\r": ""})


class TransientWriteError(Exception):
    """The write may succeed later (server down, overloaded, timed out): retry with backoff."""


class PermanentWriteError(Exception):
    """InfluxDB rejected the data itself (HTTP 400/413): retrying the same lines will not help."""


def _tag(value: str) -> str:
    return value.translate(_TAG_ESCAPES)


def _str_field(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def event_line(e: InterpretedEvent) -> str:
    """One event as one line of line protocol (tags in sorted key order, as InfluxDB prefers)."""
    s = e.sample
    tags = [
        ("application", e.workload.application if e.workload else ""),
        ("cluster", s.cluster),
        ("gpu", s.gpu_uuid),
        ("gpu_index", str(s.gpu_index)),
        ("gpu_model", s.gpu_model),
        ("node", s.node),
    ]
    tag_part = ",".join(f"{k}={_tag(v)}" for k, v in tags if v)
    fields = [f"{k}={v!r}" if isinstance(v, float) else f"{k}={v}.0" for k, v in s.metrics.items()]
    fields.extend(f"{k}={v!r}" for k, v in e.relative.items())
    fields.append(f"verdict={_str_field(e.verdict.value)}")
    if e.score is not None:
        fields.append(f"score={float(e.score)!r}")
    if e.workload and e.workload.job_id:
        fields.append(f"job_id={_str_field(e.workload.job_id)}")
    if e.workload and e.workload.user:
        fields.append(f"user={_str_field(e.workload.user)}")
    return f"{MEASUREMENT},{tag_part} {','.join(fields)} {s.ts_ns // 1_000_000}"


def batch_lines(batches: Iterable[InterpretedBatch]) -> list[str]:
    return [event_line(e) for b in batches for e in b.events]


class InfluxWriter:
    """Synchronous writes of prepared lines, with errors sorted into transient and permanent."""

    def __init__(self, url: str, token: str, org: str, bucket: str, timeout_s: float = 10.0) -> None:
        self.bucket, self.org = bucket, org
        self.client = InfluxDBClient(url=url, token=token, org=org, timeout=int(timeout_s * 1000), retries=False)
        self._write = self.client.write_api(write_options=SYNCHRONOUS)

    def write(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            self._write.write(self.bucket, self.org, "\n".join(lines).encode(), write_precision=_MS)
        except ApiException as exc:
            if exc.status in (400, 413):
                raise PermanentWriteError(f"HTTP {exc.status}: {str(exc.body)[:300]}") from exc
            raise TransientWriteError(f"HTTP {exc.status}: {str(exc.body or exc.reason)[:300]}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientWriteError(f"{type(exc).__name__}: {exc}"[:300]) from exc

    def query(self, flux: str) -> list[dict[str, Any]]:
        """Run a Flux query; each record as a dict of its values."""
        tables = self.client.query_api().query(flux, org=self.org)
        return [dict(record.values) for table in tables for record in table.records]

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]
