"""One job per room: no module too long, no class holding too much.

A module past 600 lines, or a class with behaviour past 20 instance
attributes or 30 methods, usually holds two jobs (``../shared/style.md``).
Counted on the source (AST): a class's methods are its ``def``s (properties
included); its instance attributes are its ``__slots__`` or, without them,
the names it assigns on ``self``. Plain records (a Struct, a dataclass, an
enum: no methods besides dunders) are data, not behaviour, and are not counted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.support.source import parse

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("protocol", "tools", "gateway")
MAX_LINES = 600
MAX_ATTRIBUTES = 20
MAX_METHODS = 30


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _slots(node: ast.ClassDef) -> set[str] | None:
    for item in node.body:
        if isinstance(item, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets
        ):
            value = item.value
            if isinstance(value, ast.Tuple | ast.List):
                return {e.value for e in value.elts if isinstance(e, ast.Constant)}
    return None


def _self_attributes(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(item, ast.Assign):
            targets = item.targets
        elif isinstance(item, ast.AnnAssign | ast.AugAssign):
            targets = [item.target]
        for target in targets:
            for sub in ast.walk(target):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    names.add(sub.attr)
    return names


def _classes() -> Iterator[tuple[str, int, int]]:
    """``(where, attributes, methods)`` of every class with behaviour."""
    for path in _sources():
        tree = parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [
                f
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                and not (f.name.startswith("__") and f.name.endswith("__"))
            ]
            if not methods:
                continue
            slots = _slots(node)
            attributes = slots if slots is not None else _self_attributes(node)
            where = f"{path.relative_to(ROOT)}:{node.name}"
            yield where, len(attributes), len(methods)


def test_no_module_is_past_its_length() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_no_class_holds_too_much() -> None:
    crowded = {
        where: (attributes, methods)
        for where, attributes, methods in _classes()
        if attributes > MAX_ATTRIBUTES or methods > MAX_METHODS
    }
    assert not crowded, (
        f"classes over {MAX_ATTRIBUTES} instance attributes or {MAX_METHODS} methods "
        f"(attributes, methods): {crowded}"
    )


def test_the_sessions_room_has_no_type_ignore() -> None:
    """The session code's types are checked without exceptions: a ``type: ignore``
    there hid real narrowing gaps (the guard's events) until this test."""
    marker = "type: " + "ignore"
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "gateway" / "sessions").rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if marker in line
    ]
    assert not found, f"narrow the types instead: {found}"
