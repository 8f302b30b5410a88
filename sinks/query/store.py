"""Where queries run: one InfluxDB connection, its buckets, and the choice of backend and bucket per plan.

:class:`Backend` is the seam: Flux (:mod:`sinks.query.flux`) and InfluxQL (:mod:`sinks.query.influxql`)
implement it now; an InfluxDB 3 SQL backend would implement the same three methods. :meth:`Store.choose`
picks per plan, from measurements on this box (docs/queries.md).

Buckets: ``<bucket>`` holds raw samples (short retention), ``<bucket>_1m`` the 1-minute rollups and
``<bucket>_jobs`` the job summaries (:mod:`sinks.retention` creates them). :meth:`Store.source` says which a
question reads: the rollups when its range is longer than ``storage.rollup_after_days`` or starts before the
raw retention, when the rollups exist and can answer it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol, TypeVar

import urllib3
from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.rest import ApiException

from pipeline.catalogue import lookup
from pipeline.config import Settings
from pipeline.errors import InvalidQuery, ServiceError
from pipeline.events import RELATIVE_OF
from pipeline.vocab import format_duration
from sinks.influxdb.lines import INFO_REFRESH_NS
from sinks.influxdb.schema import GPU, GPU_INFO, TAGS
from sinks.query.flux import FluxBackend
from sinks.query.influxql import InfluxQLBackend
from sinks.query.model import NS, Aggregate, AggRow, FieldEquals, PointRow, Points, Scale, TagIn, TimeRange

T = TypeVar("T")
DAY_NS: Final = 86400 * NS
MINUTE_NS: Final = 60 * NS
#: a ``gpu_info`` field every GPU with stored samples has (the interval its samples stand for): a GPU whose limit
#: was never reported still shows up with its model
INTERVAL_FIELD: Final = "sample_interval_seconds"


class Backend(Protocol):
    """A query language the plans can be run in."""

    name: str

    def unsupported(self, agg: Aggregate) -> str | None:
        """Why the plan cannot run here (one line), or None."""

    def aggregate(self, agg: Aggregate) -> list[AggRow]: ...

    def points(self, q: Points) -> list[PointRow]: ...


@dataclass(frozen=True, slots=True)
class Buckets:
    raw: str
    rollup: str
    jobs: str

    @classmethod
    def of(cls, bucket: str) -> Buckets:
        return cls(bucket, f"{bucket}_1m", f"{bucket}_jobs")


@dataclass(frozen=True, slots=True)
class Policy:
    """What the queries need to know about storage: retention of raw data, when to read rollups, and how
    long one sample stands for (GPU-hours are counted in samples)."""

    raw_retention_ns: int = 7 * DAY_NS
    rollup_after_ns: int = 2 * DAY_NS
    sample_interval_s: float = 1.0


#: aggregates Flux pushes into the storage read when grouped over the whole range (no windows)
PUSHED_DOWN: Final = frozenset({"mean", "max", "min", "count", "sum", "first", "last"})


def prefers_influxql(agg: Aggregate) -> bool:
    """The measured rule (docs/queries.md): Flux only where it pushes the work into storage, a grouped
    aggregate over the whole range (2-3x faster than InfluxQL there, value conditions included); InfluxQL for
    everything else: windows (min/max 30x faster), order statistics (3-7x), conditions on another field of
    the point such as a job id (30x)."""
    pushed = agg.window_ns is None and all(e.fn in PUSHED_DOWN for e in agg.exprs)
    joins = any(isinstance(f, FieldEquals) for f in agg.filters)
    return not (pushed and not joins)


class Store:
    """The query layer's connection to one InfluxDB org; thread-safe (the web API shares one)."""

    def __init__(
        self, url: str, token: str, org: str, bucket: str, timeout_s: float = 30.0, policy: Policy | None = None
    ) -> None:
        self.url, self.org = url, org
        self.buckets = Buckets.of(bucket)
        self.policy = policy or Policy()
        self.client = InfluxDBClient(url=url, token=token, org=org, timeout=int(timeout_s * 1000), retries=False)
        self.flux = FluxBackend(self.client, org)
        self.influxql = InfluxQLBackend(url, token, org, timeout_s)
        self._buckets_seen: dict[str, bool] = {}

    @classmethod
    def from_settings(cls, settings: Settings, timeout_s: float = 30.0) -> Store:
        """For resolved settings (InfluxDB URL and token known); queries wait at least ``timeout_s``."""
        i, s = settings.influxdb, settings.storage
        if not (i.url and i.token):
            raise ServiceError("influxdb.url and influxdb.token are needed to query (resolve the settings first)")
        policy = Policy(
            raw_retention_ns=int(s.raw_retention_days * DAY_NS),
            rollup_after_ns=int(s.rollup_after_days * DAY_NS),
            sample_interval_s=settings.sample_interval_s,
        )
        return cls(i.url, i.token.get_secret_value(), i.org, i.bucket, max(i.timeout_s, timeout_s), policy)

    def close(self) -> None:
        self.influxql.close()
        self.client.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---- choices -------------------------------------------------------------------------------------------

    def choose(self, agg: Aggregate, backend: str = "auto") -> Backend:
        """The backend for a plan: the one asked for, else the measured rule (see module docstring)."""
        chosen: Backend
        if backend == "flux":
            chosen = self.flux
        elif backend == "influxql":
            chosen = self.influxql
        else:
            chosen = self.influxql if prefers_influxql(agg) else self.flux
        why = chosen.unsupported(agg)
        if why is not None:
            if backend != "auto":
                raise InvalidQuery(f"the {backend} backend cannot answer this: {why}")
            chosen = self.flux
        if chosen is self.influxql and not self.influxql.ensure_dbrp(agg.bucket):
            if backend == "influxql":
                raise ServiceError(f"bucket {agg.bucket} cannot be queried with InfluxQL (no DBRP mapping)")
            chosen = self.flux
        return chosen

    def has_bucket(self, name: str) -> bool:
        if name not in self._buckets_seen:
            try:
                found = self.client.buckets_api().find_bucket_by_name(name)  # type: ignore[no-untyped-call]
                self._buckets_seen[name] = found is not None
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                raise ServiceError(f"InfluxDB at {self.url} did not answer: {_reason(exc)}") from exc
        return self._buckets_seen[name]

    def source(self, tr: TimeRange, now_ns: int, rollup_blocker: str | None, rollup_after_ns: int | None = None) -> str:
        """``"raw"`` or ``"1m"`` for a range (see module docstring); ``rollup_blocker`` says why the rollups
        cannot answer this question (None: they can); ``rollup_after_ns``: a question whose raw read grows with
        its range faster than most (one row per GPU and minute) reads the rollups from a shorter range on."""
        too_old = tr.start_ns < now_ns - self.policy.raw_retention_ns
        long = tr.length_ns > (self.policy.rollup_after_ns if rollup_after_ns is None else rollup_after_ns)
        if not (too_old or long):
            return "raw"
        if rollup_blocker is None and self.has_bucket(self.buckets.rollup):
            return "1m"
        if too_old:
            why = rollup_blocker or f"bucket {self.buckets.rollup} does not exist (run `hermeneut storage setup`)"
            raise InvalidQuery(
                f"the range starts before the raw data's retention ({format_duration(self.policy.raw_retention_ns)})"
                f" and the 1-minute rollups cannot answer it: {why}"
            )
        return "raw"

    # ---- running -------------------------------------------------------------------------------------------

    def aggregate(self, agg: Aggregate, backend: str = "auto") -> tuple[list[AggRow], str]:
        """Rows of the plan and the name of the backend that answered."""
        agg = self.with_scales(agg)
        chosen = self.choose(agg, backend)
        return _guard(lambda: chosen.aggregate(agg), self.url), chosen.name

    def with_scales(self, agg: Aggregate) -> Aggregate:
        """The plan with how its relative fields are computed from the raw data: each GPU's limit in force over
        the range, from ``gpu_info`` (written on change and every refresh period, so the refresh period before
        the range holds the limit in force at its start). A GPU whose source never reported the limit (a trace
        with power but no power limit) is divided by its model's catalogue limit, as the enricher judged it."""
        relative = [e.field for e in agg.exprs if e.field in RELATIVE_OF and agg.scale_of(e.field) is None]
        if agg.bucket != self.buckets.raw or agg.measurement != GPU or not relative:
            return agg
        tags = [f for f in agg.filters if isinstance(f, TagIn) and f.key in TAGS[GPU_INFO]]
        scales = []
        for field in dict.fromkeys(relative):
            reading, limit = RELATIVE_OF[field]
            plan = Points(
                agg.bucket,
                GPU_INFO,
                (limit, INTERVAL_FIELD),
                TimeRange(agg.range.start_ns - INFO_REFRESH_NS, agg.range.stop_ns),
                tuple(tags),
                limit=10**7,
            )
            rows, _ = self.points(plan)
            per_gpu: dict[str, list[tuple[int, float]]] = {}
            unreported: dict[str, tuple[int, str]] = {}
            for row in sorted(rows, key=lambda r: r.time_ns):
                value = row.get(limit)
                if isinstance(value, float) and value > 0:
                    segments = per_gpu.setdefault(row.tag("gpu"), [])
                    if not segments or segments[-1][1] != value:
                        segments.append((row.time_ns, value))
                else:
                    unreported.setdefault(row.tag("gpu"), (row.time_ns, row.tag("gpu_model")))
            for gpu, (time_ns, model) in unreported.items():
                spec = lookup(model) if gpu not in per_gpu else None
                if spec is not None and (known := spec.limit_metrics().get(limit)):
                    per_gpu[gpu] = [(time_ns, known)]
            scales.append(Scale(field, reading, tuple((g, tuple(v)) for g, v in sorted(per_gpu.items()))))
        return replace(agg, scales=agg.scales + tuple(scales))

    def points(self, q: Points, backend: str = "auto") -> tuple[list[PointRow], str]:
        chosen: Backend = self.influxql if backend == "influxql" else self.flux
        if chosen is self.influxql and not self.influxql.ensure_dbrp(q.bucket):
            raise ServiceError(f"bucket {q.bucket} cannot be queried with InfluxQL (no DBRP mapping)")
        return _guard(lambda: chosen.points(q), self.url), chosen.name

    def flux_records(self, flux: str) -> list[dict[str, Any]]:
        """Every record of a Flux query, as a dict of its values."""
        return _guard(lambda: self.flux.run(flux), self.url)

    def flux_csv(self, flux: str) -> Iterator[list[str]]:
        """A Flux query's result as CSV cells (header rows included), streamed: for results too large for dicts."""
        return _guard(lambda: self.flux.run_csv(flux), self.url)


def flux_rows(settings: Settings, *fluxes: str, timeout_s: float = 30.0) -> list[list[dict[str, Any]]]:
    """Run Flux queries on one connection (opened and closed here); each query's records, in order."""
    with Store.from_settings(settings, timeout_s) as store:
        return [store.flux_records(flux) for flux in fluxes]


def now_ns() -> int:
    return time.time_ns()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, TypeError):
            message = ""
        return f"HTTP {exc.status}: {message or exc.reason}".splitlines()[0][:300]
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _guard(call: Callable[[], T], url: str) -> T:
    """Database failures as one-line errors: a query InfluxDB rejects is the caller's to fix, an unreachable
    server is a service problem."""
    try:
        result: T = call()
    except ApiException as exc:
        if exc.status in (400, 404):
            raise InvalidQuery(f"InfluxDB rejected the query: {_reason(exc)}") from exc
        raise ServiceError(f"InfluxDB at {url} failed the query: {_reason(exc)}") from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise ServiceError(f"InfluxDB at {url} did not answer: {_reason(exc)}") from exc
    return result
