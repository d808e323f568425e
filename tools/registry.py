"""The set of tools a session offers: their prompt specs and args validation.

The registry is the one place that knows both what the model was told
(``specs()``, rendered into the system prompt) and how its calls are checked
(``bind()``), so the schema the model reads and the validation it meets are
generated from the same Struct and cannot drift apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, Final

import msgspec

from protocol.calls import ToolCall
from protocol.prompt import ToolSpec

from .base import Tool
from .described import DescribedTool
from .schema import args_schema, describe_args

__all__ = ["AnyTool", "InvalidArgs", "Registry", "UnknownTool"]

# A built-in (args declared as a Struct) or an app tool (args declared as a JSON Schema).
AnyTool = Tool[Any] | DescribedTool


class UnknownTool(LookupError):
    """The model called a name the registry does not have (message lists the names)."""


class InvalidArgs(ValueError):
    """A call's args do not match the tool's schema (message says what to send)."""


_TOOL_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_MSGSPEC_ERROR: Final = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<where>[^`]*)`)?$", re.DOTALL)


class Registry:
    """Tools by name, in registration order (the order the prompt lists them)."""

    def __init__(self, tools: Iterable[AnyTool] = ()) -> None:
        self._tools: dict[str, AnyTool] = {}
        self._schemas: dict[str, dict[str, Any]] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: AnyTool) -> None:
        """Add ``tool``; a second tool with the same name is a configuration error."""
        name = getattr(tool, "name", None)
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise ValueError(
                f"{type(tool).__name__} has no valid name ({name!r}); set a class attribute "
                "name made of letters, digits, _, . and - (for example name = 'read')"
            )
        if tool.name in self._tools:
            raise ValueError(
                f"a tool named {tool.name!r} is already registered; give each tool a unique name"
            )
        # Build the schema now so a bad args Struct fails at startup, not mid-session.
        if isinstance(tool, DescribedTool):
            self._schemas[tool.name] = tool.parameters
        else:
            self._schemas[tool.name] = args_schema(tool.args_type)
        self._tools[tool.name] = tool

    def get(self, name: str) -> AnyTool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def approval_required(self) -> frozenset[str]:
        """The tools whose calls wait for a user's approve (``require_approval`` in the
        tools file): the operator's part of every session's approvals."""
        return frozenset(n for n, t in self._tools.items() if getattr(t, "require_approval", False))

    @property
    def background(self) -> frozenset[str]:
        """The tools whose calls do not block the turn (``background`` in the tools file)."""
        return frozenset(n for n, t in self._tools.items() if getattr(t, "background", False))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[AnyTool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def schema(self, name: str) -> dict[str, Any]:
        """The flattened args schema of tool ``name`` (a copy is not made: don't mutate)."""
        return self._schemas[name]

    def specs(self) -> list[ToolSpec]:
        """What ``protocol.prompt.render_tools`` shows the model, one spec per tool."""
        return [
            ToolSpec(name=tool.name, description=tool.description, parameters=self._schemas[name])
            for name, tool in self._tools.items()
        ]

    def bind(self, call: ToolCall) -> tuple[AnyTool, Any]:
        """The tool for ``call`` and its args converted to the tool's Struct.

        Raises ``UnknownTool`` or ``InvalidArgs`` with a message meant for the
        model: what was wrong, and what to send instead.
        """
        tool = self._tools.get(call.name)
        if tool is None:
            available = ", ".join(self._tools) or "(none)"
            raise UnknownTool(
                f"unknown tool {call.name!r}; available tools: {available}. "
                "Call one of these by its exact name."
            )
        if isinstance(tool, DescribedTool):
            problem = tool.validator.explain(call.args)
            if problem is not None:
                raise InvalidArgs(
                    f"invalid args for {tool.name!r}: {problem}. "
                    f"Send args as a JSON object with: {describe_args(tool.parameters)}."
                )
            return tool, call.args
        try:
            args = msgspec.convert(call.args, tool.args_type)
        except msgspec.ValidationError as exc:
            raise InvalidArgs(
                f"invalid args for {tool.name!r}: {_explain(exc)}. "
                f"Send args as a JSON object with: {describe_args(self._schemas[tool.name])}."
            ) from None
        return tool, args


def _explain(exc: msgspec.ValidationError) -> str:
    """Rewrite msgspec's "Expected `str`, got `int` - at `$.path`" as "args.path: expected str, got int"."""
    match = _MSGSPEC_ERROR.match(str(exc))
    what, where = (match["what"], match["where"]) if match else (str(exc), None)
    what = what.replace("`", "'")
    what = what.replace("Object missing required field", "missing required field")
    what = what.replace("Object contains unknown field", "unknown field")
    what = what[:1].lower() + what[1:]
    # Types were quoted with backticks; unquote "'str'" but keep quoted field names.
    what = re.sub(r"(expected|got) '([^']*)'", r"\1 \2", what)
    return f"args{where or ''}: {what}"
