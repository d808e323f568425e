"""A scripted gateway that asks for a client tool, to check the exact frame a client sends.

It sends the shape the real gateway sends: a ``call`` event with ``"id"`` and
``"runs_on": "client"`` next to its ``content``; the client answers ``{"type":
"tool_result", "id", "status", "content"}``. The server then answers with that
frame's JSON as the ``respond`` text, so a client test can check exactly what
was sent. (``tests/gateway/test_client_tools.py`` runs the client against a
real gateway.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec
from websockets.asyncio.server import ServerConnection, serve

__all__ = ["tool_server"]


def frame(kind: str, seq: int, **fields: object) -> str:
    return msgspec.json.encode({"type": kind, "seq": seq, "timestamp": 0.0, **fields}).decode()


async def _handler(ws: ServerConnection) -> None:
    await ws.send(frame("session", 0, session_id="s1"))
    user = msgspec.json.decode(await ws.recv())
    call = {"name": "shout", "args": {"text": "hi"}}
    await ws.send(frame("user", 1, content=user["content"]))
    content = msgspec.json.encode(call).decode()
    await ws.send(frame("call", 2, content=content, id="c1", runs_on="client"))
    await ws.send(frame("execute", 3))
    answer = await ws.recv()
    await ws.send(frame("respond", 4, content=answer))
    await ws.send(frame("end", 5))
    await ws.send(frame("metric", 6, step={}, total={}))
    await ws.wait_closed()


@contextlib.asynccontextmanager
async def tool_server() -> AsyncIterator[str]:
    async with serve(_handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/realtime"
