"""The InfluxQL backend: plans as InfluxQL (pure functions), run on InfluxDB 2.x's v1-compatible ``/query``.

InfluxDB 2.x answers InfluxQL for a bucket once a DBRP mapping names it as a database (``ensure_dbrp``; the
database is the bucket's name, retention policy ``autogen``). InfluxDB 3 speaks the same InfluxQL, so this
backend is also the way there. A condition on a field (``job_id = 'x'``) is evaluated in the storage scan,
which is why per-job queries are tens of times faster here than in Flux (docs/queries.md has the numbers).

``percentile(f, N)`` is InfluxQL's nearest rank: the value of rank floor(n*N/100 + 0.5). ``median`` averages
the two middle values, ``stddev`` is the sample standard deviation (as Flux).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final
from urllib.parse import urlencode

import urllib3

from pipeline.errors import ServiceError
from pipeline.vocab import format_duration
from sinks.influxdb.schema import TAGS
from sinks.query.model import (
    QUANTILES,
    Aggregate,
    AggRow,
    Expr,
    FieldEquals,
    Filter,
    PointRow,
    Points,
    TagIn,
    TimeRange,
    ValueBelow,
    ValueNotIn,
)

log = logging.getLogger(__name__)
NAME: Final = "influxql"


def ident(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _call(expr: Expr, field: str) -> str:
    f = ident(field)
    if expr.fn in QUANTILES:
        return f"percentile({f}, {QUANTILES[expr.fn]})"
    return f"{expr.fn}({f})"


def _where(tr: TimeRange, filters: tuple[Filter, ...], value_field: str | None) -> str:
    parts = [f"time >= {tr.start_ns} AND time < {tr.stop_ns}"]
    for f in filters:
        if isinstance(f, TagIn):
            parts.append("(" + " OR ".join(f"{ident(f.key)} = {string(v)}" for v in f.values) + ")")
        elif isinstance(f, FieldEquals):
            parts.append(f"{ident(f.field)} = {string(f.value)}")
        elif isinstance(f, ValueBelow):
            assert value_field is not None, "a value condition needs the field it applies to"
            parts.append(f"{ident(value_field)} < {float(f.limit)!r}")
        elif isinstance(f, ValueNotIn):
            assert value_field is not None, "a value condition needs the field it applies to"
            parts += [f"{ident(value_field)} != {float(v)!r}" for v in f.values]
    return " AND ".join(parts)


def aggregate_influxql(agg: Aggregate) -> str:
    """One SELECT for the whole plan (every expression shares the WHERE clause)."""
    fields = {e.field for e in agg.exprs}
    value_field = next(iter(fields)) if len(fields) == 1 else None
    select = ", ".join(f"{_call(e, e.field)} AS {ident(f'e{i}')}" for i, e in enumerate(agg.exprs))
    group = [f"time({format_duration(agg.window_ns)})"] if agg.window_ns is not None else []
    group += [ident(t) for t in agg.group_by]
    q = f"SELECT {select} FROM {ident(agg.measurement)} WHERE {_where(agg.range, agg.filters, value_field)}"
    if group:
        q += " GROUP BY " + ", ".join(group)
    if agg.window_ns is not None:
        q += " fill(none)"
    return q


def points_influxql(q: Points, tags: tuple[str, ...]) -> str:
    columns = [ident(f) for f in q.fields] + [f"{ident(t)}::tag" for t in tags]
    return (
        f"SELECT {', '.join(columns)} FROM {ident(q.measurement)} WHERE {_where(q.range, q.filters, None)} "
        f"ORDER BY time DESC LIMIT {int(q.limit)}"
    )


def _number(v: Any) -> float | None:
    # first/last of a string field (job_id) are asked for their time, not their value
    return float(v) if isinstance(v, int | float) else None


class InfluxQLBackend:
    """Runs plans as InfluxQL through ``/query?db=<bucket>``."""

    name = NAME

    def __init__(self, url: str, token: str, org: str, timeout_s: float) -> None:
        self._url, self._org = url.rstrip("/"), org
        self._headers = {"Authorization": f"Token {token}", "Accept": "application/json"}
        self._http = urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout_s), retries=False)
        self._mapped: set[str] = set()

    def unsupported(self, agg: Aggregate) -> str | None:
        if any(e.fn in ("first", "last") for e in agg.exprs) and len(agg.exprs) > 1:
            return "InfluxQL returns one time per row: first/last only alone"
        if agg.scales:
            return "relative values are a reading over the GPU's limit per point, which only Flux computes"
        return None

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        resp = self._http.request(
            method,
            f"{self._url}{path}",
            body=None if body is None else json.dumps(body).encode(),
            headers=self._headers | {"Content-Type": "application/json"},
        )
        if resp.status >= 300:
            raise ServiceError(
                f"HTTP {resp.status} from {path.split('?', maxsplit=1)[0]}: {resp.data[:200].decode(errors='replace')}"
            )
        return json.loads(resp.data or b"{}")

    def ensure_dbrp(self, bucket: str) -> bool:
        """Map ``bucket`` as database ``bucket`` (idempotent); False when it cannot be (no such bucket, or a
        token that may not create mappings)."""
        if bucket in self._mapped:
            return True
        try:
            found = self._api("GET", "/api/v2/buckets?" + urlencode({"name": bucket, "org": self._org}))["buckets"]
            if not found:
                return False
            org_id, bucket_id = found[0]["orgID"], found[0]["id"]
            existing = self._api("GET", "/api/v2/dbrps?" + urlencode({"orgID": org_id, "db": bucket}))
            if not existing.get("content"):
                mapping = {"orgID": org_id, "bucketID": bucket_id, "database": bucket, "retention_policy": "autogen"}
                self._api("POST", "/api/v2/dbrps", mapping | {"default": True})
        except (ServiceError, urllib3.exceptions.HTTPError, OSError, KeyError, ValueError) as exc:
            log.warning("cannot map bucket %s for InfluxQL (%s): Flux will answer instead", bucket, exc)
            return False
        self._mapped.add(bucket)
        return True

    def _query(self, db: str, q: str) -> list[dict[str, Any]]:
        url = f"{self._url}/query?" + urlencode({"db": db, "q": q, "epoch": "ns"})
        try:
            resp = self._http.request("GET", url, headers=self._headers)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ServiceError(f"InfluxDB at {self._url} did not answer: {type(exc).__name__}") from exc
        try:
            body = json.loads(resp.data or b"{}")
        except ValueError:
            body = {}
        if resp.status != 200:
            message = body.get("error") or body.get("message") or resp.data[:200].decode(errors="replace")
            raise ServiceError(f"InfluxDB refused the query (HTTP {resp.status}): {message}")
        results = body.get("results") or [{}]
        if "error" in results[0]:
            raise ServiceError(f"InfluxDB could not run the query: {results[0]['error']}")
        series: list[dict[str, Any]] = results[0].get("series", [])
        return series

    def aggregate(self, agg: Aggregate) -> list[AggRow]:
        rows = []
        for s in self._query(agg.bucket, aggregate_influxql(agg)):
            got = s.get("tags") or {}
            tags = tuple((k, str(got.get(k, ""))) for k in agg.group_by)
            cols = s["columns"]
            at = [cols.index(f"e{i}") for i in range(len(agg.exprs))]
            for v in s.get("values", []):
                rows.append(AggRow(agg.row_time(int(v[0])), tags, tuple(_number(v[i]) for i in at)))
        return rows

    def points(self, q: Points) -> list[PointRow]:
        tags = TAGS[q.measurement]
        out = []
        for s in self._query(q.bucket, points_influxql(q, tags)):
            cols = s["columns"]
            for v in s.get("values", []):
                rec = dict(zip(cols, v, strict=True))
                out.append(
                    PointRow(
                        int(rec["time"]),
                        tuple(sorted((t, str(rec[t])) for t in tags if rec.get(t) not in (None, ""))),
                        tuple((f, rec.get(f)) for f in q.fields),
                    )
                )
        return out

    def close(self) -> None:
        self._http.clear()
