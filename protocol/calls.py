"""Tool calls and tool results as they appear in the model's protocol.

A ``call`` event's ``content`` is ``encode_call(ToolCall)``; a ``result`` event's
``content`` is ``encode_results([...])``, which is also what goes between
``<results>`` markers. Both sides (parser, tools, gateway) use these Structs so
the JSON is written one way everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from protocol.events import ResultPayload

__all__ = [
    "ToolCall",
    "ToolResult",
    "decode_call",
    "encode_call",
    "encode_result",
    "encode_results",
    "result_payload",
]


class ToolCall(msgspec.Struct, frozen=True):
    """One call the model asked for: a tool name and an arguments object."""

    name: str
    args: dict[str, Any]


class ToolResult(msgspec.Struct, frozen=True):
    """One tool's outcome, the seed's ``{"tool", "status", "content"}`` object.

    ``content`` is the tool's output (any JSON value) on success, and a message
    that says what went wrong and what to do on failure.
    """

    tool: str
    status: Literal["success", "failure"]
    content: Any


_encoder: Final = msgspec.json.Encoder()
_call_decoder: Final = msgspec.json.Decoder(ToolCall)


def encode_call(call: ToolCall) -> str:
    return _encoder.encode(call).decode()


def decode_call(content: str | bytes) -> ToolCall:
    """Decode a ``call`` event's content (raises ``msgspec`` errors on bad input)."""
    return _call_decoder.decode(content)


def encode_result(result: ToolResult) -> str:
    """One result as JSON text (a native call's function output)."""
    return _encoder.encode(result).decode()


def encode_results(results: Sequence[ToolResult]) -> str:
    """The JSON array of results, in call order (a ``result`` event's content)."""
    return _encoder.encode(list(results)).decode()


def result_payload(results: Sequence[ToolResult]) -> ResultPayload:
    ok = sum(1 for r in results if r.status == "success")
    return ResultPayload(
        tools_executed=len(results), success_count=ok, failure_count=len(results) - ok
    )
