"""The settings reference (docs/settings-reference.md), generated from :mod:`pipeline.config` itself: every setting
of every section with its environment variable, type, default, bounds and the ``#:`` comment above it, so the page
cannot drift from the code (tests/unit/pipeline/test_settings_reference.py compares the two).

``python -m pipeline.settings_reference > docs/settings-reference.md`` writes it again after a setting changes.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from pipeline.config import ENV_PREFIX, Settings

#: the constraints pydantic keeps in a field's metadata (annotated_types' Ge, Le, MaxLen, ...), by attribute
_BOUNDS = (
    ("ge", ">="),
    ("gt", ">"),
    ("le", "<="),
    ("lt", "<"),
    ("min_length", "length >="),
    ("max_length", "length <="),
)


def field_comments(cls: type) -> dict[str, str]:
    """The ``#:`` comment block right above each field of ``cls``, joined into one line (Sphinx's convention)."""
    lines, _first = inspect.getsourcelines(cls)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    comments: dict[str, str] = {}
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        block: list[str] = []
        row = node.lineno - 2  # the line above, 0-based in ``lines``
        while row >= 0 and lines[row].strip().startswith("#:"):
            block.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        if block:
            comments[node.target.id] = " ".join(block)
    return comments


def _type_name(annotation: Any) -> str:
    """A type as a reader says it: ``float``, ``str or unset``, ``one of "a", "b"``, ``list of str``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f'"{a}"' for a in args)
    if origin in (Union, UnionType):
        kept = [a for a in args if a is not type(None)]
        text = " or ".join(_type_name(a) for a in kept)
        return f"{text} or unset" if len(kept) < len(args) else text
    if origin is not None:
        inner = ", ".join(_type_name(a) for a in args if a is not Ellipsis)
        return f"{getattr(origin, '__name__', str(origin))} of {inner}"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return "(computed at start-up)"
    value = info.default
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str | Path):
        return f"`{value}`" if str(value) else '`""`'
    if isinstance(value, list | tuple | dict | set | frozenset) and not value:
        return "empty"
    return f"`{value}`"


def _bounds(info: FieldInfo) -> str:
    parts = []
    for meta in info.metadata:
        for attribute, sign in _BOUNDS:
            bound = getattr(meta, attribute, None)
            if bound is not None:
                parts.append(f"{sign} {bound}")
        pattern = getattr(meta, "pattern", None)
        if pattern:
            parts.append(f"matches `{pattern}`")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str, str, str]]:
    """(setting, environment variable, type, default, bounds, meaning) for each leaf setting of ``model``."""
    comments = field_comments(model)
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            continue  # a section: its own table
        setting = f"{prefix}{name}"
        env = ENV_PREFIX + setting.replace(".", "__").upper()
        yield setting, env, _type_name(annotation), _default(info), _bounds(info), comments.get(name, "")


def sections() -> Iterator[tuple[str, type[BaseModel]]]:
    """("", Settings) for the top level, then each section by its name, in the order of :class:`Settings`."""
    yield "", Settings
    for name, info in Settings.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield name, annotation


def reference() -> str:
    """The whole page, as Markdown."""
    out = [
        "# Settings reference",
        "",
        "Generated from `pipeline/config.py` by `python -m pipeline.settings_reference > docs/settings-reference.md`;",
        "a test fails when it is not current. How settings are read (environment, TOML file, precedence, errors):",
        "[settings.md](settings.md).",
    ]
    for name, model in sections():
        title = f"`[{name}]`" if name else "top level"
        doc = inspect.getdoc(model) or ""
        out += ["", f"## {title}", ""]
        if name and doc:
            out += [" ".join(doc.replace("``", "`").split()), ""]
        out += ["| setting | environment | type | default | bounds | meaning |", "|---|---|---|---|---|---|"]
        for setting, env, kind, default, bounds, meaning in rows(model, f"{name}." if name else ""):
            cells = (f"`{setting}`", f"`{env}`", kind, default, bounds, meaning.replace("``", "`"))
            out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
