"""The system prompt that teaches a model the protocol and lists its tools.

The model never sees these events as JSON: it writes markers
(``<think>``, ``<execute>``, ``<end>``) and reads ``<results>``. This prompt is
the whole contract from the model's side, so it states each rule once, plainly,
with one complete example.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import orjson

__all__ = ["ToolSpec", "native_prompt", "render_tools", "system_prompt"]


class ToolSpec(msgspec.Struct, frozen=True):
    """What the model needs to know about one tool.

    ``parameters`` is a JSON Schema object for the ``args`` of a call.
    """

    name: str
    description: str
    parameters: dict[str, Any]


_PROTOCOL = """\
You are an assistant that can use tools. Write every reply in this protocol:

1. Optionally think first, inside <think>...</think>. The user does not see it.
2. To use tools, write one block
   <execute>
   [{"name": "TOOL", "args": {...}}, ...]
   </execute>
   containing a JSON array of calls. Each call is an object with a "name" (a tool
   listed below) and an "args" object. The calls of one block run in parallel.
   Stop writing right after </execute>: the system runs the calls and answers with
   <results>
   [{"tool": "TOOL", "status": "success" or "failure", "content": ...}, ...]
   </results>
   in the order of your calls. Then continue: think, call more tools, or answer.
   Never write <results> yourself.
3. Plain text outside the markers is your answer to the user.
4. When your answer is complete, write <end>.

Example:
<think>I need the file's contents.</think>
<execute>
[{"name": "read", "args": {"path": "config.json"}}]
</execute>
(the system replies with <results>...</results>; then you write)
The endpoint in config.json is https://api.example.com.
<end>
"""


def render_tools(tools: Sequence[ToolSpec]) -> str:
    """The tool list: one entry per tool with its description and args schema."""
    if not tools:
        return "No tools are available: answer directly."
    lines = ["Tools:"]
    for tool in tools:
        schema = orjson.dumps(tool.parameters, option=orjson.OPT_SORT_KEYS).decode()
        lines.append(f"- {tool.name}: {tool.description}\n  args schema: {schema}")
    return "\n".join(lines)


def system_prompt(tools: Sequence[ToolSpec], instructions: str = "") -> str:
    """The full system prompt: protocol rules, the tools, then operator instructions."""
    parts = [_PROTOCOL, render_tools(tools)]
    if instructions.strip():
        parts.append(instructions.strip())
    return "\n\n".join(parts) + "\n"


_NATIVE = """\
You are a helpful assistant. Answer the user directly. When one of your
functions would help, call it; its result comes back to you, then go on."""


def native_prompt(instructions: str = "") -> str:
    """The system prompt of a model that does not write the text protocol (it speaks,
    and its functions are declared natively): no markers to teach, only the instructions."""
    parts = [_NATIVE]
    if instructions.strip():
        parts.append(instructions.strip())
    return "\n\n".join(parts) + "\n"
