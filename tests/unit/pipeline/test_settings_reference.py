"""docs/settings-reference.md is what pipeline.settings_reference generates from the code, and it lists every
setting."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from pipeline.config import Settings
from pipeline.settings_reference import field_comments, reference, rows, sections

PAGE = Path(__file__).resolve().parents[3] / "docs" / "settings-reference.md"


def _is_section(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def test_the_page_is_current() -> None:
    assert PAGE.read_text() == reference(), (
        "docs/settings-reference.md is stale: python -m pipeline.settings_reference > docs/settings-reference.md"
    )


def test_every_setting_has_a_row() -> None:
    leaves = 0
    for _name, model in sections():
        leaves += sum(1 for info in model.model_fields.values() if not _is_section(info.annotation))
    table = [line for line in reference().splitlines() if line.startswith("| `")]
    assert len(table) == leaves > 100
    assert "| `validation.max_age_s` | `HERMENEUT_VALIDATION__MAX_AGE_S` |" in reference()


class _Example(BaseModel):
    plain: int = 1
    #: what it means,
    #: over two lines
    commented: float = Field(default=2.5, ge=0, le=10)
    secret: str | None = None


def test_a_row_has_the_comment_default_and_bounds() -> None:
    assert field_comments(_Example) == {"commented": "what it means, over two lines"}
    got = {row[0]: row for row in rows(_Example, "example.")}
    assert got["example.commented"] == (
        "example.commented",
        "HERMENEUT_EXAMPLE__COMMENTED",
        "float",
        "`2.5`",
        ">= 0, <= 10",
        "what it means, over two lines",
    )
    assert got["example.secret"][2:4] == ("str or unset", "unset")
    assert got["example.plain"][5] == ""


def test_sections_follow_the_settings() -> None:
    names = [name for name, _model in sections()]
    assert names[0] == ""
    assert names[1:] == [n for n, info in Settings.model_fields.items() if _is_section(info.annotation)]
