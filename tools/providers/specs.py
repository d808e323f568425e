"""What a tools file says about app tools, apart from the code that runs them.

The specs are plain data, so reading and checking a tools file
(``tools.toolsfile``) never imports the MCP SDK or the HTTP client: those
load only when a node actually starts such tools (``tools.toolset``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["HttpToolSpec", "McpServerSpec"]


@dataclass(frozen=True, slots=True)
class McpServerSpec:
    """One ``[mcp.NAME]`` section of a tools file: exactly one of ``command`` or ``url``."""

    name: str
    command: Sequence[str] = ()
    url: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    cwd: str | None = None
    """Working directory of a stdio server (the tools file's directory)."""
    require_approval: bool = False
    """Calls of every tool of this server wait for a user's approve."""
    background: bool = False
    """Calls of every tool of this server do not block the turn."""
    secrets: tuple[tuple[str, str], ...] = ()
    """``(name, value)``: values from the environment, scrubbed from its answers (``tools.secrets``)."""

    def describe(self) -> str:
        return " ".join(self.command) if self.command else self.url


@dataclass(frozen=True, slots=True)
class HttpToolSpec:
    """One ``[http.NAME]`` section of a tools file, environment already substituted."""

    name: str
    url: str
    description: str
    parameters: dict[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout: float = 10.0
    require_approval: bool = False
    """Its calls wait for a user's approve."""
    background: bool = False
    """Its calls do not block the turn: the model is told it started, the result comes later."""
    secrets: tuple[tuple[str, str], ...] = ()
    """``(name, value)``: its header values and values from the environment, scrubbed
    from its answers (``tools.secrets``)."""
