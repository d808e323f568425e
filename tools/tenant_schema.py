"""A JSON Schema from outside the gateway, compiled once into a bounded check.

Tenants declare client tools with any JSON Schema they like, MCP servers
(maybe a third party's) list theirs, and the gateway checks the model's args
against them on the event loop (``protocol.turn``, ``tools.registry``), so
neither compiling nor checking may depend on the schema being kind. Python
``jsonschema`` froze a node for 13-29 s on single hostile schemas (a
backtracking ``pattern``, ``uniqueItems`` over objects, 0.7 MB of schemas
meta-checked at ~4.6 µs a byte) and fetched remote ``$ref``s. This compiler:

- walks the schema once (its size and depth were limited before, in
  ``protocol.configuration.apply_change``), checks each keyword's value the way
  the meta-schema does, and builds ``tools.schema_check.Node``s;
- compiles ``pattern`` and ``patternProperties`` with RE2 (linear time; no
  backreferences or lookaround, and the message says so);
- resolves ``$ref`` only inside the schema itself (``#``, ``#/json/pointer``,
  ``#anchor``): anything else is refused, so nothing is ever fetched or read;
- refuses ``$ref`` loops that never descend into the args (they could never
  finish) and the keywords it does not implement (``unevaluated*``,
  ``$dynamicRef``, ``$recursiveRef``), saying what to write instead.

The dialect is JSON Schema 2020-12 unless ``$schema`` names draft-07 (or -06,
read as 07), which is what most schema generators write. ``format`` and the
other annotations are not asserted, as in ``jsonschema`` without a format checker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final
from urllib.parse import unquote

import re2

from protocol.configuration import MAX_ARGS_DEPTH

from .schema_applicators import APPLICATORS
from .schema_assertions import ASSERTIONS
from .schema_check import (
    Builder,
    Node,
    Path,
    Regex,
    Run,
    SchemaProblem,
    Unchecked,
    depth_within,
    described,
    escape,
    failed,
)

__all__ = ["COMPILE_DEADLINE", "MAX_PATTERN", "MAX_PROGRAM", "TenantSchema"]

MAX_PATTERN: Final = 1_000
"""Characters of one ``pattern`` (or ``patternProperties`` key)."""
MAX_PROGRAM: Final = 1_000
"""RE2 instructions of one compiled pattern. A search costs up to ~4.5 ns per
character per instruction when RE2 falls back from its DFA (``(.*a){20}``: 224
instructions, 0.68 µs a character), so the size is both limited and paid for."""
_RE2_MEMORY: Final = 1 << 16
"""RE2's memory for one regex, its DFA cache included. It bounds the compile
too (a refused ``\\p{L}{500}`` takes ~1 ms at 64 KiB, 66 ms at RE2's default
8 MiB) and what a session's patterns can hold (64 KiB each at most)."""
COMPILE_DEADLINE: Final = 2.0
"""Seconds one schema's compile may take (it runs in a worker thread; a
schema within the size limits compiles in milliseconds)."""

_DIALECTS: Final = {
    "https://json-schema.org/draft/2020-12/schema": 2020,
    "http://json-schema.org/draft-07/schema": 7,
    "http://json-schema.org/draft-06/schema": 7,
}
_UNSUPPORTED: Final = {
    "unevaluatedProperties": 'use "additionalProperties" (with "properties" and "allOf")',
    "unevaluatedItems": 'use "items" (with "prefixItems")',
    "$dynamicRef": 'use "$ref" to a "$defs" entry',
    "$dynamicAnchor": 'use "$ref" to a "$defs" entry',
    "$recursiveRef": 'use "$ref" to a "$defs" entry',
    "$recursiveAnchor": 'use "$ref" to a "$defs" entry',
}
_ONLY_2020: Final = frozenset(
    ("prefixItems", "minContains", "maxContains", "dependentRequired", "dependentSchemas")
)
_ONLY_DRAFT7: Final = frozenset(("additionalItems", "dependencies"))
_IN_PLACE: Final = (
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",
)
_TYPES: Final = frozenset(("array", "boolean", "integer", "null", "number", "object", "string"))


