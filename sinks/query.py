"""The query layer: every read of stored telemetry goes through here, so InfluxQL/SQL can be added behind it.

Only Flux for now. User input never reaches Flux unchecked: field and tag names must be identifiers, windows
and ranges Flux durations, functions from a fixed list; anything else raises :class:`InvalidQuery`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from pipeline.config import Settings
from pipeline.errors import InvalidQuery
from sinks.influxdb import MEASUREMENT, InfluxWriter

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DURATION = re.compile(r"^([1-9][0-9]*(ns|us|ms|s|m|h|d|w|mo|y))+$")
FUNCTIONS: Final = ("mean", "max", "min", "median", "count", "sum")


@dataclass(frozen=True, slots=True)
class TrendQuery:
    field: str
    by: str = "gpu_model"
    every: str = "10s"
    range: str = "15m"
    fn: str = "mean"

    def validate(self) -> None:
        if not _IDENT.match(self.field):
            raise InvalidQuery(f"field {self.field!r} is not a field name (letters, digits, underscores)")
        if not _IDENT.match(self.by):
            raise InvalidQuery(f"group-by {self.by!r} is not a tag name (letters, digits, underscores)")
        for what, value in (("window", self.every), ("range", self.range)):
            if not _DURATION.match(value):
                raise InvalidQuery(f"{what} {value!r} is not a duration like 10s, 5m, 1h30m")
        if self.fn not in FUNCTIONS:
            raise InvalidQuery(f"function {self.fn!r} is not one of {', '.join(FUNCTIONS)}")

    def flux(self, bucket: str) -> str:
        self.validate()
        return (
            f'from(bucket: "{bucket}")\n'
            f"  |> range(start: -{self.range})\n"
            f'  |> filter(fn: (r) => r._measurement == "{MEASUREMENT}" and r._field == "{self.field}")\n'
            f'  |> group(columns: ["{self.by}"])\n'
            f"  |> aggregateWindow(every: {self.every}, fn: {self.fn}, createEmpty: false)\n"
            f'  |> keep(columns: ["_time", "_value", "{self.by}"])'
        )


def run_trend(settings: Settings, query: TrendQuery) -> list[dict[str, Any]]:
    """Run a trend query against the configured InfluxDB; rows of (_time, group, _value)."""
    i = settings.influxdb
    assert i.url and i.token, "resolve settings first"
    writer = InfluxWriter(i.url, i.token.get_secret_value(), i.org, i.bucket, i.timeout_s)
    try:
        return writer.query(query.flux(i.bucket))
    finally:
        writer.close()


def format_table(rows: list[dict[str, Any]], by: str, value_name: str) -> str:
    """Rows as a fixed-width text table, sorted by time then group."""
    if not rows:
        return "(no data in range)"
    ordered = sorted(rows, key=lambda r: (r["_time"], str(r.get(by))))
    width = max(len(by), *(len(str(r.get(by))) for r in ordered))
    lines = [f"{'time (UTC)':20} {by:{width}} {value_name:>16}"]
    for r in ordered:
        lines.append(f"{r['_time']:%Y-%m-%d %H:%M:%S} {r.get(by)!s:{width}} {float(r['_value']):>16.2f}")
    return "\n".join(lines)
