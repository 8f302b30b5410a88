"""The docs say what the code is: every module path and every function on "one sample's path" in
docs/architecture.md exists, and every relative link of the README and docs/ points at a file that exists.

A page that names a function which was renamed (``encoded_parts``, gone since the take writer) sends a newcomer
looking for something that is not there; this keeps the guide and the code in step."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PACKAGES = ("hermeneut", "pipeline", "producers", "processors", "sinks", "alerting")


@cache
def defined_names() -> frozenset[str]:
    """Every function, class and ``Class.method`` defined in the packages."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    names.add(node.name)
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                            names.add(f"{node.name}.{item.name}")
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(node.name)
    return frozenset(names)


def sample_path_names(text: str) -> list[str]:
    """The code names in the "One sample's path" drawing: the words between arrows, without the bracketed topics
    and the parenthesised notes."""
    block = text.split("## One sample's path", 1)[1].split("```", 2)[1]
    block = re.sub(r"\[[^\]]*\]|\([^)]*\)", " ", block)
    words = re.findall(r"[A-Za-z_][\w.]*", block)
    return [w for w in words if "_" in w or "." in w or (w[0].isupper() and not w.isupper())]


def test_every_function_on_the_sample_path_exists() -> None:
    names = sample_path_names(ARCHITECTURE.read_text())
    assert len(names) > 20, names
    missing = [n for n in names if n not in defined_names()]
    assert not missing, f"docs/architecture.md names what the code does not define: {missing}"


def test_the_check_catches_a_name_that_is_gone() -> None:
    text = "## One sample's path\n\n```\nNodeAgent.run -> encoded_parts -> encode_interpreted\n```\n"
    names = sample_path_names(text)
    assert names == ["NodeAgent.run", "encoded_parts", "encode_interpreted"]
    assert [n for n in names if n not in defined_names()] == ["encoded_parts"]


def test_every_module_path_in_architecture_exists() -> None:
    paths = re.findall(r"`((?:pipeline|producers|processors|sinks|tests)/[\w/.]*)`", ARCHITECTURE.read_text())
    assert paths
    assert [p for p in paths if not (ROOT / p).exists()] == []


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_point_at_files(page: Path) -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert [link for link in local if not (page.parent / link).exists()] == []
