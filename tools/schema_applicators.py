"""JSON Schema's applicators for tenant schemas: subschemas applied to parts of a value.

``items``/``prefixItems`` (and draft-07's ``additionalItems``), ``contains``,
``properties``/``patternProperties``/``additionalProperties`` (one pass over
the keys), ``propertyNames``, ``dependentRequired``/``dependentSchemas`` (and
draft-07's ``dependencies``), ``allOf``/``anyOf``/``oneOf``/``not`` and
``if``/``then``/``else``. ``anyOf``, ``oneOf``, ``not``, ``if`` and
``contains`` ask their subschemas without messages (``out=None``), which stop
at the first failure. Every application goes through ``Node.ok``, which pays
for it from the ``Run``.
"""

from __future__ import annotations

from typing import Any, Final

from .schema_check import (
    MAX_ERRORS,
    Builder,
    Check,
    Node,
    Path,
    Regex,
    Run,
    SchemaProblem,
    Walker,
    described,
    escape,
    failed,
)

__all__ = ["APPLICATORS"]


def _items(c: Walker, schema: dict[str, Any], pointer: str) -> Check | None:
    """``prefixItems``/``items`` (2020-12), or ``items``/``additionalItems`` (draft-07)."""
    first: list[Node] = []
    if c.draft == 2020:
        if "prefixItems" in schema:
            first = c.subs(schema, "prefixItems", pointer)
        if isinstance(schema.get("items"), list):
            raise SchemaProblem(
                f"{pointer}/items",
                'must be a schema; a list of schemas is "prefixItems" in 2020-12',
            )
        rest = c.sub(schema, "items", pointer) if "items" in schema else None
    elif isinstance(schema.get("items"), list):
        first = c.subs(schema, "items", pointer)
        rest = c.sub(schema, "additionalItems", pointer) if "additionalItems" in schema else None
    else:
        rest = c.sub(schema, "items", pointer) if "items" in schema else None
    if not first and rest is None:
        return None
    count = len(first)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if type(value) is not list:
            return True
        valid = True
        for index, item in enumerate(value):
            node = first[index] if index < count else rest
            if node is None:
                break
            if not node.ok(item, (path, index), run, out):
                valid = False
                if out is None or len(out) >= MAX_ERRORS:
                    break
        return valid

    return check


