"""An app's HTTP checker for guardrail tests: an aiohttp server on loopback.

It writes down what it is asked and answers by the text: ``launch codes``
blocked (with ``REASON``), ``slow`` never (until the test ends), ``garbage``
HTML, ``huge`` a body past the gateway's cap; anything else allowed. ``/tool``
is an HTTP tool whose result it blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.sessions.guardrail_check import MAX_ANSWER

REASON = "mentions the launch codes"


@dataclass
class Checker:
    """What the checker was asked; ``release`` lets its slow answers go (at teardown)."""

    url: str = ""
    asked: list[dict[str, Any]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@contextlib.asynccontextmanager
async def running_checker() -> AsyncIterator[Checker]:
    seen = Checker()

    async def check(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.asked.append({**body, "auth": request.headers.get("Authorization", "")})
        text = body["text"]
        if "slow" in text:
            await seen.release.wait()  # past any check_timeout: the test ends it
        if "garbage" in text:
            return web.Response(text="<html>not json</html>")
        if "huge" in text:
            return web.Response(text='{"allow": true, "pad": "' + "x" * MAX_ANSWER + '"}')
        if "launch codes" in text:
            return web.json_response({"allow": False, "reason": REASON})
        return web.json_response({"allow": True})

    async def tool(request: web.Request) -> web.StreamResponse:
        return web.json_response({"said": "the launch codes are 0000"})

    app = web.Application()
    app.router.add_post("/check", check)
    app.router.add_post("/tool", tool)  # an HTTP tool whose result the checker blocks
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    seen.url = str(server.make_url("/check"))
    try:
        yield seen
    finally:
        seen.release.set()
        await server.close()