class TenantSchema:
    """One compiled tool schema: ``explain(args)`` is None for args that fit it."""

    __slots__ = ("_root", "schema")

    def __init__(self, schema: Any, deadline: float = COMPILE_DEADLINE) -> None:
        """Compile ``schema``; ``ValueError`` says what to fix. Linear in its size,
        which the caller limited (``protocol.configuration.schema_bytes``)."""
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
        self.schema: dict[str, Any] = {"type": "object", **schema}
        self._root = _Compiler(self.schema, time.monotonic() + deadline).root

    def explain(self, args: Any) -> str | None:
        """None if ``args`` fit, else what is wrong (at most three problems), or why it
        could not be told within the budget. Never raises, whatever the args."""
        out: list[str] = []
        run = Run()
        try:
            if not depth_within(args, MAX_ARGS_DEPTH, run):  # before anything recurses
                return (
                    f"the args nest deeper than {MAX_ARGS_DEPTH} levels, the limit for tool "
                    "args; send flatter args"
                )
            if self._root.ok(args, None, run, out):
                return None
        except Unchecked as exc:
            return str(exc)
        return "; ".join(out) if out else "the args do not fit the schema"


# ---------------------------------------------------------------------- the compiler


class _Ref:
    """A ``$ref``: its target is found after the walk (it may point anywhere, or back)."""

    __slots__ = ("pointer", "ref", "target")

    def __init__(self, ref: str, pointer: str) -> None:
        self.ref = ref
        self.pointer = pointer
        self.target: Node | None = None

    def node(self) -> Node:
        assert self.target is not None
        return self.target

    def check(self, value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
        assert self.target is not None
        return self.target.ok(value, path, run, out)


class _Compiler:
    """One walk over the schema: ``root`` is its compiled node."""

    def __init__(self, schema: dict[str, Any], deadline: float) -> None:
        self.schema = schema
        self.deadline = deadline
        declared = schema.get("$schema")
        if declared is None:
            self.draft = 2020
        elif not isinstance(declared, str) or declared.rstrip("#") not in _DIALECTS:
            raise SchemaProblem(
                "#/$schema",
                f"{described(declared)} is not a dialect the gateway reads; drop "
                '"$schema" (JSON Schema 2020-12) or name draft-07',
            )
        else:
            self.draft = _DIALECTS[declared.rstrip("#")]
        self.nodes: dict[int, Node] = {}
        self.refs: list[_Ref] = []
        self.anchors: dict[str, Node] = {}
        self.root = self.node(schema, "#")
        # Targets may hold more references: resolve until none is left (no recursion).
        done = 0
        while done < len(self.refs):
            ref = self.refs[done]
            ref.target = self._resolve(ref)
            done += 1
        _refuse_loops(list(self.nodes.values()))

    # ------------------------------------------------------------------ walking

    def node(self, schema: Any, pointer: str) -> Node:
        known = self.nodes.get(id(schema))
        if known is not None:
            return known
        if len(self.nodes) & 63 == 0 and time.monotonic() > self.deadline:
            raise SchemaProblem(
                pointer, "the schema takes too long to compile; make it smaller or simpler"
            )
        node = Node(pointer)
        self.nodes[id(schema)] = node
        if schema is False:
            node.checks.append(_never)
        elif isinstance(schema, dict):
            self._keywords(schema, node, pointer)
        elif schema is not True:
            raise SchemaProblem(
                pointer, f"{described(schema)} is not a schema (an object or a boolean)"
            )
        node.cost = 1 + len(node.checks)
        return node

    def sub(self, schema: dict[str, Any], key: str, pointer: str) -> Node:
        return self.node(schema[key], f"{pointer}/{key}")

    def subs(self, schema: dict[str, Any], key: str, pointer: str) -> list[Node]:
        items = schema[key]
        if not isinstance(items, list) or not items:
            raise SchemaProblem(f"{pointer}/{key}", "must be a non-empty array of schemas")
        return [self.node(s, f"{pointer}/{key}/{i}") for i, s in enumerate(items)]

    def named(self, schema: dict[str, Any], key: str, pointer: str) -> dict[str, Node]:
        value = schema[key]
        if not isinstance(value, dict):
            raise SchemaProblem(f"{pointer}/{key}", "must be an object of schemas")
        return {k: self.node(s, f"{pointer}/{key}/{escape(k)}") for k, s in value.items()}

    def _keywords(self, schema: dict[str, Any], node: Node, pointer: str) -> None:
        for key, instead in _UNSUPPORTED.items():
            if key in schema:
                raise SchemaProblem(pointer, f'"{key}" is not supported in tool schemas; {instead}')
        if "$id" in schema and pointer != "#":
            raise SchemaProblem(
                pointer, '"$id" inside a tool schema is not supported; use "$defs" and "$ref"'
            )
        for defs in ("$defs", "definitions"):
            if defs in schema:
                self.named(schema, defs, pointer)  # checked like any schema, used through $ref
        anchor = schema.get("$anchor")
        if anchor is not None:
            if not isinstance(anchor, str) or not anchor:
                raise SchemaProblem(f"{pointer}/$anchor", "must be a name")
            self.anchors[anchor] = node
        if "$ref" in schema:
            ref = schema["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise SchemaProblem(
                    f"{pointer}/$ref",
                    f"{described(ref)} points outside this schema; the gateway never fetches "
                    'or reads other schemas: put the part under "$defs" and write '
                    '"$ref": "#/$defs/NAME"',
                )
            holder = _Ref(ref, f"{pointer}/$ref")
            self.refs.append(holder)
            node.checks.append(holder.check)
            node.inplace.append(holder.node)
            if self.draft == 7:
                return  # draft-07: a $ref's siblings are ignored
        built: set[Builder] = set()
        skip = _ONLY_2020 if self.draft == 7 else _ONLY_DRAFT7
        for key, build in _BUILDERS.items():
            if key in schema and key not in skip and build not in built:
                built.add(build)  # properties, patternProperties... build one check together
                check = build(self, schema, pointer)
                if check is not None:
                    node.checks.append(check)
        # What applies to the same value, for _refuse_loops (all compiled by now).
        applied = [k for k in _IN_PLACE if k in schema and k not in skip]
        if "if" not in schema:
            applied = [k for k in applied if k not in ("then", "else")]
        for key in applied:
            value = schema[key]
            if key.endswith("Of"):
                node.inplace += [_fixed(self.nodes[id(s)]) for s in value]
            elif key in ("dependentSchemas", "dependencies"):
                node.inplace += [
                    _fixed(self.nodes[id(s)]) for s in value.values() if isinstance(s, dict | bool)
                ]
            else:
                node.inplace.append(_fixed(self.nodes[id(value)]))
        _annotations(schema, pointer)

    # ------------------------------------------------------------------ references

    def _resolve(self, ref: _Ref) -> Node:
        fragment = unquote(ref.ref[1:])
        if fragment and not fragment.startswith("/"):
            anchored = self.anchors.get(fragment)
            if anchored is None:
                raise SchemaProblem(ref.pointer, f'no "$anchor": "{fragment}" in this schema')
            return anchored
        target: Any = self.schema
        for token in fragment.split("/")[1:] if fragment else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise SchemaProblem(ref.pointer, f"{ref.ref!r} points at nothing in this schema")
        if not isinstance(target, dict | bool):
            raise SchemaProblem(ref.pointer, f"{ref.ref!r} does not point at a schema")
        return self.node(target, "#" + fragment)

    # ------------------------------------------------------------------ values

    def count(self, schema: dict[str, Any], key: str, pointer: str) -> int:
        value = schema[key]
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int or value < 0:
            raise SchemaProblem(f"{pointer}/{key}", "must be a non-negative integer")
        return value

    def number(self, schema: dict[str, Any], key: str, pointer: str) -> int | float:
        value = schema[key]
        if type(value) not in (int, float):
            raise SchemaProblem(f"{pointer}/{key}", "must be a number")
        return value  # type: ignore[no-any-return]

    def names(self, value: Any, pointer: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
            raise SchemaProblem(pointer, "must be an array of property names")
        if len(set(value)) != len(value):
            raise SchemaProblem(pointer, "names a property twice")
        return value

    def regex(self, pattern: Any, pointer: str) -> Regex:
        if not isinstance(pattern, str):
            raise SchemaProblem(pointer, "must be a regular expression (a string)")
        if len(pattern) > MAX_PATTERN:
            raise SchemaProblem(
                pointer,
                f"the pattern is {len(pattern):,} characters, over the limit of {MAX_PATTERN:,}",
            )
        if time.monotonic() > self.deadline:
            raise SchemaProblem(
                pointer, "the schema takes too long to compile; use fewer or simpler patterns"
            )
        options = re2.Options()
        options.max_mem = _RE2_MEMORY
        options.log_errors = False
        try:
            compiled = re2.compile(pattern, options)
        except re2.error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
            raise SchemaProblem(
                pointer,
                f"{described(pattern)} is not a regex the gateway can run ({reason}); patterns "
                "run on RE2, which has no backreferences or lookaround: rewrite it without them",
            ) from None
        size = compiled.programsize
        if size > MAX_PROGRAM:
            raise SchemaProblem(
                pointer,
                f"{described(pattern)} compiles to {size:,} regex instructions, over the limit "
                f"of {MAX_PROGRAM:,}; use smaller repetition counts or character classes",
            )
        return _regex(compiled.search, size)


def _regex(search: Callable[[str], object], size: int) -> Regex:
    """A search paid for: ~25 steps for the call (~10 µs through google-re2's
    Python layer), then the string's length times the program's size."""

    def matches(text: str, run: Run) -> bool:
        run.spend(25 + (len(text) * size >> 6))
        return search(text) is not None

    return matches


def _fixed(node: Node) -> Callable[[], Node]:
    return lambda: node


def _never(value: Any, path: Path, run: Run, out: list[str] | None) -> bool:
    return failed(out, path, "no value is allowed here (the schema is false)")


def _annotations(schema: dict[str, Any], pointer: str) -> None:
    """Annotation keywords are not asserted, but a wrong type is still a wrong schema."""
    for key in (
        "title",
        "description",
        "$comment",
        "format",
        "contentMediaType",
        "contentEncoding",
    ):
        if key in schema and not isinstance(schema[key], str):
            raise SchemaProblem(f"{pointer}/{key}", "must be a string")
    for key in ("readOnly", "writeOnly", "deprecated"):
        if key in schema and not isinstance(schema[key], bool):
            raise SchemaProblem(f"{pointer}/{key}", "must be true or false")
    if "examples" in schema and not isinstance(schema["examples"], list):
        raise SchemaProblem(f"{pointer}/examples", "must be an array")


def _refuse_loops(nodes: list[Node]) -> None:
    """Refuse a cycle of schemas applied to the same value (``$ref``, ``allOf``...).

    Such a loop never descends into the args, so checking it could never end.
    Iterative depth-first search, linear in the schema.
    """
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    for start in nodes:
        if id(start) in state:
            continue
        stack: list[tuple[Node, int]] = [(start, 0)]
        state[id(start)] = 1
        while stack:
            node, index = stack[-1]
            if index == len(node.inplace):
                stack.pop()
                state[id(node)] = 2
                continue
            stack[-1] = (node, index + 1)
            nxt = node.inplace[index]()
            seen = state.get(id(nxt))
            if seen == 1:
                raise SchemaProblem(
                    nxt.pointer,
                    "this schema applies itself to the same value again (through $ref, allOf, "
                    "anyOf...) without descending into properties or items, so no args could "
                    "ever be checked against it; break the loop",
                )
            if seen is None:
                state[id(nxt)] = 1
                stack.append((nxt, 0))


_BUILDERS: Final[dict[str, Builder]] = {**ASSERTIONS, **APPLICATORS}
