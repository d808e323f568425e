"""The registry: what the model is told about tools, and how its calls are checked."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

import tools
from protocol.calls import ToolCall
from protocol.prompt import render_tools, system_prompt
from tools.base import Tool, ToolContext
from tools.builtin import builtin_tools, default_registry
from tools.builtin.files import ReadArgs
from tools.registry import InvalidArgs, Registry, UnknownTool

BUILTIN_NAMES = ["read", "write", "edit", "list", "find", "search"]


class Point(msgspec.Struct):
    x: int
    y: int


class ShapeArgs(msgspec.Struct, forbid_unknown_fields=True):
    """An implementation detail the model should not see."""

    name: str
    points: list[Point]
    origin: Point | None = None


class Shape(Tool[ShapeArgs]):
    name = "shape"
    description = "draws a shape"
    args_type = ShapeArgs

    async def run(self, args: ShapeArgs, ctx: ToolContext) -> Any:
        return len(args.points)


class Node(msgspec.Struct):
    children: list[Node]


class TreeArgs(msgspec.Struct):
    root: Node


class Tree(Tool[TreeArgs]):
    name = "tree"
    description = "takes a recursive argument"
    args_type = TreeArgs

    async def run(self, args: TreeArgs, ctx: ToolContext) -> Any:
        return None


def walk_schema(node: Any) -> list[str]:
    """Every key anywhere in a schema."""
    if isinstance(node, dict):
        return [k for k in node] + [key for v in node.values() for key in walk_schema(v)]
    if isinstance(node, list):
        return [key for item in node for key in walk_schema(item)]
    return []


def test_default_registry_offers_the_file_tools_and_no_shell() -> None:
    registry = default_registry()
    assert registry.names() == BUILTIN_NAMES
    assert "shell" not in registry


def test_shell_is_offered_only_when_enabled() -> None:
    assert default_registry(enable_shell=True).names() == [*BUILTIN_NAMES, "shell"]
    assert [t.name for t in builtin_tools(enable_shell=True)] == [*BUILTIN_NAMES, "shell"]


def test_package_exports_the_same_factory() -> None:
    assert tools.default_registry().names() == default_registry().names()


def test_duplicate_tool_names_are_rejected() -> None:
    registry = Registry([Shape()])
    with pytest.raises(ValueError, match="'shape' is already registered"):
        registry.register(Shape())
    assert len(registry) == 1


@pytest.mark.parametrize("enable_shell", [False, True])
def test_builtin_specs_are_plain_object_schemas(enable_shell: bool) -> None:
    specs = default_registry(enable_shell=enable_shell).specs()
    for spec in specs:
        schema = spec.parameters
        assert spec.description
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False  # unknown args are refused, say so
        assert set(schema["required"]) <= set(schema["properties"])
        keys = walk_schema(schema)
        assert "$ref" not in keys and "$defs" not in keys
        assert "title" not in schema
        # Round-trips as JSON: what the prompt prints is exactly this object.
        assert msgspec.json.decode(msgspec.json.encode(schema)) == schema


def test_nested_structs_are_inlined_and_struct_docs_dropped() -> None:
    [spec] = Registry([Shape()]).specs()
    schema = spec.parameters
    assert "$ref" not in walk_schema(schema)
    assert "description" not in schema  # ShapeArgs' docstring is not for the model
    point = schema["properties"]["points"]["items"]
    assert point == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
    }
    assert schema["properties"]["origin"]["anyOf"] == [point, {"type": "null"}]


def test_recursive_args_are_rejected_when_registered() -> None:
    with pytest.raises(ValueError, match="recursive"):
        Registry([Tree()])


def test_specs_render_into_the_system_prompt() -> None:
    registry = default_registry(enable_shell=True)
    rendered = render_tools(registry.specs())
    for spec in registry.specs():
        assert f"- {spec.name}: {spec.description}" in rendered
    assert '"path":{"description":"file path relative to the workspace root"' in rendered
    assert rendered in system_prompt(registry.specs())


def test_bind_converts_args_and_fills_defaults() -> None:
    tool, args = default_registry().bind(ToolCall(name="read", args={"path": "a.txt"}))
    assert tool.name == "read"
    assert args == ReadArgs(path="a.txt", offset=1, limit=None)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"path": 5}, "args.path: expected str, got int"),
        ({}, "args: missing required field 'path'"),
        ({"file": "a.txt"}, "args: unknown field 'file'"),
        ({"path": "a", "offset": 0}, "args.offset: expected int >= 1"),
        ({"path": "a", "limit": "10"}, "args.limit: expected int | null, got str"),
    ],
)
def test_invalid_args_say_what_is_wrong_and_what_to_send(
    args: dict[str, Any], expected: str
) -> None:
    with pytest.raises(InvalidArgs) as info:
        default_registry().bind(ToolCall(name="read", args=args))
    message = str(info.value)
    assert message.startswith("invalid args for 'read': ")
    assert expected in message
    assert "path (string, required), offset (integer), limit (integer or null)" in message


def test_invalid_nested_args_point_at_the_element() -> None:
    call = ToolCall(name="shape", args={"name": "tri", "points": [{"x": 1, "y": 2}, {"x": "3"}]})
    with pytest.raises(InvalidArgs, match=r"args\.points\[1\]\.x: expected int, got str"):
        Registry([Shape()]).bind(call)


def test_unknown_tool_names_the_available_tools() -> None:
    with pytest.raises(UnknownTool) as info:
        default_registry().bind(ToolCall(name="cat", args={}))
    assert str(info.value) == (
        "unknown tool 'cat'; available tools: read, write, edit, list, find, search. "
        "Call one of these by its exact name."
    )


def test_empty_registry_says_so() -> None:
    with pytest.raises(UnknownTool, match=r"available tools: \(none\)"):
        Registry().bind(ToolCall(name="read", args={}))
    assert render_tools(Registry().specs()) == "No tools are available: answer directly."


def test_a_tool_without_a_usable_name_is_rejected() -> None:
    class Nameless(Shape):
        name = "two words"

    with pytest.raises(ValueError, match="Nameless has no valid name"):
        Registry([Nameless()])
