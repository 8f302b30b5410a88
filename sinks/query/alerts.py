"""The query layer's alerting part: notification history (measurement ``notification``) as typed rows.

As in the rest of the query layer, user input never reaches Flux unchecked: anything malformed raises
:class:`InvalidQuery` with one line saying what to fix.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, Final

from pipeline.config import Settings
from pipeline.errors import InvalidQuery
from pipeline.notifications import OUTCOMES
from pipeline.vocab import format_duration, parse_duration
from sinks.influxdb.schema import NOTIFICATION
from sinks.query.store import flux_rows

_VALUE = re.compile(r"^[A-Za-z0-9._:/-]{1,200}$")
FORMATS: Final = ("table", "json", "csv")


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Which notifications to list: newest first, at most ``limit``; None filters are not applied."""

    range: str = "24h"
    subscription: str | None = None
    detector: str | None = None
    outcome: str | None = None
    status: str | None = None
    cluster: str | None = None
    dedup_key: str | None = None
    limit: int = 1000

    def validate(self) -> None:
        parse_duration(self.range, "range", error=InvalidQuery)
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise InvalidQuery(f"outcome {self.outcome!r} is not one of {', '.join(OUTCOMES)}")
        if self.status is not None and self.status not in ("firing", "resolved"):
            raise InvalidQuery(f"status {self.status!r} is not firing or resolved")
        for what in ("subscription", "detector", "cluster", "dedup_key"):
            value = getattr(self, what)
            if value is not None and not _VALUE.fullmatch(value):
                raise InvalidQuery(f"{what} {value!r} may only hold letters, digits and . _ : / -")
        if not 1 <= self.limit <= 100_000:
            raise InvalidQuery(f"limit {self.limit} is not between 1 and 100000")

    def flux(self, bucket: str) -> str:
        self.validate()
        conds = [f'r._measurement == "{NOTIFICATION}"']
        for tag in ("subscription", "detector", "outcome", "status", "cluster"):
            value = getattr(self, tag)
            if value is not None:
                conds.append(f'r.{tag} == "{value}"')
        out = (
            f'from(bucket: "{bucket}")\n'
            f"  |> range(start: -{format_duration(parse_duration(self.range))})\n"
            f"  |> filter(fn: (r) => {' and '.join(conds)})\n"
            '  |> pivot(rowKey: ["_time"], columnKey: ["_field"], valueColumn: "_value")\n'
            "  |> group()\n"
        )
        if self.dedup_key is not None:
            out += f'  |> filter(fn: (r) => r.dedup_key == "{self.dedup_key}")\n'
        return out + f'  |> sort(columns: ["_time"], desc: true)\n  |> limit(n: {self.limit})'


@dataclass(frozen=True, slots=True)
class NotificationRow:
    """One history entry: what (alert), who (subscription, owner, receiver), when, and how it went."""

    time: datetime
    cluster: str
    subscription: str
    owner: str
    receiver_kind: str
    receiver: str
    detector: str
    status: str
    outcome: str
    reason: str
    dedup_key: str
    fingerprint: str
    group_key: str
    summary: str
    attempt: int
    http_status: int
    error: str
    latency_ms: float
    delivery_id: str


def _row(r: dict[str, Any]) -> NotificationRow:
    def s(name: str) -> str:
        value = r.get(name)
        return "" if value is None else str(value)

    return NotificationRow(
        r["_time"],
        s("cluster"),
        s("subscription"),
        s("owner"),
        s("receiver_kind"),
        s("receiver"),
        s("detector"),
        s("status"),
        s("outcome"),
        s("reason"),
        s("dedup_key"),
        s("fingerprint"),
        s("group_key"),
        s("summary"),
        int(r.get("attempt") or 0),
        int(r.get("http_status") or 0),
        s("error"),
        float(r.get("latency_ms") or 0.0),
        s("delivery_id"),
    )


def run_history(settings: Settings, query: HistoryQuery) -> list[NotificationRow]:
    """Run a history query against the configured InfluxDB (query errors are raised before connecting)."""
    [rows] = flux_rows(settings, query.flux(settings.influxdb.bucket))
    return [_row(r) for r in rows]


def row_json(row: NotificationRow) -> dict[str, Any]:
    out = asdict(row)
    out["time"] = row.time.isoformat()
    return out


_TABLE_COLUMNS: Final = ("time", "subscription", "receiver", "detector", "status", "outcome", "attempt", "dedup_key")


def format_history(rows: list[NotificationRow], fmt: str) -> str:
    """Rows as ``table`` (fixed width, the main columns), ``json`` (one array) or ``csv`` (every column)."""
    if fmt == "json":
        return json.dumps([row_json(r) for r in rows], indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        out = csv.writer(buf)
        names = [f.name for f in fields(NotificationRow)]
        out.writerow(names)
        for r in rows:
            out.writerow([row_json(r)[n] for n in names])
        return buf.getvalue().rstrip("\n")
    if not rows:
        return "(no notifications in range)"
    cells = [[f"{r.time:%Y-%m-%d %H:%M:%S}", *(str(getattr(r, c)) for c in _TABLE_COLUMNS[1:])] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(_TABLE_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(_TABLE_COLUMNS, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)
