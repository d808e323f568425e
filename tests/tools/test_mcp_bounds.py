"""What an MCP server can make the node hold is bounded (issue 29).

A 100 MB answer kept a core busy for the whole tool timeout: the SDK's stdio
reader re-joins its buffer for every chunk of a long line. Over stdio the
gateway now frames lines itself (``tools.providers.lines``), over HTTP it
caps the bodies it reads (``tools.providers.mcp_http``). The answers come from
a real server written with the SDK (``servers/mcp_test_server.py``); each
call is watched (loop ticks every 20 ms, with a last reading at the end; peak
RSS) and the figures are printed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from protocol.calls import ToolCall, ToolResult
from protocol.configuration import MAX_TOOL_DESCRIPTION
from tools.base import ToolContext
from tools.executor import Executor
from tools.providers.mcp import (
    _SSE_TOO_LARGE,
    MAX_MESSAGE,
    MAX_TOOLS,
    McpServer,
    McpServerSpec,
    McpTool,
)
from tools.registry import Registry

from .helpers import failed, footprint, ok
from .servers.mcp_http import SERVER, McpHttpProcess, mcp_http_server

RAW_SERVER = Path(__file__).parent / "servers" / "raw_mcp_server.py"
SSE_SERVER = Path(__file__).parent / "servers" / "sse_mcp_server.py"

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 10.0
_MAX_GAP = 2.5
"""A loaded machine's margin: ticks came within 28-68 ms here; the SDK's reader held a core
for the whole timeout."""
_MAX_RSS_MB = 100.0


class Harness:
    def __init__(self, server: McpServer, tools: list[McpTool], tmp_path: Path) -> None:
        self.server = server
        self.executor = Executor(Registry(tools), timeout=30.0)
        self.ctx = ToolContext(workspace=tmp_path, session_id="sess-b")

    async def call(self, tool: str, /, **args: Any) -> ToolResult:
        return await self.executor.run_call(ToolCall(name=tool, args=args), self.ctx)


async def _started(spec: McpServerSpec, tmp_path: Path) -> AsyncIterator[Harness]:
    server = McpServer(spec, backoff_first=0.05, connect_timeout=30.0)
    tools = await server.start()
    try:
        yield Harness(server, tools, tmp_path)
    finally:
        await server.close()


@pytest.fixture
async def stdio(tmp_path: Path) -> AsyncIterator[Harness]:
    spec = McpServerSpec(name="calc", command=(sys.executable, str(SERVER)), timeout=TIMEOUT)
    async for harness in _started(spec, tmp_path):
        yield harness


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[Harness]:
    with mcp_http_server() as process:
        spec = McpServerSpec(name="calc", url=process.url, timeout=TIMEOUT)
        async for harness in _started(spec, tmp_path):
            yield harness


@pytest.fixture(params=["stdio", "http"])
def mcp(request: pytest.FixtureRequest) -> Harness:
    harness: Harness = request.getfixturevalue(str(request.param))
    return harness


@pytest.mark.slow
async def test_a_100mb_answer_fails_the_call_and_the_server_stays_up(mcp: Harness) -> None:
    async with footprint() as cost:
        message = failed(await mcp.call("calc.big", megabytes=100))
    print(f"\n100 MB MCP answer ({mcp.server.spec.describe()}): {cost}")
    assert f"'calc.big' answered with more than {MAX_MESSAGE:,} bytes" in message
    assert "Ask for less at once" in message
    assert cost.seconds < TIMEOUT
    assert cost.max_gap < _MAX_GAP, cost
    assert cost.rss_growth_mb < _MAX_RSS_MB, cost
    # The rest of the line is dropped as it streams past; the connection is kept.
    started = time.monotonic()
    assert ok(await mcp.call("calc.add", a=2, b=3)) == 5
    print(f"next call answered after {time.monotonic() - started:.2f} s")
    assert mcp.server.connects == 1


async def test_an_answer_under_the_limit_is_read_and_cut_to_the_result_cap(mcp: Harness) -> None:
    """300 kB of text travels twice (content and structured content), inside 1 MiB."""
    content = ok(await mcp.call("calc.secret", name="y" * 300_000))
    assert content.startswith("hello yyy")
    assert content.endswith("bytes, showing the first 64,000]")


@pytest.fixture
async def raw(tmp_path: Path) -> AsyncIterator[Harness]:
    spec = McpServerSpec(name="raw", command=(sys.executable, str(RAW_SERVER)), timeout=TIMEOUT)
    async for harness in _started(spec, tmp_path):
        yield harness


async def test_an_overlong_answer_with_its_id_last_fails_its_call(raw: Harness) -> None:
    """The TypeScript SDK's order: the id is found in the line's last bytes."""
    async with footprint() as cost:
        message = failed(await raw.call("raw.emit", shape="id_last", megabytes=20))
    print(f"\n20 MB answer, id last: {cost}")
    assert f"'raw.emit' answered with more than {MAX_MESSAGE:,} bytes" in message
    assert cost.max_gap < _MAX_GAP, cost
    assert ok(await raw.call("raw.emit", shape="small", megabytes=0)) == "emitted small"
    assert raw.server.connects == 1


async def test_a_stray_overlong_notification_is_dropped(raw: Harness) -> None:
    assert ok(await raw.call("raw.emit", shape="notice", megabytes=5)) == "emitted notice"
    assert raw.server.connects == 1


async def test_an_overlong_answer_naming_no_request_ends_the_connection_with_the_reason(
    raw: Harness,
) -> None:
    message = failed(await raw.call("raw.emit", shape="anonymous", megabytes=5))
    assert "the MCP server 'raw' closed the connection during the call" in message
    assert "that names no pending request" in message
    # A new child is started, as after a crash.
    for _ in range(100):
        again = await raw.call("raw.emit", shape="small", megabytes=0)
        if again.status == "success":
            break
    assert again.content == "emitted small" and raw.server.connects == 2


def test_the_sdks_event_stream_limit_still_reads_as_a_size_limit() -> None:
    """Canary: an answer over ``max_sse_event_size`` is recognised by its SDK message."""
    body = b"data: " + b"x" * (2 * 1024 * 1024) + b"\n\n"
    response = httpx2.Response(
        200,
        headers={"Content-Type": "text/event-stream"},
        content=body,
        request=httpx2.Request("POST", "http://127.0.0.1/mcp"),
    )
    with pytest.raises(httpx2.SSEError) as info:
        list(httpx2.EventSource(response, max_event_size=MAX_MESSAGE))
    assert _SSE_TOO_LARGE in str(info.value)


async def test_a_servers_tool_list_past_the_limits_is_cut_to_what_a_model_can_take(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tool's description and schema were taken at any size (a client's tool is held
    to 4,096 characters and 32 kB), any number of tools, and a cursor that never ended
    held the node's start forever."""
    command = (sys.executable, str(RAW_SERVER))
    spec = McpServerSpec("raw", command, env={"RAW_MCP_LISTING": "many"}, timeout=TIMEOUT)
    async for harness in _started(spec, tmp_path):
        names = harness.executor.registry.names()
        assert len(names) == MAX_TOOLS - 2  # the deep and the big ones are left out
        assert "raw.emit" in names and "raw.deep" not in names and "raw.big" not in names
        long = harness.executor.registry.get("raw.long")
        assert isinstance(long, McpTool) and len(long.description) == MAX_TOOL_DESCRIPTION
        assert (await harness.call("raw.emit", shape="short", megabytes=0)).status == "success"
    logged = caplog.text
    assert "lists 204 tools; the first 128 are used" in logged
    assert "'deep' left out" in logged and "nest deeper than 32" in logged
    assert "'big' left out" in logged and "bytes of JSON" in logged
    spec = McpServerSpec("raw", command, env={"RAW_MCP_LISTING": "endless"}, timeout=TIMEOUT)
    async for harness in _started(spec, tmp_path):
        assert len(harness.executor.registry.names()) == 32
    assert "past 32 pages" in caplog.text


