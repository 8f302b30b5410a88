"""Self-metrics of a stage written to a JSON file (atomically), read by the main job, tests and benchmarks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_stats(path: Path | None, values: dict[str, Any]) -> None:
    """Replace ``path`` with ``values`` as JSON, so a reader never sees half a file; no-op without a path."""
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(values))
    tmp.replace(path)
