"""The bounded engine for tenants' tool schemas (``tools.tenant_schema``, issue 29).

Agreement with Python ``jsonschema`` on what is valid (a property test over
the keywords both implement), then what it does differently on purpose: RE2
patterns, linear ``uniqueItems``, references only inside the schema, loops
and unsupported keywords refused at declaration, and a step budget that
ends any check quickly.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.calls import ToolCall
from protocol.configuration import (
    MAX_ARGS_DEPTH,
    ClientToolSpec,
    ConfigChange,
    SessionConfig,
    apply_change,
    json_depth,
)
from tools.client import ClientTools, SchemaCache, prepare
from tools.schema_check import BUDGET
from tools.tenant_schema import TenantSchema

# ---------------------------------------------------------------------- agreement

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([0.0, 1.0, 1.5, -2.5]),
    st.sampled_from(["", "a", "ab", "abc", "b1", "zz"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["a", "b", "c", "x1"]), inner, max_size=4),
    ),
    max_leaves=10,
)
_TYPES = st.sampled_from(["array", "boolean", "integer", "null", "number", "object", "string"])


def _schemas(draft: int) -> st.SearchStrategy[Any]:
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        keywords: dict[str, st.SearchStrategy[Any]] = {
            "type": st.one_of(_TYPES, st.lists(_TYPES, min_size=1, max_size=3, unique=True)),
            "enum": st.lists(_VALUES, min_size=1, max_size=3),
            "const": _VALUES,
            "minimum": st.integers(-3, 3),
            "exclusiveMaximum": st.sampled_from([0, 2, 2.5]),
            "multipleOf": st.sampled_from([1, 2, 0.5, 1.5]),
            "minLength": st.integers(0, 3),
            "maxLength": st.integers(0, 3),
            "pattern": st.sampled_from(["^a", "b$", "[0-9]", "^(a|b)+$"]),
            "minItems": st.integers(0, 3),
            "maxItems": st.integers(0, 3),
            "uniqueItems": st.booleans(),
            "items": inner,
            "contains": inner,
            "properties": st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2),
            "patternProperties": st.dictionaries(st.sampled_from(["^x", "1$"]), inner, max_size=1),
            "additionalProperties": inner,
            "required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
            "propertyNames": inner,
            "minProperties": st.integers(0, 2),
            "maxProperties": st.integers(0, 2),
            "allOf": st.lists(inner, min_size=1, max_size=2),
            "anyOf": st.lists(inner, min_size=1, max_size=2),
            "oneOf": st.lists(inner, min_size=1, max_size=3),
            "not": inner,
            "if": inner,
            "then": inner,
            "else": inner,
        }
        if draft == 2020:
            keywords["prefixItems"] = st.lists(inner, min_size=1, max_size=2)
            keywords["dependentRequired"] = st.dictionaries(
                st.sampled_from(["a", "b"]), st.lists(st.sampled_from(["c", "x1"]), unique=True)
            )
            keywords["minContains"] = st.integers(0, 2)
            keywords["maxContains"] = st.integers(0, 2)
        else:
            keywords["additionalItems"] = inner
            # Not a bare boolean: jsonschema's draft-07 additionalItems takes len() of it
            # (a TypeError), so such a schema has no reference answer to compare with.
            keywords["items"] = st.one_of(
                inner.filter(lambda s: not isinstance(s, bool)),
                st.lists(inner, min_size=1, max_size=2),
            )
        return st.fixed_dictionaries({}, optional=keywords)

    return st.recursive(st.booleans() | st.just({}), extend, max_leaves=6)


# 250 draws, each checked by two validators: past pytest's 60 s on a loaded 2-core machine.
@pytest.mark.timeout(240)
@pytest.mark.parametrize("draft", [2020, 7])
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_agrees_with_jsonschema_on_what_is_valid(draft: int, data: st.DataObject) -> None:
    inner = data.draw(_schemas(draft))
    schema: dict[str, Any] = {"type": "object", "properties": {"v": inner}}
    if draft == 7:
        schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    reference = (jsonschema.Draft7Validator if draft == 7 else jsonschema.Draft202012Validator)(
        schema
    )
    ours = TenantSchema(schema)
    for _ in range(5):
        args = {"v": data.draw(_VALUES)}
        expected = reference.is_valid(args)
        problem = ours.explain(args)
        assert (problem is None) == expected, (schema, args, problem)


def test_local_refs_defs_and_anchors_agree_with_jsonschema() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "node": {
                "$anchor": "node",
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#node"}}},
                "required": ["name"],
            },
            "a~b/c": {"type": "integer"},
        },
        "properties": {"tree": {"$ref": "#/$defs/node"}, "n": {"$ref": "#/$defs/a~0b~1c"}},
    }
    reference = jsonschema.Draft202012Validator(schema)
    ours = TenantSchema(schema)
    for args in (
        {"tree": {"name": 1, "kids": [{"name": 2, "kids": []}]}, "n": 3},
        {"tree": {"name": 1, "kids": [{"kids": []}]}},
        {"n": "x"},
    ):
        assert (ours.explain(args) is None) == reference.is_valid(args), args


# ---------------------------------------------------------------------- on purpose


def test_messages_name_the_field_and_what_is_wrong() -> None:
    schema = TenantSchema(
        {
            "properties": {
                "city": {"type": "string"},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
            },
            "required": ["city"],
            "additionalProperties": False,
        }
    )
    problem = schema.explain({"tags": ["a", "z"], "zip": 1})
    assert problem is not None
    assert "args: 'city' is a required property" in problem
    assert 'args.tags[1]: "z" is not one of ["a","b"]' in problem
    assert "additional properties are not allowed ('zip' unexpected)" in problem


def test_a_backtracking_pattern_is_linear_and_re2_only_syntax_is_refused() -> None:
    schema = TenantSchema({"properties": {"q": {"type": "string", "pattern": "^(a+)+$"}}})
    started = time.perf_counter()
    problem = schema.explain({"q": "a" * 50_000 + "!"})
    took = time.perf_counter() - started
    print(f"\n(a+)+$ on 50,000 a's and !: {took * 1000:.1f} ms")
    assert problem is not None and "does not match" in problem
    for pattern in (r"(a)\1", "(?=a)b", "("):
        with pytest.raises(ValueError, match="RE2"):
            TenantSchema({"properties": {"q": {"pattern": pattern}}})
    with pytest.raises(ValueError, match="regex instructions"):
        TenantSchema({"properties": {"q": {"pattern": "(a|b|c|d){0,999}z"}}})


def test_unique_items_is_json_equality_in_linear_time() -> None:
    schema = TenantSchema({"properties": {"xs": {"uniqueItems": True}}})
    assert schema.explain({"xs": [1, 1.0]}) is not None  # equal numbers
    assert schema.explain({"xs": [True, 1, False, 0, None, "1"]}) is None
    assert schema.explain({"xs": [{"a": 1, "b": [2]}, {"b": [2], "a": 1.0}]}) is not None
    assert schema.explain({"xs": [[1, 2], [2, 1]]}) is None
    objects = [{"id": i} for i in range(4000)]  # 43 kB of args, as in the issue
    started = time.perf_counter()
    assert schema.explain({"xs": objects}) is None
    colliding = [i * (2**61 - 1) for i in range(4000)]  # one hash bucket for Python ints
    assert schema.explain({"xs": colliding}) is None
    print(
        f"\nuniqueItems over 4,000 objects and 4,000 colliding ints: "
        f"{(time.perf_counter() - started) * 1000:.1f} ms"
    )


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "#"}, "applies itself to the same value again"),
        (
            {
                "$defs": {
                    "a": {"allOf": [{"$ref": "#/$defs/b"}]},
                    "b": {"anyOf": [{"$ref": "#/$defs/a"}]},
                },
                "properties": {"x": {"$ref": "#/$defs/a"}},
            },
            "applies itself",
        ),
        ({"properties": {"x": {"$ref": "#/$defs/none"}}}, "points at nothing"),
        ({"required": ["x"], "properties": {"x": {"$ref": "#/required"}}}, "not point at a schema"),
        ({"properties": {"x": {"$ref": "#missing"}}}, 'no "$anchor"'),
        ({"unevaluatedProperties": False}, 'use "additionalProperties"'),
        ({"$defs": {"a": {"$dynamicRef": "#x"}}}, "not supported"),
        ({"properties": {"x": {"$id": "http://h/x"}}}, '"$id" inside'),
        ({"$schema": "http://json-schema.org/draft-04/schema#"}, "not a dialect"),
        ({"properties": {"x": {"type": "nonsense"}}}, "is not a type"),
        ({"properties": {"x": {"minLength": -1}}}, "non-negative integer"),
        ({"required": ["a", "a"]}, "names a property twice"),
        ({"properties": {"x": {"prefixItems": []}}}, "non-empty array"),
        ({"properties": {"x": {"items": [{}]}}}, '"prefixItems" in 2020-12'),
    ],
)
def test_schemas_it_cannot_check_are_refused_saying_what_to_do(schema: Any, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        TenantSchema(schema)


def test_a_recursive_schema_that_descends_is_fine() -> None:
    schema = TenantSchema(
        {
            "$defs": {"t": {"properties": {"c": {"$ref": "#/$defs/t"}}, "required": ["v"]}},
            "properties": {"root": {"$ref": "#/$defs/t"}},
        }
    )
    value: dict[str, Any] = {"v": 1}
    for _ in range(MAX_ARGS_DEPTH - 2):
        value = {"v": 1, "c": value}
    assert schema.explain({"root": value}) is None


def test_draft_07_reads_items_arrays_and_ignores_ref_siblings() -> None:
    schema = TenantSchema(
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"s": {"type": "string"}},
            "properties": {
                "pair": {
                    "items": [{"type": "integer"}, {"type": "string"}],
                    "additionalItems": False,
                },
                "r": {"$ref": "#/definitions/s", "minLength": 5},
            },
        }
    )
    assert schema.explain({"pair": [1, "a"], "r": "ab"}) is None  # minLength ignored beside $ref
    assert schema.explain({"pair": [1, "a", 3]}) is not None


def test_an_exponential_schema_ends_within_the_budget() -> None:
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(30)}
    defs["d30"] = {"type": "string"}
    schema = TenantSchema({"$defs": defs, "properties": {"a": {"$ref": "#/$defs/d0"}}})
    started = time.perf_counter()
    problem = schema.explain({"a": 5})
    took = time.perf_counter() - started
    print(f"\n30 nested anyOf of two $refs: refused after {took * 1000:.1f} ms")
    assert problem is not None and f"within {BUDGET:,} steps" in problem
    assert "simplify the tool's schema" in problem


def test_args_past_the_depth_limit_or_the_budget_are_refused_without_recursing() -> None:
    schema = TenantSchema({"properties": {"a": {"type": "object"}}})
    deep: Any = 1
    for _ in range(5000):  # far past what Python could recurse through
        deep = {"a": deep}
    problem = schema.explain(deep)
    assert problem is not None and f"deeper than {MAX_ARGS_DEPTH} levels" in problem
    wide = {"a": {f"k{i}": i for i in range(300_000)}}
    assert "within" in (schema.explain(wide) or "")
    assert json_depth(deep, MAX_ARGS_DEPTH) == MAX_ARGS_DEPTH + 1


def test_configuration_limits_are_checked_before_any_compile() -> None:
    def change(**parameters: Any) -> Any:
        tools = (ClientToolSpec(name="t", parameters={"type": "object", **parameters}),)
        return apply_change(SessionConfig(), ConfigChange(tools=tools))

    deep: Any = {}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    assert "nest deeper than 32 levels" in change(properties={"a": deep})
    assert "over the limit of 32,768 for one tool" in change(description="x" * 40_000)
    many = tuple(
        ClientToolSpec(name=f"t{i}", parameters={"type": "object", "description": "x" * 30_000})
        for i in range(5)
    )
    refused = apply_change(SessionConfig(), ConfigChange(tools=many))
    assert "over the limit of 131,072 for a session's tools together" in str(refused)


async def test_prepare_compiles_once_per_content_and_names_the_tool() -> None:
    cache = SchemaCache()
    spec = ClientToolSpec(name="a", parameters={"type": "object", "properties": {"x": {}}})
    same = ClientToolSpec(name="b", parameters={"type": "object", "properties": {"x": {}}})
    assert await prepare([spec, same], cache) is None
    tools = ClientTools([spec, same], cache=cache)
    assert len(cache) == 1 and len(tools) == 2
    bad = ClientToolSpec(name="c", parameters={"type": "object", "required": 5})
    assert "tools: 'c' parameters: at #/required" in str(await prepare([bad], cache))
    call = ToolCall(name="a", args={"x": 1})
    assert tools.check_args(call) is None
    small = SchemaCache(max_bytes=200)
    for i in range(5):
        more = ClientToolSpec(name="m", parameters={"type": "object", "description": "x" * i * 20})
        assert await prepare([more], small) is None
    assert small.held <= 200 and len(small) < 5  # the oldest went


def test_a_client_tool_may_not_shadow_a_server_tool() -> None:
    with pytest.raises(ValueError, match="'write' is the name of a server tool"):
        ClientTools([ClientToolSpec(name="write")], server_tools={"read", "write"})


class _Listener:
    """A local port that records every connection it accepts and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def test_no_schema_ever_fetches_a_remote_ref() -> None:
    listener = _Listener()
    try:
        url = f"http://127.0.0.1:{listener.port}/s.json"
        for ref in (url, url + "#/a", "file:///etc/passwd", "s.json"):
            schema = {"type": "object", "properties": {"a": {"$ref": ref}}}
            with pytest.raises(ValueError, match="points outside"):
                TenantSchema(schema)
        # A root $id with a relative $ref resolves inside the schema, never at the $id's host.
        rooted = {
            "$id": url,
            "type": "object",
            "$defs": {"s": {"type": "string"}},
            "properties": {"a": {"$ref": "#/$defs/s"}},
        }
        assert TenantSchema(rooted).explain({"a": 1}) is not None
        assert listener.accepted == 0, "something connected to the $ref's URL"
    finally:
        listener.close()
