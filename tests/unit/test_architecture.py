"""The dependency rule, enforced on every import statement of the shipped packages (function-level ones too):

- the **core** (``pipeline``) imports no stage and no face;
- a **stage** (``producers``, ``processors``, ``sinks``, ``alerting``) imports the core and itself, never another
  stage or the face: stages meet only through Kafka topics and the shared schema;
- the **face** (``hermeneut``: CLI, web, the jobs) may import everything, and nothing imports it but the
  entry point (``pyproject.toml``'s ``hermeneut = "hermeneut.cli:main"``);
- ``bench`` drives the shipped packages and never imports ``tests``.

Drawn by top-level folders, no folder imports one above it. A module named in a string (``python -m <module>``, a
``"module:Class"`` plugin) is an edge too: the core and the stages name no face module anywhere.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("producers", "processors", "sinks", "alerting")
FACE = "hermeneut"


def layer(module: str) -> str:
    """``core``, ``face``, a stage's name, or ``other`` (third-party, the standard library, bench, tests)."""
    top = module.split(".", maxsplit=1)[0]
    if top == FACE:
        return "face"
    if top == "pipeline":
        return "core"
    return top if top in (*STAGES, "bench", "tests") else "other"


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, with its line (``from x import y`` counts as ``x`` and as ``x.y``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return found


def allowed(source: str, target: str) -> bool:
    src, dst = layer(source), layer(target)
    if dst in ("other", src):
        return True
    if src == "face":
        return dst not in ("tests", "bench")
    if src == "core":
        return False
    if src in STAGES:
        return dst == "core"
    if src == "bench":
        return dst != "tests"
    return True  # tests may import anything


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(paths: list[Path]) -> list[str]:
    bad = []
    for path in paths:
        source = module_name(path)
        for line, target in imports(path):
            if not allowed(source, target):
                bad.append(f"{path.relative_to(ROOT)}:{line}: {layer(source)} {source} imports {target}")
    return bad


def shipped_files() -> list[Path]:
    return sorted(p for top in (FACE, "pipeline", *STAGES, "bench") for p in (ROOT / top).rglob("*.py"))


def test_every_import_follows_the_rule() -> None:
    assert violations(shipped_files()) == []


def face_modules_named(path: Path) -> list[str]:
    """String constants in a file that name a module of the face (``"hermeneut.cli"``, ``"hermeneut.web.app:x"``;
    not a topic such as ``"hermeneut.samples.raw"``, which only shares the prefix)."""
    face = {f"{FACE}.{p.stem}" for p in (ROOT / FACE).iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    tree = ast.parse(path.read_text(), str(path))
    named = (n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return [
        f"{path.relative_to(ROOT)}: {s!r}"
        for s in named
        if any(s.split(":")[0] == m or s.startswith(m + ".") for m in face - {f"{FACE}.__init__"})
    ]


def test_the_core_and_the_stages_name_no_face_module_in_a_string() -> None:
    """``python -m <the face's CLI>`` started from the core is an edge no import statement shows; the face passes
    its command line down instead (hermeneut.stages.ENTRY)."""
    below = [p for top in ("pipeline", *STAGES) for p in (ROOT / top).rglob("*.py")]
    assert [hit for path in below for hit in face_modules_named(path)] == []
    assert face_modules_named(ROOT / FACE / "stages.py") == [f"{FACE}/stages.py: 'hermeneut.cli'"]


def test_the_entry_point_is_the_face() -> None:
    assert 'hermeneut = "hermeneut.cli:main"' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("processors/bad.py", "sinks.influxdb"),
        ("sinks/bad.py", "processors.features"),
        ("producers/bad.py", "hermeneut.cli"),
        ("pipeline/bad.py", "processors.normalize"),
        ("pipeline/bad.py", "hermeneut.jobs.mainjob"),
        ("bench/bad.py", "tests.fakes"),
    ],
)
def test_a_bad_edge_is_caught(tmp_path: Path, source: str, target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself fails on each kind of forbidden edge (written into a throwaway tree shaped like ours)."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    path = tmp_path / source
    path.parent.mkdir(parents=True)
    path.write_text(f"def f() -> None:\n    import {target}\n")
    assert violations([path]) == [f"{source}:2: {layer(module_name(path))} {module_name(path)} imports {target}"]


def test_allowed_edges_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    ok = {
        "hermeneut/x.py": "from processors.normalize import process_raw\nfrom sinks import runner\n",
        "processors/x.py": "from pipeline.events import GpuSample\nimport numpy\nfrom processors import features\n",
        "pipeline/x.py": "from pipeline.codec import encode_record\n",
        "bench/x.py": "from hermeneut.web.app import create_app\n",
    }
    paths = []
    for name, text in ok.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(path)
    assert violations(paths) == []
