"""The tools a node offers, assembled from a tools file.

``open_registry`` turns a checked tools file into a running ``Registry``: the
chosen built-ins, the tools every MCP server lists (servers started and
supervised for as long as the block runs), and the HTTP tools sharing one
client. It is the one place that owns those connections, so leaving the block
stops every child process and closes every socket.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from tools.builtin import builtin_tools
from tools.registry import AnyTool, Registry
from tools.toolsfile import ToolsFile, ToolsFileError

__all__ = ["builtin_names", "open_registry"]


def builtin_names() -> frozenset[str]:
    """Every built-in a tools file may enable (``shell`` included)."""
    return frozenset(tool.name for tool in builtin_tools(enable_shell=True))


@contextlib.asynccontextmanager
async def open_registry(
    tools_file: ToolsFile | None, *, enable_shell: bool = False
) -> AsyncIterator[Registry]:
    """The registry a tools file describes (the default built-ins without one).

    Raises ``ToolsFileError`` naming the file and section when an MCP server
    cannot be started or lists a tool whose name or schema is unusable.
    """
    if tools_file is None or tools_file.builtins is None:
        tools: list[AnyTool] = list(builtin_tools(enable_shell=enable_shell))
    else:
        chosen = set(tools_file.builtins)
        tools = [t for t in builtin_tools(enable_shell=True) if t.name in chosen]
    if tools_file is None:
        yield Registry(tools)
        return
    for tool in tools:  # fresh instances: this node's own
        tool.require_approval = tool.name in tools_file.builtin_approval
        tool.background = tool.name in tools_file.builtin_background
    # The MCP SDK and the HTTP client load only for a tools file that uses them:
    # the mcp package alone costs ~2 s of import time (python -X importtime),
    # paid by every node start otherwise.
    from tools.providers.http import HttpTool, http_client
    from tools.providers.mcp import McpServer

    servers = [McpServer(spec) for spec in tools_file.mcp]
    async with contextlib.AsyncExitStack() as stack:
        for server in servers:
            stack.push_async_callback(server.close)
        if tools_file.http:
            client = await stack.enter_async_context(http_client())
            tools.extend(HttpTool(spec, client) for spec in tools_file.http)
        # Servers start in parallel: a node waits for its slowest server once.
        started = await asyncio.gather(
            *(server.start() for server in servers), return_exceptions=True
        )
        for server, outcome in zip(servers, started, strict=True):
            section = f"[mcp.{server.spec.name}]"  # an [http.NAME] may share its name
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                raise ToolsFileError(
                    f"tools file {tools_file.path}, {section}: the MCP server "
                    f"({server.spec.describe()}) {outcome}; check that it runs on its own "
                    "and that the command or url is right"
                )
            tools.extend(outcome)
        registry = Registry()
        for tool in tools:
            try:
                registry.register(tool)
            except ValueError as exc:
                where = _section_of(tool, tools_file)
                raise ToolsFileError(f"tools file {tools_file.path}, {where}: {exc}") from None
        yield registry


def _section_of(tool: Any, tools_file: ToolsFile) -> str:
    from tools.providers.mcp import McpTool

    if isinstance(tool, McpTool):
        return f"[mcp.{tool.server.spec.name}]"
    return tools_file.sections.get(getattr(tool, "name", ""), "[builtin]")
