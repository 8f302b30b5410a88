"""What a stored sample costs InfluxDB, in field values: the fields per ``gpu`` point by kind (the steady state:
each GPU's first point, which carries everything, left out), and what the lines would be if the moving readings
were written on change as the states are (bench/pipeline.py reports both)."""

from __future__ import annotations

import re
from typing import Final

from pipeline.events import METRIC_FIELDS, RELATIVE_OF
from sinks.influxdb.lines import INFO_REFRESH_NS
from sinks.influxdb.schema import GPU

_SPECS: Final = {f.name: f for f in METRIC_FIELDS}
_BUDGET: Final = (
    "moving readings", "states and counters", "relative values", "verdict, score, job id",
    "interpretation (phase, baseline, user, source)", "explanation, drivers", "other",
)  # fmt: skip


def _kind(field: str) -> str:
    spec = _SPECS.get(field)
    if spec is not None:
        return "states and counters" if spec.state else "moving readings"
    if field in RELATIVE_OF:
        return "relative values"
    if field in ("verdict", "score", "job_id"):
        return "verdict, score, job id"
    if field in ("phase", "baseline", "user", "app_source", "app_confidence"):
        return "interpretation (phase, baseline, user, source)"
    return "explanation, drivers" if field in ("explanation", "drivers") else "other"


#: a field of a line: its name and its value (a string in quotes may hold commas and escaped quotes)
_FIELD: Final = re.compile(r'([^=,]+)=("(?:[^"\\]|\\.)*"|[^,]*)')


def _parts(line: str) -> tuple[str, str, str]:
    """A line's series key (measurement and tags; a tag's spaces are escaped), its fields and its timestamp."""
    head, rest = re.split(r"(?<!\\) ", line, maxsplit=1)
    fields, ts = rest.rsplit(" ", 1)
    return head, fields, ts


def field_budget(lines: list[str]) -> dict[str, float]:
    """Fields per sample of the ``gpu`` points by kind (each GPU's first point, which carries everything, left
    out: the steady state)."""
    counts = dict.fromkeys(_BUDGET, 0)
    seen: set[str] = set()
    samples = 0
    for line in lines:
        head, fields, _ = _parts(line)
        if not head.startswith(f"{GPU},"):
            continue
        if head not in seen:
            seen.add(head)
            continue
        samples += 1
        for m in _FIELD.finditer(fields):
            counts[_kind(m.group(1))] += 1
    return {kind: n / max(samples, 1) for kind, n in counts.items()}


def fields_in(line: str) -> int:
    """Field values in a line."""
    return len(_FIELD.findall(_parts(line)[1]))


#: the readings the sink writes with every sample (neither a limit of ``gpu_info`` nor a state written on change)
MOVING: Final = tuple(f.name for f in METRIC_FIELDS if not f.limit and not f.state)


def on_change(lines: list[str]) -> list[str]:
    """``lines`` as they would be if the moving readings were written on change, as the states are: in each
    ``gpu`` line, a moving reading equal to its series' previous value is left out, except at the series' first
    point of a 10-minute refresh period. Other measurements' lines as they are."""
    last: dict[tuple[str, str], str] = {}
    period_of: dict[str, int] = {}
    moving = frozenset(MOVING)
    out: list[str] = []
    for line in lines:
        series, fields, ts = _parts(line)
        if series.split(",", 1)[0] != GPU:
            out.append(line)
            continue
        period = int(ts) * 1_000_000 // INFO_REFRESH_NS  # the sink writes milliseconds
        refresh = period_of.get(series) != period
        period_of[series] = period
        kept = []
        for m in _FIELD.finditer(fields):
            name, value = m.group(1), m.group(2)
            if name in moving:
                if not refresh and last.get((series, name)) == value:
                    continue
                last[(series, name)] = value
            kept.append(m.group(0))
        if kept:
            out.append(f"{series} {','.join(kept)} {ts}")
    return out
