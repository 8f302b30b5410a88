"""dcgm-exporter series in Prometheus as an importer (registered as ``prometheus``): the HTTP API, read in chunks.

Every metric the dcgm-exporter mapping knows (``DCGM_FI_DEV_*``, ``DCGM_FI_PROF_*``, the XID and free-memory
fields), optionally narrowed by a label selector (``selector = '{Hostname=~"gpu0[1-4]"}'``), from ``start`` to
``end``:

- by default the samples as Prometheus stored them, with their original timestamps: one instant query per metric
  and chunk of the range vector ``metric[chunk]`` (``/api/v1/query``; the chunks tile the range exactly, a range
  vector being open at its start), so the series' own scrape interval is what the import detects;
- with ``step``, a regular grid: ``last_over_time(metric[step])`` per step through ``/api/v1/query_range``, which
  gives a point only where a sample was taken in the step before it (a plain range query would repeat the last
  value for 5 minutes past the end of a series), chunked to at most 10,000 points per series (the API refuses
  more than 11,000).

The samples of one timestamp across metrics are one scrape of the exporter, mapped like a live scrape
(:mod:`producers.importers.exposition`: identity, MIG, units, the workload labels ``pod``/``namespace``/
``container``/``hpc_job``). One block per chunk of time, in time order. An unreachable server fails ``open``
with one line; a query the server refuses, or an answer that is not the API's JSON, stops the import with one
line. Inside an answer, a series or point that is not what the API returns (a time that is not a number, or outside
1970..2262; a value that is not a number) is a dead letter of its own (``malformed``, naming the metric and the
series); the others are imported (:func:`answer_series`).
"""

from __future__ import annotations

import contextlib
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from pipeline.codec import INT64_MAX
from pipeline.config import Settings
from pipeline.errors import ConfigError, InvalidInput, ServiceError
from pipeline.events import APPLICATIONS
from pipeline.registry import setting, with_options
from pipeline.vocab import parse_duration
from producers.dcgm_exporter import READ_METRICS, PromSample
from producers.importers.exposition import Scrapes
from producers.importers.parse import BadValue, timestamp_ns
from producers.importers.rows import Block, Rejection
from producers.source import check_names

#: points per series in one range query (the API refuses more than 11,000)
MAX_POINTS: Final = 10_000
#: how much of the range one raw (range-vector) query covers
RAW_CHUNK_NS: Final = 3600 * 10**9
_NS: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class PrometheusConfig:
    """The ``prometheus`` importer's settings."""

    url: str = setting("http://127.0.0.1:9090", "The Prometheus server, e.g. http://prometheus:9090.", required=True)
    start: str = setting("", "Start of the range (RFC 3339).", required=True)
    end: str = setting("", "End of the range (RFC 3339).", required=True)
    #: a regular grid instead of the stored samples (Prometheus duration, e.g. 60s); empty: the samples as stored
    step: str = setting("", "A regular grid (e.g. 60s) instead of the samples as stored.")
    #: a label selector every query is narrowed by, e.g. {Hostname="gpu01"}
    selector: str = setting("", 'Narrow every query, e.g. {Hostname=~"gpu0.*"}.')
    cluster: str = "local"
    #: the node of series without a ``Hostname`` label
    node: str = setting("prometheus", "The node of series without a Hostname label.")
    application: str = setting("", "Application of the jobs the labels name.", choices=APPLICATIONS)
    timeout_s: float = 60.0


def _chunks(start_ns: int, end_ns: int, size_ns: int) -> list[tuple[int, int]]:
    return [(t, min(t + size_ns, end_ns)) for t in range(start_ns, end_ns, size_ns)]


def _seconds(ns: int) -> str:
    return f"{ns / _NS:.3f}"


def _selector(metric: str, selector: str) -> str:
    inner = selector.strip().removeprefix("{").removesuffix("}").strip()
    return f'{{__name__="{metric}"{", " + inner if inner else ""}}}'


