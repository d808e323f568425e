"""Small assertions shared by the tools tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from protocol.calls import ToolResult

SECRET = "the secret outside the workspace"

Call = Callable[..., Awaitable[ToolResult]]


def ok(result: ToolResult) -> Any:
    """The content of a success result (fails the test with the message otherwise)."""
    assert result.status == "success", result.content
    return result.content


def failed(result: ToolResult) -> str:
    """The message of a failure result (fails the test if the call succeeded)."""
    assert result.status == "failure", f"expected a failure, got {result.content!r}"
    assert isinstance(result.content, str)
    return result.content
