"""JSON Schema for a tool's args, flattened so the model reads one plain object.

``msgspec.json.schema`` puts every Struct under ``$defs`` and points at it with
``$ref``. Models follow an inline ``{"type": "object", "properties": ...}``
far more reliably than references, and the prompt lists each tool on its own,
so the references are inlined and the Struct's own title/docstring (an
implementation detail; the tool has its own description) are dropped.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["args_schema", "describe_args"]

_REF_PREFIX = "#/$defs/"


def args_schema(args_type: type[msgspec.Struct]) -> dict[str, Any]:
    """The args object schema of ``args_type`` with every ``$ref`` inlined.

    Raises ``ValueError`` for a recursive Struct: it has no finite inline form,
    and a tool's args should not need one.
    """
    raw = msgspec.json.schema(args_type)
    defs: dict[str, Any] = raw.get("$defs", {})
    schema = _inline(raw, defs, ())
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ValueError(f"{args_type.__name__} must be a Struct encoded as a JSON object")
    schema.pop("title", None)
    schema.pop("description", None)
    return schema


def _inline(node: Any, defs: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
        name = ref[len(_REF_PREFIX) :]
        if name in seen:
            raise ValueError(f"args Struct {name} is recursive; tools need a finite args schema")
        target = dict(defs[name])
        target.pop("title", None)
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **siblings}, defs, (*seen, name))
    return {k: _inline(v, defs, seen) for k, v in node.items() if k != "$defs"}


def describe_args(schema: dict[str, Any]) -> str:
    """A one-line summary of an args schema, for error messages.

    ``path (string, required), offset (integer), limit (integer or null)``
    tells the model what to send without repeating the whole schema.
    """
    properties: dict[str, Any] = schema.get("properties", {})
    if not properties:
        return "{} (this tool takes no args)"
    required = set(schema.get("required", ()))
    parts = []
    for name, prop in properties.items():
        kind = _type_name(prop)
        parts.append(f"{name} ({kind}, required)" if name in required else f"{name} ({kind})")
    return ", ".join(parts)


def _type_name(prop: Any) -> str:
    if not isinstance(prop, dict):
        return "any"
    if "type" in prop:
        kind = prop["type"]
        return " or ".join(kind) if isinstance(kind, list) else str(kind)
    for key in ("anyOf", "oneOf"):
        if key in prop:
            return " or ".join(_type_name(option) for option in prop[key])
    if "enum" in prop:
        return "one of " + ", ".join(repr(v) for v in prop["enum"])
    return "any"