def _contains(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    node = c.sub(schema, "contains", pointer)
    least, most = 1, None
    if c.draft == 2020:
        if "minContains" in schema:
            least = c.count(schema, "minContains", pointer)
        if "maxContains" in schema:
            most = c.count(schema, "maxContains", pointer)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if type(value) is not list:
            return True
        found = 0
        for index, item in enumerate(value):
            if node.ok(item, (path, index), run, None):
                found += 1
                if most is not None and found > most:
                    return failed(out, path, f"contains more than {most} matching items")
        if found >= least:
            return True
        return failed(out, path, f"does not contain {least} items matching the given schema")

    return check


def _object(c: Walker, schema: dict[str, Any], pointer: str) -> Check | None:
    """``properties``, ``patternProperties`` and ``additionalProperties``: one pass over the keys."""
    named = c.named(schema, "properties", pointer) if "properties" in schema else {}
    patterns: list[tuple[Regex, Node]] = []
    if "patternProperties" in schema:
        raw = schema["patternProperties"]
        if not isinstance(raw, dict):
            raise SchemaProblem(f"{pointer}/patternProperties", "must be an object of schemas")
        for key, sub in raw.items():
            at = f"{pointer}/patternProperties/{escape(key)}"
            patterns.append((c.regex(key, at), c.node(sub, at)))
    other = (
        c.sub(schema, "additionalProperties", pointer) if "additionalProperties" in schema else None
    )
    if not named and not patterns and other is None:
        return None
    closed = schema.get("additionalProperties") is False

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if type(value) is not dict:
            return True
        run.spend(len(value) >> 2)
        valid = True
        extra: list[str] = []
        for key, item in value.items():
            matched = False
            node = named.get(key)
            if node is not None:
                matched = True
                valid = node.ok(item, (path, key), run, out) and valid
            for matches, sub in patterns:
                if matches(key, run):
                    matched = True
                    valid = sub.ok(item, (path, key), run, out) and valid
            if not matched and other is not None:
                if closed:
                    extra.append(key)
                    valid = False
                else:
                    valid = other.ok(item, (path, key), run, out) and valid
            if not valid and (out is None or len(out) >= MAX_ERRORS):
                return False
        if extra:
            shown = ", ".join(repr(k) for k in extra[:5])
            failed(out, path, f"additional properties are not allowed ({shown} unexpected)")
        return valid

    return check


def _property_names(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    node = c.sub(schema, "propertyNames", pointer)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if type(value) is not dict:
            return True
        for key in value:
            if not node.ok(key, path, run, None):
                return failed(
                    out, path, f"property name {described(key)} does not fit propertyNames"
                )
        return True

    return check


def _dependencies(key: str) -> Builder:
    """``dependentRequired``/``dependentSchemas`` (2020-12), ``dependencies`` (draft-07)."""

    def build(c: Walker, schema: dict[str, Any], pointer: str) -> Check | None:
        raw = schema[key]
        if not isinstance(raw, dict):
            raise SchemaProblem(f"{pointer}/{key}", "must be an object")
        if key == "dependencies" and c.draft == 2020:
            return None  # deprecated in 2020-12 and not asserted (as jsonschema does)
        needs: dict[str, list[str]] = {}
        schemas: dict[str, Node] = {}
        for name, dep in raw.items():
            at = f"{pointer}/{key}/{escape(name)}"
            if isinstance(dep, list) and key != "dependentSchemas":
                needs[name] = c.names(dep, at)
            elif key != "dependentRequired":
                schemas[name] = c.node(dep, at)
            else:
                raise SchemaProblem(at, "must be an array of property names")

        def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
            if type(value) is not dict:
                return True
            valid = True
            for name, required in needs.items():
                if name in value:
                    run.spend(len(required) >> 4)
                    for other in required:
                        if other not in value:
                            valid = failed(out, path, f"{other!r} is a dependency of {name!r}")
            for name, node in schemas.items():
                if name in value:
                    valid = node.ok(value, path, run, out) and valid
            return valid

        return check

    return build


def _all_of(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    nodes = c.subs(schema, "allOf", pointer)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        valid = True
        for node in nodes:
            if not node.ok(value, path, run, out):
                valid = False
                if out is None:
                    break
        return valid

    return check


def _any_of(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    nodes = c.subs(schema, "anyOf", pointer)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        for node in nodes:
            if node.ok(value, path, run, None):
                return True
        return failed(out, path, f"{described(value)} is not valid under any of the given schemas")

    return check


def _one_of(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    nodes = c.subs(schema, "oneOf", pointer)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        matched = 0
        for node in nodes:
            if node.ok(value, path, run, None):
                matched += 1
                if matched > 1:
                    return failed(
                        out,
                        path,
                        f"{described(value)} is valid under more than one of the given schemas",
                    )
        if matched:
            return True
        return failed(out, path, f"{described(value)} is not valid under any of the given schemas")

    return check


def _not(c: Walker, schema: dict[str, Any], pointer: str) -> Check:
    node = c.sub(schema, "not", pointer)

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        if not node.ok(value, path, run, None):
            return True
        return failed(
            out, path, f"{described(value)} should not be valid under {described(schema['not'])}"
        )

    return check


def _if(c: Walker, schema: dict[str, Any], pointer: str) -> Check | None:
    test = c.sub(schema, "if", pointer)
    then = c.sub(schema, "then", pointer) if "then" in schema else None
    other = c.sub(schema, "else", pointer) if "else" in schema else None
    if then is None and other is None:
        return None

    def check(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        branch = then if test.ok(value, path, run, None) else other
        return branch is None or branch.ok(value, path, run, out)

    return check


def _checked_only(key: str) -> Builder:
    """A keyword whose value is checked by another's builder (or is a schema never applied)."""

    def build(c: Walker, schema: dict[str, Any], pointer: str) -> None:
        if key == "contentSchema":
            c.sub(schema, key, pointer)
        elif key in ("minContains", "maxContains"):
            c.count(schema, key, pointer)
        return None

    return build


APPLICATORS: Final[dict[str, Builder]] = {
    "items": _items,
    "prefixItems": _items,
    "additionalItems": _items,
    "contains": _contains,
    "minContains": _checked_only("minContains"),
    "maxContains": _checked_only("maxContains"),
    "properties": _object,
    "patternProperties": _object,
    "additionalProperties": _object,
    "propertyNames": _property_names,
    "dependentRequired": _dependencies("dependentRequired"),
    "dependentSchemas": _dependencies("dependentSchemas"),
    "dependencies": _dependencies("dependencies"),
    "allOf": _all_of,
    "anyOf": _any_of,
    "oneOf": _one_of,
    "not": _not,
    "if": _if,
    "contentSchema": _checked_only("contentSchema"),
}