@dataclass
class PrometheusImporter:
    """Reads the series from a Prometheus server (see module docstring)."""

    config: PrometheusConfig
    scrapes: Scrapes = field(init=False)
    #: queries sent, series and samples read (the summary and the benchmark report them)
    queries: int = 0
    series: int = 0
    samples: int = 0
    name: str = "prometheus"

    Config = PrometheusConfig
    #: what it reads: the help of its ``hermeneut import`` subcommand
    description: ClassVar[str] = (
        "dcgm-exporter series (DCGM_FI_DEV_*, DCGM_FI_PROF_*) from a Prometheus server's HTTP API."
    )

    def __post_init__(self) -> None:
        self.scrapes = Scrapes(self.config.cluster, self.config.node, self.config.application)

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> PrometheusConfig:
        return with_options(PrometheusConfig(cluster=settings.cluster), options, "the prometheus importer")

    @classmethod
    def validate(cls, config: PrometheusConfig) -> None:
        """An http(s) URL, a range that is one, a step that is a duration; nothing is queried."""
        if not config.url.startswith(("http://", "https://")):
            raise ConfigError(f"invalid configuration: --url must be an http:// or https:// URL, got {config.url!r}")
        try:
            start, end = timestamp_ns(config.start), timestamp_ns(config.end)
        except BadValue as exc:
            raise ConfigError(f"invalid configuration: prometheus: --start and --end: {exc}") from None
        if start >= end:
            raise ConfigError("invalid configuration: prometheus: --start must be before --end")
        if config.step:
            try:
                parse_duration(config.step, "--step")
            except InvalidInput as exc:
                raise ConfigError(f"invalid configuration: prometheus: {exc}") from None
        if config.application and config.application not in APPLICATIONS:
            raise ConfigError(
                f"invalid configuration: application {config.application!r} is not one of {', '.join(APPLICATIONS)}"
            )
        if config.selector and not (config.selector.startswith("{") and config.selector.endswith("}")):
            raise ConfigError('invalid configuration: --selector must be a label set like {Hostname="x"}')
        check_names("prometheus", config.cluster, config.node)

    @classmethod
    def from_config(cls, config: PrometheusConfig) -> PrometheusImporter:
        return cls(config)

    def open(self) -> None:
        """The server answers (its build info), or one line saying why not."""
        self._get("/api/v1/status/buildinfo", {})

    def close(self) -> None:
        """Nothing held between queries."""

    def total_rows(self) -> int | None:
        return None  # how many series and samples there are is known once read

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.config.url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.config.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            with contextlib.suppress(ValueError):  # the API's JSON error, when it sent one
                detail = json.loads(detail).get("error", detail)
            raise ServiceError(f"Prometheus at {self.config.url} refused {path}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
            raise ServiceError(f"Prometheus at {self.config.url} did not answer: {exc}") from exc
        self.queries += 1
        if not isinstance(body, dict) or body.get("status") != "success" or not isinstance(body.get("data"), dict):
            error = body.get("error", body) if isinstance(body, dict) else body
            raise ServiceError(f"Prometheus at {self.config.url} refused {path}: {str(error)[:300]}")
        return body["data"]

    def blocks(self) -> Iterator[Block]:
        c = self.config
        start, end = timestamp_ns(c.start), timestamp_ns(c.end)
        step = parse_duration(c.step, "--step") if c.step else 0
        size = step * MAX_POINTS if step else RAW_CHUNK_NS
        for chunk_start, chunk_end in _chunks(start, end, size):
            by_time: dict[int, list[PromSample]] = {}
            label = f"{c.url} {_seconds(chunk_start)}..{_seconds(chunk_end)}"
            rejected: list[Rejection] = []
            for metric in READ_METRICS:
                series, bad = answer_series(self._query(metric, chunk_start, chunk_end, step), metric, label)
                rejected += bad
                for labels, points in series:
                    self.series += 1
                    for t_ns, value in points:
                        by_time.setdefault(t_ns, []).append(PromSample(metric, labels, value, 0))
                        self.samples += 1
            original = label.encode()
            yield Block(self.scrapes.rows(sorted(by_time.items()), label, original), tuple(rejected), label)

    def _query(self, metric: str, start_ns: int, end_ns: int, step_ns: int) -> Any:
        """The API's ``data`` for the series of ``metric`` in ``(start, end]`` (raw) or on the step grid
        ``[start, end)``."""
        selector = _selector(metric, self.config.selector)
        if step_ns:
            step = f"{step_ns // 1_000_000}ms"  # PromQL durations are whole units
            last = max(start_ns, end_ns - 1_000_000)  # the grid points before the chunk's end (the next has it)
            data = self._get(
                "/api/v1/query_range",
                {
                    "query": f"last_over_time({selector}[{step}])",
                    "start": _seconds(start_ns),
                    "end": _seconds(last),
                    "step": step,
                },
            )
        else:
            window = f"{(end_ns - start_ns) // 1_000_000}ms"
            data = self._get("/api/v1/query", {"query": f"{selector}[{window}]", "time": _seconds(end_ns)})
        return data


Series = tuple[dict[str, str], list[tuple[int, float]]]


def answer_series(data: Any, metric: str, origin: str) -> tuple[list[Series], list[Rejection]]:
    """(labels without the name, [(ts_ns, value)]) per series of one answer's ``data``, and a dead letter per
    series or point that is not what the API sends (pure: any JSON value gives an answer, never an exception)."""
    results = data.get("result", []) if isinstance(data, dict) else None
    if not isinstance(results, list):
        return [], [Rejection("malformed", f"{metric}: the answer holds no list of series", origin, _json(data))]
    out: list[Series] = []
    bad: list[Rejection] = []
    for result in results:
        names = result.get("metric") if isinstance(result, dict) else None
        values = result.get("values", []) if isinstance(result, dict) else None
        if (
            not isinstance(names, dict)
            or not isinstance(values, list)
            or not all(isinstance(v, str) for v in names.values())
        ):
            bad.append(
                Rejection(
                    "malformed", f"{metric}: a series without string labels and a list of values", origin, _json(result)
                )
            )
            continue
        labels = {str(k): v for k, v in names.items() if k != "__name__"}
        points = []
        for point in values:
            # values are strings ("0.5", "NaN", "+Inf"); DCGM's blank markers and NaN are dropped by the mapping
            read = _point(point)
            if read is None:
                detail = f"{metric}{_said(labels)}: {str(point)[:80]} is not a [time, value] pair within 1970..2262"
                bad.append(Rejection("malformed", detail, origin, _json(point)))
            else:
                points.append(read)
        out.append((labels, points))
    return out, bad


def _point(point: Any) -> tuple[int, float] | None:
    """A ``[unix seconds, "value"]`` pair as (ts_ns, value); None when it is not one."""
    if not isinstance(point, list) or len(point) != 2 or isinstance(point[0], bool):
        return None
    t, v = point
    try:
        seconds, value = float(t), float(v) if isinstance(v, str) else math.nan
    except (TypeError, ValueError, OverflowError):
        return None
    if not isinstance(v, str) or not 0 <= seconds * 1e9 <= INT64_MAX:
        return None
    return min(round(seconds * 1000) * 1_000_000, INT64_MAX), value


def _said(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v[:40]!r}" for k, v in list(labels.items())[:6]) + "}"


def _json(value: Any) -> bytes:
    return json.dumps(value, default=str)[:10_000].encode()
