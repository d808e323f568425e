"""An HTTP tool that answers JSON nested too deeply: a failure the model can read.

Found from outside: a body of ~1,000 nested arrays raised ``RecursionError``
in ``json.loads``; the executor logged it as an ERROR with a traceback and the
model read "failed with an unexpected error: RecursionError … a fault in the
tool". The endpoint here is real (aiohttp on 127.0.0.1), the call goes through
the executor as a session's does.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from protocol.calls import ToolCall, ToolResult, encode_results
from tools.base import ToolContext
from tools.executor import Executor
from tools.providers.http import HttpTool, HttpToolSpec, http_client
from tools.registry import Registry

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def call(tmp_path: Path) -> AsyncIterator[Any]:
    async def nested(request: web.Request) -> web.Response:
        depth = int(request.match_info["depth"])
        return web.Response(body=b"[" * depth + b"]" * depth, content_type="application/json")

    app = web.Application()
    app.router.add_post("/nested/{depth}", nested)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with http_client() as client:

            async def run(depth: int) -> ToolResult:
                spec = HttpToolSpec(
                    name="deep",
                    url=f"http://127.0.0.1:{port}/nested/{depth}",
                    description="answers nested arrays",
                    parameters={"type": "object"},
                    timeout=5.0,
                )
                executor = Executor(Registry([HttpTool(spec, client)]), timeout=10.0)
                ctx = ToolContext(workspace=tmp_path, session_id="sess-d")
                return await executor.run_call(ToolCall(name="deep", args={}), ctx)

            yield run
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("depth", [5_000, 50_000])
async def test_json_nested_too_deeply_is_a_failure_that_says_so(
    call: Any, depth: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        result = await call(depth)
    assert result == ToolResult(
        "deep",
        "failure",
        f"'deep' answered HTTP 200 with JSON nested more than about "
        f"{sys.getrecursionlimit():,} levels deep, too deep to read. This is a fault in "
        "the tool's service, not in your call: it should answer flatter JSON",
    )
    assert encode_results([result])  # what the session sends the model
    # An endpoint's answer, not the gateway's fault: no ERROR, no traceback.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_json_nested_less_deeply_is_the_result(call: Any) -> None:
    result = await call(100)
    assert result.status == "success"
    depth, value = 0, result.content
    while isinstance(value, list) and value:
        depth, value = depth + 1, value[0]
    assert depth == 99 and value == []
