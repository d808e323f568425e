"""An MCP server over streamable HTTP that answers in event streams, written by hand
(aiohttp) so every byte is ours: ``python sse_mcp_server.py PORT``.

Two tools: ``echo`` answers one text block (``text="flood"``: after 20,000 log
notifications); ``blocks`` answers ``count`` one-character text blocks as one event
(35,000 make 945 KB, under the gateway's 1 MiB).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from aiohttp import web

SESSION = {"Mcp-Session-Id": "sse-session-1"}
TOOLS = [
    {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {
        "name": "blocks",
        "inputSchema": {"type": "object", "properties": {"count": {"type": "integer"}}},
    },
]


def _event(message: dict[str, Any]) -> bytes:
    return (
        b"event: message\r\ndata: "
        + json.dumps(message, separators=(",", ":")).encode()
        + b"\r\n\r\n"
    )


async def _post(request: web.Request) -> web.StreamResponse:
    message = json.loads(await request.read())
    rid, method = message.get("id"), message.get("method")
    args: dict[str, Any] = (message.get("params") or {}).get("arguments") or {}
    if rid is None:
        return web.Response(status=202, headers=SESSION)
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "sse", "version": "0"},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        if message["params"]["name"] == "blocks":
            blocks = [{"type": "text", "text": "x"}] * args["count"]
        else:
            blocks = [{"type": "text", "text": f"echo {args.get('text', '')}"}]
        result = {"content": blocks, "isError": False}
    else:
        answer = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}}
        return web.json_response(answer, headers=SESSION)
    response = web.StreamResponse(headers={**SESSION, "Content-Type": "text/event-stream"})
    await response.prepare(request)
    if method == "tools/call" and args.get("text") == "flood":  # notifications first
        note = {"jsonrpc": "2.0", "method": "notifications/message"}
        await response.write(_event({**note, "params": {"level": "info", "data": "x"}}) * 20_000)
    await response.write(_event({"jsonrpc": "2.0", "id": rid, "result": result}))
    await response.write_eof()
    return response


async def _other(request: web.Request) -> web.Response:
    return web.Response(status=405 if request.method == "GET" else 200)


def main() -> None:
    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/mcp", _post)
    app.router.add_get("/mcp", _other)
    app.router.add_delete("/mcp", _other)
    port = int(sys.argv[1])
    web.run_app(
        app,
        host="127.0.0.1",
        port=port,
        print=lambda *_: print(f"Uvicorn running on {port}", file=sys.stderr, flush=True),
    )


if __name__ == "__main__":
    main()
