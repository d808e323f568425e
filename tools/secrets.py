"""Secrets the gateway holds for a tool, kept out of everything its answers reach.

An HTTP tool's headers (``Authorization = "Bearer …"`` in the tools file) and
the values a tools file takes from the environment (``${VAR}`` in a URL, an
MCP server's ``env``, a header) are the gateway's, not the model's: an
endpoint that echoes its request, or an MCP server whose error quotes its
configuration, would otherwise put them in the call's ``result`` — the
client's events, the session's log and history (so the model's next
request), recordings and exports. The executor scrubs every result of a
tool that holds secrets before anyone sees it: each value becomes
``[redacted:NAME]`` (NAME: the header or the variable).

Values shorter than ``MIN_LENGTH`` are not secrets worth the name (and
replacing ``1`` or ``on`` everywhere would garble answers). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from protocol.calls import ToolResult

__all__ = ["MIN_LENGTH", "Secrets", "header_secrets"]

MIN_LENGTH: Final = 8

_ENCODER: Final = msgspec.json.Encoder()


def header_secrets(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(name, value)`` of configured headers as secrets: each whole value, and each
    word of it (the token of ``Bearer TOKEN``: an endpoint may echo only that)."""
    found: list[tuple[str, str]] = []
    for name, value in headers:
        found.append((name, value))
        words = value.split()
        if len(words) > 1:
            found += [(name, word) for word in words]
    return found


class Secrets:
    """A tool's secrets, by the name their marker shows (see the module docstring)."""

    __slots__ = ("_pairs", "values")

    def __init__(self, named: Iterable[tuple[str, str]]) -> None:
        seen: dict[str, str] = {}
        for name, value in named:
            if len(value) >= MIN_LENGTH:
                seen.setdefault(value, name)
        # Longest first: a whole header value goes before the token inside it.
        values = sorted(seen, key=len, reverse=True)
        self.values: tuple[str, ...] = tuple(values)
        # As each value appears inside a JSON string (escaped), and its marker.
        self._pairs = tuple(
            (_ENCODER.encode(v)[1:-1], _ENCODER.encode(f"[redacted:{seen[v]}]")[1:-1])
            for v in values
        )

    def __bool__(self) -> bool:
        return bool(self._pairs)

    def scrub(self, content: Any) -> Any:
        """``content`` (a JSON value) with every secret replaced by its marker, in
        strings and keys alike; ``content`` itself when it holds none."""
        if not self._pairs:
            return content
        encoded = _ENCODER.encode(content)
        scrubbed = encoded
        for secret, marker in self._pairs:
            if secret in scrubbed:
                scrubbed = scrubbed.replace(secret, marker)
        if scrubbed is encoded:
            return content
        return msgspec.json.decode(scrubbed)

    def scrub_result(self, result: ToolResult) -> ToolResult:
        content = self.scrub(result.content)
        if content is result.content:
            return result
        return ToolResult(tool=result.tool, status=result.status, content=content)
