"""The query layer: every read of stored telemetry goes through here, and only here is Flux/InfluxQL built.

Questions in, typed rows out::

    with Store.from_settings(settings) as store:
        result = trend(store, TrendQuery("power_watts", by="node", every="1m", range="2h", fn="p95"))
        print(render(result.tables(), "table"))

Layout: ``model`` (validated questions and the plans backends run; pure), ``flux`` / ``influxql`` (one
backend each: plan -> query text, pure, plus the call), ``store`` (the connection, the :class:`Backend`
seam, the per-plan choice of backend and bucket), ``scope`` (shared steps: scope filters, job extents,
baseline bands, rollup mapping), one module per kind of question (``trend``, ``rank``, ``compare``,
``anomalies``, ``jobs``) and ``output`` (table / JSON / CSV). Malformed questions raise
:class:`~pipeline.errors.InvalidQuery` (one line) before anything is sent; an unreachable or failing InfluxDB
raises :class:`~pipeline.errors.ServiceError`.

New kinds of reads (training features, alert history, right-sizing statistics) go in a module of their own
here, built on :class:`Store` and the plans, and are re-exported below.
"""

from __future__ import annotations

from pipeline.config import Settings
from sinks.query.anomalies import AnomalyHistory, FindingRow, VerdictWindow, anomalies
from sinks.query.compare import JobComparison, JobFeature, ModelComparison, ModelFeature, compare_job, compare_models
from sinks.query.jobs import JobSummaries, JobSummary, job_summaries
from sinks.query.model import (
    BACKENDS,
    COMPARE_FEATURES,
    FUNCTIONS,
    GROUP_TAGS,
    NUMERIC_FIELDS,
    TOP_KINDS,
    AnomalyQuery,
    CompareJobQuery,
    CompareModelsQuery,
    JobsQuery,
    Scope,
    TopQuery,
    TrendQuery,
)
from sinks.query.output import FORMATS, Table, render
from sinks.query.rank import TopResult, TopRow, top
from sinks.query.scope import Band
from sinks.query.store import Backend, Buckets, Policy, Store
from sinks.query.trend import TrendResult, TrendRow, trend

__all__ = [
    "BACKENDS",
    "COMPARE_FEATURES",
    "FORMATS",
    "FUNCTIONS",
    "GROUP_TAGS",
    "NUMERIC_FIELDS",
    "TOP_KINDS",
    "AnomalyHistory",
    "AnomalyQuery",
    "Backend",
    "Band",
    "Buckets",
    "CompareJobQuery",
    "CompareModelsQuery",
    "FindingRow",
    "JobComparison",
    "JobFeature",
    "JobSummaries",
    "JobSummary",
    "JobsQuery",
    "ModelComparison",
    "ModelFeature",
    "Policy",
    "Scope",
    "Store",
    "Table",
    "TopQuery",
    "TopResult",
    "TopRow",
    "TrendQuery",
    "TrendResult",
    "TrendRow",
    "VerdictWindow",
    "anomalies",
    "compare_job",
    "compare_models",
    "format_table",
    "job_summaries",
    "render",
    "run_trend",
    "top",
    "trend",
]


def run_trend(settings: Settings, query: TrendQuery) -> TrendResult:
    """One trend against the configured InfluxDB (a connection for just this question)."""
    with Store.from_settings(settings) as store:
        return trend(store, query)


def format_table(result: TrendResult) -> str:
    """A trend as an aligned text table."""
    return render(result.tables(), "table")
