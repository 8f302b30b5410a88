"""Every third-party package a module imports is declared in pyproject.toml: the shipped packages' in
``[project] dependencies`` (what a wheel installs), ``bench``'s and the tests' there or in the ``dev`` extra. A
package that only arrives as another's dependency (aiohttp came with faust) would vanish from a clean install the
day that other package drops it.

Imports are read from the source (every import statement, function-level ones too) and mapped to the distribution
that provides them in this environment (``importlib.metadata.packages_distributions``). An import inside ``try``
that falls back on ``ImportError`` is optional and not required to be declared. The wheel's own test
(tests/integration/test_packaging.py) imports every module in a clean venv, which catches what this cannot see.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("hermeneut", "pipeline", "producers", "processors", "sinks", "alerting")
FIRST_PARTY = frozenset({*SHIPPED, "bench", "tests"})
#: modules only type checkers know (typeshed's private stubs), imported under ``if TYPE_CHECKING:``
TYPING_ONLY = frozenset({"_typeshed"})


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(pyproject: Path = ROOT / "pyproject.toml") -> tuple[set[str], set[str]]:
    """The runtime dependencies and the dev extra, by normalized distribution name."""
    project = tomllib.loads(pyproject.read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {normalize(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}

    return names(project["dependencies"]), names(project["optional-dependencies"]["dev"])


def _optional(tree: ast.AST) -> set[int]:
    """The ids of import statements inside a ``try`` that handles ImportError (an optional package)."""
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return optional


def top_level_imports(path: Path) -> dict[str, int]:
    """Each top-level module a file imports (absolute, not optional), with the first line it is imported on."""
    found: dict[str, int] = {}
    tree = ast.parse(path.read_text(), str(path))
    optional = _optional(tree)
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            found.setdefault(name.split(".", 1)[0], node.lineno)
    return found


def undeclared(paths: list[Path], allowed: set[str], providers: dict[str, list[str]]) -> list[str]:
    """``file:line: imports <module> (<distribution>)`` for each third-party import no allowed distribution provides."""
    bad = []
    for path in paths:
        for module, line in top_level_imports(path).items():
            if module in sys.stdlib_module_names or module in FIRST_PARTY or module in TYPING_ONLY:
                continue
            dists = {normalize(d) for d in providers.get(module, [])}
            if not dists & allowed:
                what = ", ".join(sorted(dists)) or "not installed"
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {module} ({what}), not declared")
    return bad


def files(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py"))


def test_the_shipped_packages_import_only_runtime_dependencies() -> None:
    runtime, _dev = declared()
    assert undeclared(files(*SHIPPED), runtime, metadata.packages_distributions()) == []


def test_benchmarks_and_tests_import_only_declared_packages() -> None:
    runtime, dev = declared()
    assert undeclared(files("bench", "tests"), runtime | dev, metadata.packages_distributions()) == []


@pytest.mark.parametrize(
    ("source", "module", "dist"),
    [
        ("from aiohttp import web\n", "aiohttp", "aiohttp"),
        ("def f() -> None:\n    import yaml.representer\n", "yaml", "pyyaml"),
        ("import somewhere_else as x\n", "somewhere_else", "not installed"),
        ("try:\n    import yaml\nexcept KeyError:\n    yaml = None\n", "yaml", "pyyaml"),
    ],
)
def test_an_undeclared_import_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, module: str,
                                        dist: str) -> None:  # fmt: skip
    """The check fails on a package nobody declared, whether installed (by another's dependency) or not."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    path = tmp_path / "pipeline" / "bad.py"
    path.parent.mkdir()
    path.write_text(source)
    providers = {"aiohttp": ["aiohttp"], "yaml": ["PyYAML"]}
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "import" in text)
    assert undeclared([path], {"numpy"}, providers) == [
        f"pipeline/bad.py:{line}: imports {module} ({dist}), not declared"
    ]
    declared_too = undeclared([path], {"numpy", "aiohttp", "pyyaml"}, providers)
    assert declared_too == (
        [] if dist != "not installed" else [f"pipeline/bad.py:1: imports {module} ({dist}), not declared"]
    )


def test_an_optional_import_need_not_be_declared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    path = tmp_path / "bench" / "x.py"
    path.parent.mkdir()
    path.write_text("try:\n    import lz4.frame\nexcept ImportError:\n    import cramjam\n")
    assert undeclared([path], {"cramjam"}, {"cramjam": ["cramjam"]}) == []
    assert undeclared([path], set(), {"cramjam": ["cramjam"]}) == [
        "bench/x.py:4: imports cramjam (cramjam), not declared"
    ]
