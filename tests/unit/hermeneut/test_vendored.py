"""The vendored chart library is the file its README names: every file listed with a sum has that sum, the page
loads it, and an installed package carries it."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
STATIC = ROOT / "hermeneut" / "web" / "static"
VENDOR = STATIC / "vendor" / "uplot"


def test_each_vendored_file_has_the_sum_its_readme_gives() -> None:
    sums = dict(re.findall(r"^- `([^`]+)` `([0-9a-f]{64})`$", (VENDOR / "README.md").read_text(), re.M))
    assert set(sums) == {"uPlot.iife.min.js", "uPlot.min.css"}, sums
    for name, digest in sums.items():
        assert hashlib.sha256((VENDOR / name).read_bytes()).hexdigest() == digest, name
    assert "MIT License" in (VENDOR / "LICENSE").read_text()


def test_the_page_loads_it_and_the_package_ships_it() -> None:
    page = (STATIC / "index.html").read_text()
    assert '/static/vendor/uplot/uPlot.iife.min.js"' in page and '/static/vendor/uplot/uPlot.min.css"' in page
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["hermeneut.web"]
    assert "static/vendor/uplot/*" in data
