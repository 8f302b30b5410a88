"""Query results as text: an aligned table for people, JSON and CSV for programs (the one formatter module).

Every result of the query layer turns itself into one or more :class:`Table` s; :func:`render` writes them.
Times are ISO 8601 UTC strings in every format; JSON keeps numbers as numbers and missing values as null;
CSV has one header line and parses back with :mod:`csv`. Notes (which backend and bucket answered, what was
approximated) go into JSON, and are printed under a text table; the CLI sends them to stderr for CSV.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from pipeline.errors import InvalidQuery

Cell = str | float | int | None
FORMATS: Final = ("table", "json", "csv")


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Cell, ...], ...]
    notes: tuple[str, ...] = ()

    def records(self) -> list[dict[str, Cell]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


def iso(ns: int) -> str:
    """Epoch nanoseconds as ``2025-01-31T12:00:00Z`` (milliseconds shown when not whole seconds)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{rest // 1_000_000:03d}Z" if rest >= 1_000_000 else f"{text}Z"


def _text(cell: Cell) -> str:
    if cell is None:
        return "-"
    if isinstance(cell, float):
        if math.isnan(cell):
            return "-"
        if cell != 0 and (abs(cell) >= 1e7 or abs(cell) < 1e-3):
            return f"{cell:.4g}"
        return f"{cell:.4f}".rstrip("0").rstrip(".")
    return str(cell)


def _aligned(table: Table) -> str:
    cells = [[_text(c) for c in row] for row in table.rows]
    widths = [max(len(col), *(len(r[i]) for r in cells)) if cells else len(col) for i, col in enumerate(table.columns)]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in table.rows) for i in range(len(widths))]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  ".join(parts).rstrip()

    out = [table.title, line(list(table.columns)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells] if cells else ["(no data in range)"]
    out += [f"note: {n}" for n in table.notes]
    return "\n".join(out)


def _json_cell(cell: Cell) -> Cell:
    return None if isinstance(cell, float) and not math.isfinite(cell) else cell


def render(tables: list[Table], fmt: str) -> str:
    """The tables in ``fmt`` (table, json or csv); CSV holds exactly one table."""
    if fmt == "table":
        return "\n\n".join(_aligned(t) for t in tables)
    if fmt == "json":
        docs = [
            {
                "title": t.title,
                "columns": list(t.columns),
                "rows": [{k: _json_cell(v) for k, v in r.items()} for r in t.records()],
                "notes": list(t.notes),
            }
            for t in tables
        ]
        return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, allow_nan=False)
    if fmt == "csv":
        if len(tables) != 1:
            raise InvalidQuery(f"CSV holds one table and this result has {len(tables)}: choose one part")
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(tables[0].columns)
        for row in tables[0].rows:
            writer.writerow(["" if c is None else repr(c) if isinstance(c, float) else c for c in row])
        return buf.getvalue().rstrip("\n")
    raise InvalidQuery(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
