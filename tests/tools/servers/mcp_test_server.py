"""An MCP server for the tests, written with the SDK's MCPServer (FastMCP in mcp 1.x).

``python mcp_test_server.py`` serves over stdio; ``python mcp_test_server.py PORT``
serves streamable HTTP on 127.0.0.1:PORT/mcp. Besides ordinary tools it has
the faults the gateway must survive: a tool that never answers in time, one
that kills the server mid-call, one that reports an error, one that returns
an image, one that answers as many megabytes as asked, one that answers as many
content blocks as asked. With ``MCP_JSON_RESPONSE=1`` it answers HTTP requests with
JSON bodies instead of event streams.
"""

from __future__ import annotations

import asyncio
import base64
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ImageContent, TextContent

calc = MCPServer("calc")


@calc.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@calc.tool()
def secret(name: str, ctx: Context) -> str:
    """The secret greeting for NAME, which knows the calling session."""
    meta = ctx.request_context.meta or {}
    return f"hello {name}, session {meta.get('session_id')}"


@calc.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await asyncio.sleep(seconds)
    return "slept"


@calc.tool()
def crash() -> str:
    """Kill the server process mid-call, its last words a secret of its operator's."""
    print("FATAL db connect failed: postgres://admin:Pa55w0rd-internal@db/prod", file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)


@calc.tool()
def refuse(reason: str) -> str:
    """Always fails (isError) with REASON."""
    raise ToolError(reason)


@calc.tool()
def picture() -> list[TextContent | ImageContent]:
    """A caption and a small image."""
    data = base64.b64encode(b"\x89PNG" + b"\0" * 96).decode()
    return [TextContent(text="a tiny picture"), ImageContent(data=data, mime_type="image/png")]


@calc.tool()
def big(megabytes: int) -> str:
    """A text of MEGABYTES MB (a hostile answer)."""
    return "x" * (megabytes * 1_000_000)


@calc.tool()
def config(variable: str) -> str:
    """What the server was configured with: environment VARIABLE (a leaky server)."""
    value = os.environ.get(variable, "")
    if value.endswith("!"):
        raise ToolError(f"refusing with {value}")
    return f"{variable}={value}"


@calc.tool()
def blocks(count: int) -> list[TextContent]:
    """``count`` content blocks of one character each."""
    return [TextContent(type="text", text="x")] * count


@calc.tool()
def pid() -> int:
    """The server's process id (to see restarts)."""
    return os.getpid()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        json_response = os.environ.get("MCP_JSON_RESPONSE") == "1"
        calc.run(
            "streamable-http", host="127.0.0.1", port=int(sys.argv[1]), json_response=json_response
        )
    else:
        calc.run()
