"""JSON Schema's assertions for tenant schemas: what one value must be.

The validation vocabulary (``type``, ``enum``, ``const``, numbers, string
lengths and ``pattern``, counts, ``uniqueItems``, ``required``), each keyword a
builder that checks its value as the meta-schema does and returns a ``Check``.
Every ``Check`` is bounded: constant work, or work it pays for from the
``Run`` (``pattern`` by the string's length, ``enum``/``const``/``uniqueItems``
by the values they hash: a set, never pairwise comparison).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any, Final

from .schema_check import (
    Builder,
    Check,
    Path,
    Run,
    SchemaProblem,
    Walker,
    canonical,
    canonical_items,
    described,
    failed,
)

__all__ = ["ASSERTIONS", "is_number"]

TYPES: Final = frozenset(("array", "boolean", "integer", "null", "number", "object", "string"))


def _type(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    value = schema["type"]
    names = [value] if isinstance(value, str) else value
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n in TYPES for n in names)
        or len(set(names)) != len(names)
    ):
        raise SchemaProblem(
            f"{pointer}/type",
            f"{described(value)} is not a type; use one or a list of {sorted(TYPES)}",
        )
    tests = [_IS[n] for n in names]
    wanted = ", ".join(repr(n) for n in names)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        for test in tests:
            if test(value):
                return True
        return failed(out, path, f"{described(value)} is not of type {wanted}")

    return check


def is_number(v: Any) -> bool:
    return (type(v) is int or type(v) is float) and v is not True and v is not False


_IS: Final[dict[str, Callable[[Any], bool]]] = {
    "array": lambda v: type(v) is list,
    "boolean": lambda v: type(v) is bool,
    "integer": lambda v: type(v) is int or (type(v) is float and v.is_integer()),
    "null": lambda v: v is None,
    "number": is_number,
    "object": lambda v: type(v) is dict,
    "string": lambda v: type(v) is str,
}


def _enum(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    values = schema["enum"]
    if not isinstance(values, list):
        raise SchemaProblem(f"{pointer}/enum", "must be an array")
    return _one_of_values(values, f"is not one of {described(values)}")


def _const(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    return _one_of_values([schema["const"]], f"was expected to be {described(schema['const'])}")


def _one_of_values(values: list[Any], message: str) -> Check:
    keys = {canonical(v, Run(1 << 62)) for v in values}

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if canonical(value, run) in keys:
            return True
        return failed(out, path, f"{described(value)} {message}")

    return check


def _bound(key: str, compare: Callable[[Any, Any], bool], words: str) -> Builder:
    def build(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
        limit = c.number(schema, key, pointer)

        def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
            if not is_number(value) or compare(value, limit):
                return True
            return failed(out, path, f"{described(value)} is {words} {limit}")

        return check

    return build


def _multiple_of(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    step = c.number(schema, "multipleOf", pointer)
    if step <= 0:
        raise SchemaProblem(f"{pointer}/multipleOf", "must be greater than 0")

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if not is_number(value):
            return True
        if isinstance(step, float):  # as jsonschema does, so both agree on floats
            try:
                quotient = value / step
                fits = int(quotient) == quotient
            except OverflowError:
                fits = Fraction(value) % Fraction(step) == 0
        else:
            fits = value % step == 0
        return fits or failed(out, path, f"{described(value)} is not a multiple of {step}")

    return check


def _length(key: str) -> Builder:
    def build(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
        limit = c.count(schema, key, pointer)
        most = key == "maxLength"

        def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
            if type(value) is not str or (len(value) <= limit if most else len(value) >= limit):
                return True
            shorter = "long" if most else "short"
            return failed(out, path, f"{described(value)} is too {shorter} ({key} {limit})")

        return check

    return build


def _pattern(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    matches = c.regex(schema["pattern"], f"{pointer}/pattern")
    shown = described(schema["pattern"])

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if type(value) is not str or matches(value, run):
            return True
        return failed(out, path, f"{described(value)} does not match {shown}")

    return check


def _count_of(key: str, measure: Callable[[Any], int | None], noun: str) -> Builder:
    def build(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
        limit = c.count(schema, key, pointer)
        most = key.startswith("max")

        def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
            size = measure(value)
            if size is None or (size <= limit if most else size >= limit):
                return True
            words = f"more than {limit}" if most else f"fewer than {limit}"
            return failed(out, path, f"has {words} {noun} ({key} {limit})")

        return check

    return build


def _unique(c: Walker, schema: dict[str, Any], pointer: str) -> Check | None:
    if not isinstance(schema["uniqueItems"], bool):
        raise SchemaProblem(f"{pointer}/uniqueItems", "must be true or false")
    if schema["uniqueItems"] is False:
        return None

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if type(value) is not list:
            return True
        if len(canonical_items(value, run)) == len(value):
            return True
        return failed(out, path, "has non-unique elements (uniqueItems)")

    return check


def _required(c: Walker, schema: dict[str, Any], pointer: str) -> Check | None:
    names = c.names(schema["required"], f"{pointer}/required")
    if not names:
        return None

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if type(value) is not dict:
            return True
        run.spend(len(names) >> 4)
        valid = True
        for name in names:
            if name not in value:
                valid = failed(out, path, f"{name!r} is a required property")
                if out is None:
                    break
        return valid

    return check


ASSERTIONS: Final[dict[str, Builder]] = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "minimum": _bound("minimum", lambda v, b: v >= b, "less than the minimum of"),
    "maximum": _bound("maximum", lambda v, b: v <= b, "greater than the maximum of"),
    "exclusiveMinimum": _bound("exclusiveMinimum", lambda v, b: v > b, "not greater than"),
    "exclusiveMaximum": _bound("exclusiveMaximum", lambda v, b: v < b, "not less than"),
    "multipleOf": _multiple_of,
    "minLength": _length("minLength"),
    "maxLength": _length("maxLength"),
    "pattern": _pattern,
    "minItems": _count_of("minItems", lambda v: len(v) if type(v) is list else None, "items"),
    "maxItems": _count_of("maxItems", lambda v: len(v) if type(v) is list else None, "items"),
    "uniqueItems": _unique,
    "required": _required,
    "minProperties": _count_of(
        "minProperties", lambda v: len(v) if type(v) is dict else None, "properties"
    ),
    "maxProperties": _count_of(
        "maxProperties", lambda v: len(v) if type(v) is dict else None, "properties"
    ),
}
