"""Checking a call's args against a tool's JSON Schema, with messages for the model.

``jsonschema`` rather than ``fastjsonschema``: it is already installed with the
``mcp`` SDK (so no new dependency), it implements draft 2020-12 (what MCP
servers declare) as well as older drafts, it checks the schema itself so a bad
schema is refused at startup, and each error carries the path of the field it
is about, which is what the model needs to fix its call. fastjsonschema is
faster, but it compiles schemas to Python source with ``exec`` and stops at
the first error with a flat message; args are a few fields, so the speed does
not matter here.

These schemas are the operator's (MCP and HTTP tools); a tenant's client tool
schemas go through ``tools.tenant_schema``, which is bounded in time. Either
way no ``$ref`` is ever fetched: jsonschema's default registry retrieves
remote references over HTTP (deprecated, but on), so a schema here gets an
empty registry and a ``$ref`` outside the schema is refused at startup.
"""

from __future__ import annotations

from typing import Any, Final

import jsonschema
import jsonschema.exceptions
import jsonschema.validators
import referencing

__all__ = ["ArgsValidator"]

_MAX_ERRORS: Final = 3


class ArgsValidator:
    """A compiled validator for one tool's args schema."""

    def __init__(self, schema: Any) -> None:
        if not isinstance(schema, dict):
            raise ValueError(
                "the parameters schema must be a JSON object such as "
                '{"type": "object", "properties": {...}}'
            )
        if schema.get("type", "object") != "object":
            raise ValueError(
                f'the parameters schema must describe an object (type = "object"), '
                f"not {schema.get('type')!r}: calls always pass args as an object"
            )
        schema = {"type": "object", **schema}
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.exceptions.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(top level)"
            raise ValueError(f"not a valid JSON Schema at {where}: {exc.message}") from None
        outside = _outside_ref(schema)
        if outside is not None:
            raise ValueError(
                f"$ref {outside!r} points outside the schema; the gateway never fetches or "
                'reads other schemas: inline it, or put it under "$defs" and write '
                '"$ref": "#/$defs/NAME"'
            )
        self.schema: dict[str, Any] = schema
        self._validator = cls(schema, registry=referencing.Registry())

    def explain(self, args: Any) -> str | None:
        """None if ``args`` is valid, else what is wrong, field by field."""
        errors = sorted(self._validator.iter_errors(args), key=jsonschema.exceptions.relevance)
        if not errors:
            return None
        parts = []
        for error in errors[:_MAX_ERRORS]:
            where = "".join(
                f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
            )
            parts.append(f"args{where}: {error.message}")
        if len(errors) > _MAX_ERRORS:
            parts.append(f"and {len(errors) - _MAX_ERRORS} more")
        return "; ".join(parts)


def _outside_ref(schema: Any) -> str | None:
    """The first ``$ref`` (or ``$dynamicRef``) that is not a fragment of this schema, if any.

    A plain walk over every object, so a property named ``$ref`` is looked at
    too: a false alarm there costs a clear message, a miss would cost a fetch.
    """
    stack = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in ("$ref", "$dynamicRef", "$recursiveRef"):
                ref = item.get(key)
                if isinstance(ref, str) and not ref.startswith("#"):
                    return ref
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
