"""The one table of finding kinds (pipeline/kinds.py): every name once, every fault class with a health rule, an
evaluation window and a simulator injector, and every kind a detector or the scorer sends has a row."""

from __future__ import annotations

import ast
from pathlib import Path

from pipeline import kinds
from pipeline.kinds import BY_NAME, FAULTS, KINDS, RULES, Thing
from producers.simulator.faults import INJECTORS

ROOT = Path(__file__).resolve().parents[3]


def _constants(names: list[str] | set[str]) -> set[str]:
    """The finding names among pipeline.kinds' public upper-case constants (not the table's enums)."""
    values = (getattr(kinds, n, None) for n in names if n.isupper() and not n.startswith("_"))
    return {v for v in values if type(v) is str}


def test_every_name_is_one_row() -> None:
    assert len(BY_NAME) == len(KINDS)
    assert _constants(dir(kinds)) == set(BY_NAME)  # every row's name has its constant, and every constant its row


def test_a_fault_class_has_a_rule_a_window_and_an_injector() -> None:
    for fault in FAULTS:
        kind = BY_NAME[fault]
        assert kind.thing is Thing.FAULT and fault in RULES and kind.min_visible_s > 0, fault
    assert set(INJECTORS) == set(FAULTS)
    assert all(start.__name__ == "_start_" + fault.replace("-", "_") for fault, start in INJECTORS.items())


def test_what_a_kind_points_at_is_a_kind() -> None:
    for kind in KINDS:
        assert set(kind.also_shows) <= set(BY_NAME), kind.name


def _finding_kinds_named(path: Path) -> set[str]:
    """The pipeline.kinds constants a module imports (how a detector names what it finds)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module == "pipeline.kinds":
            out |= {a.name for a in node.names}
    return out


def test_every_detector_family_names_its_findings_from_the_table() -> None:
    """Each detector family (a module of processors/detectors, and the baselines' scorer) takes the names of its
    findings from pipeline.kinds, and every finding a simulated run produces is a row (test_fleeteval runs one)."""
    families = [*(ROOT / "processors" / "detectors").glob("*.py"), ROOT / "processors" / "baselines" / "score.py"]
    named = _constants({name for path in families for name in _finding_kinds_named(path)})
    assert named == set(BY_NAME)