@pytest.fixture
async def hostile(tmp_path: Path) -> AsyncIterator[Harness]:
    command = (sys.executable, str(RAW_SERVER))
    spec = McpServerSpec("raw", command, env={"RAW_MCP_LISTING": "hostile"}, timeout=TIMEOUT)
    async for harness in _started(spec, tmp_path):
        yield harness


async def test_a_third_partys_tool_schemas_are_checked_in_bounded_time(
    hostile: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The args of MCP tools were checked with ``jsonschema`` on the loop: a nested
    quantifier held the node 0.5 s with 23 letters (twice as long a letter more),
    ``anyOf``s 16 levels deep through ``$ref`` 2.7 s and 200 MB, 30 levels over 50 s."""
    async with footprint() as cost:
        letters = failed(await hostile.call("raw.redos", s="a" * 30 + "!"))
        nested = failed(await hostile.call("raw.expo", x=1))
    print(f"\nhostile schemas: {cost}")
    assert "does not match" in letters
    assert "args.x" in nested or "could not be checked" in nested
    assert cost.max_gap < 1.0, cost  # jsonschema: minutes for these 30 letters
    assert ok(await hostile.call("raw.redos", s="aaa")) == "called"
    # A $ref loop cannot check any args: that tool is left out, the others are offered.
    assert "raw.loop" not in hostile.executor.registry.names()
    at_start = " ".join(r.getMessage() for r in caplog.get_records("setup"))
    assert "'loop' left out" in at_start and "break the loop" in at_start


async def test_an_answer_too_wide_or_too_deep_to_take_fails_its_call_at_once(
    raw: Harness,
) -> None:
    """35,000 content blocks held the loop 0.5-0.7 s a call; an answer nested 400 deep
    was dropped unanswered, so the call waited out its timeout."""
    async with footprint() as cost:
        wide = failed(await raw.call("raw.emit", shape="blocks", megabytes=0))
        deep = failed(await raw.call("raw.emit", shape="deep", megabytes=0))
    print(f"\nwide and deep answers: {cost}")
    assert "result.content holds 35,000 values" in wide and "fault in the server" in wide
    assert "not JSON-RPC" in deep and "did not answer" not in deep
    assert cost.max_gap < 0.5, cost
    assert ok(await raw.call("raw.emit", shape="small", megabytes=0)) == "emitted small"
    assert raw.server.connects == 1


async def test_an_answer_that_is_no_tool_result_fails_only_its_own_call(raw: Harness) -> None:
    """It used to be taken for a broken connection: the server was restarted, and the
    other sessions' calls running on it failed."""
    other = asyncio.create_task(raw.call("raw.emit", shape="small", megabytes=0))
    message = failed(await raw.call("raw.emit", shape="malformed", megabytes=0))
    assert "is not an MCP tool result (content: Input should be a valid list)" in message
    assert "pydantic.dev" not in message
    assert ok(await other) == "emitted small"
    assert raw.server.connects == 1


async def test_a_server_flooding_the_node_is_read_at_its_pace_and_noted_once(
    raw: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """60,000 notifications and junk lines: one warning a line was 7 MB of log in 11 s."""
    caplog.set_level(logging.WARNING, logger="tools.providers.mcp")
    assert ok(await raw.call("raw.emit", shape="flood", megabytes=0)) == "emitted flood"
    warnings = [r for r in caplog.records if r.name == "tools.providers.mcp"]
    assert 1 <= len(warnings) <= 2, [r.getMessage()[:120] for r in warnings]
    assert raw.server.connects == 1


async def test_an_http_servers_json_answer_too_wide_fails_its_call_at_once(
    tmp_path: Path,
) -> None:
    """Over HTTP the SDK validates a JSON answer on the loop: the transport's capped
    body refuses an array of over 1,024 values before it does."""
    with mcp_http_server(json_response=True) as process:
        spec = McpServerSpec(name="calc", url=process.url, timeout=TIMEOUT)
        async for harness in _started(spec, tmp_path):
            assert ok(await harness.call("calc.blocks", count=3)) == "x\n\nx\n\nx"
            async with footprint() as cost:
                message = failed(await harness.call("calc.blocks", count=15_000))
            print(f"\n15,000 blocks over HTTP (JSON): {cost}")
            assert "result.content holds 15,000 values" in message
            assert "fault in the server" in message
            assert cost.max_gap < 0.5, cost
            assert ok(await harness.call("calc.add", a=2, b=3)) == 5
            assert harness.server.connects == 1


async def test_an_http_servers_event_too_wide_fails_its_call_at_once(tmp_path: Path) -> None:
    """An event-stream answer of 35,000 blocks (945 KB) held the loop 0.9 s a call as
    the SDK validated it: the transport outlines a large event first."""
    process = McpHttpProcess(SSE_SERVER).start()
    try:
        spec = McpServerSpec(name="sse", url=process.url, timeout=TIMEOUT)
        async for harness in _started(spec, tmp_path):
            assert ok(await harness.call("sse.echo", text="hi")) == "echo hi"
            assert ok(await harness.call("sse.blocks", count=3)) == "x\n\nx\n\nx"
            async with footprint() as cost:
                message = failed(await harness.call("sse.blocks", count=35_000))
            print(f"\n35,000 blocks in one event: {cost}")
            assert "result.content holds 35,000 values" in message
            assert "fault in the server" in message
            assert cost.max_gap < 0.5, cost
            assert ok(await harness.call("sse.echo", text="again")) == "echo again"
            # 20,000 notifications before an answer: read at ServerPace's rate, the rest
            # dropped unvalidated, and the answer still comes.
            assert ok(await harness.call("sse.echo", text="flood")) == "echo flood"
            assert harness.server.connects == 1
    finally:
        process.stop()
