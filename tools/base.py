"""What a tool is: a name, a description, an args Struct and an async ``run``.

The model sees a tool as a name, a description and a JSON Schema for its args
(rendered by ``tools.registry``); the executor sees an object it can hand a
validated args Struct and a ``ToolContext``. Keeping the args a msgspec Struct
means one declaration gives the schema, the validation and the typed value.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import msgspec

__all__ = ["DEFAULT_MAX_OUTPUT", "ArgsT", "Limits", "Tool", "ToolContext", "ToolFailure"]

ArgsT = TypeVar("ArgsT", bound=msgspec.Struct)

DEFAULT_MAX_OUTPUT = 64_000
"""Bytes of one tool result kept when nothing else is configured (``Executor(max_output=)``)."""


class ToolFailure(Exception):
    """A clean, expected failure: the message goes to the model as the result.

    Raise it for anything the model can fix (no such file, text not found,
    bad pattern); the message must say what was wrong and what to do. Any
    other exception is treated as a bug in the tool: the model is told the
    type and message only, and the traceback is logged.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class Limits:
    """Size caps the built-ins apply so one call cannot flood the model's context.

    These bound the work a tool does (bytes read, entries walked); the
    executor's ``max_output`` separately bounds what any tool returns.
    """

    max_read_bytes: int = 1_000_000
    """``read``/``edit``/``search`` refuse (or skip) files larger than this; a
    ranged ``read`` returns at most this many characters (a longer line is cut)."""
    max_write_bytes: int = 10_000_000
    """``write`` and ``edit`` refuse to produce a file larger than this (checked
    from the sizes before the new content is built)."""
    max_workspace_bytes: int = 100 * 1024 * 1024
    """Quota on the bytes of all files in a session's workspace: ``write`` and
    ``edit`` refuse to exceed it; ``shell`` children may not grow a file past
    what is left (RLIMIT_FSIZE), and a command that leaves the workspace over
    it fails."""
    max_entries: int = 1_000
    """``list`` and ``find`` stop after this many entries."""
    max_matches: int = 500
    """``search`` stops after this many matching lines."""
    max_line_chars: int = 500
    """``search`` shortens each matching line to this many characters."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows about the session it runs for.

    ``workspace`` is the only directory file tools may touch (see
    ``tools.sandbox``); ``session_id`` is for logs; ``call_id`` and
    ``idempotency_key`` name the call (set per call). ``max_output`` is the
    bytes of this call's result the executor keeps (it sets it per call): a
    tool that reads from the outside world (an HTTP body) reads little more
    than that, instead of holding what it would be cut to anyway.
    """

    workspace: Path
    session_id: str
    limits: Limits = field(default_factory=Limits)
    max_output: int = DEFAULT_MAX_OUTPUT
    call_id: str = ""
    """The call's id in its session (``call_N``); set per call by the executor."""
    idempotency_key: str = ""
    """The same for every run of one call, on any node (``protocol.journal``): a tool
    that acts in the world does it once per key (docs/tools.md, "Your own tools")."""


class Tool(abc.ABC, Generic[ArgsT]):
    """One tool the model can call.

    Subclasses set ``name``, ``description`` and ``args_type`` as class
    attributes and implement ``run``. ``run`` returns any JSON-encodable value
    (a string reads best for the model), raises ``ToolFailure`` for failures
    the model can act on, and must let ``asyncio.CancelledError`` propagate:
    the executor cancels a tool on timeout and on user cancel.
    """

    name: str
    description: str
    args_type: type[ArgsT]
    journaled: bool = False
    """It changes the world: a rerun of a call that finished returns the first run's
    result instead of running again (``tools.done_markers``)."""
    require_approval: bool = False
    """Its calls wait for a user's approve (the tools file's ``[builtin] require_approval``)."""
    background: bool = False
    """Its calls do not block the turn (the tools file's ``[builtin] background``)."""

    @abc.abstractmethod
    async def run(self, args: ArgsT, ctx: ToolContext) -> Any:
        """Do the work; ``args`` is already validated against ``args_type``."""
