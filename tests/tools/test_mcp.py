"""MCP tools against a real MCP server (the SDK's MCPServer) over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from protocol.calls import ToolCall, ToolResult
from tools.base import ToolContext
from tools.executor import Executor
from tools.providers.mcp import McpServer, McpServerSpec
from tools.registry import Registry

from .servers.mcp_http import SERVER, McpHttpProcess, mcp_http_server


def stdio_spec(timeout: float = 10.0) -> McpServerSpec:
    return McpServerSpec(name="calc", command=(sys.executable, str(SERVER)), timeout=timeout)


class Harness:
    def __init__(self, server: McpServer, registry: Registry, ctx: ToolContext) -> None:
        self.server = server
        self.registry = registry
        self.executor = Executor(registry, timeout=30.0)
        self.ctx = ctx

    async def call(self, tool: str, /, **args: Any) -> ToolResult:
        return await self.executor.run_call(ToolCall(name=tool, args=args), self.ctx)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path, session_id="sess-42")


async def _harness(spec: McpServerSpec, ctx: ToolContext) -> AsyncIterator[Harness]:
    # The short call timeouts below are what the tests are about; starting a
    # Python with the SDK may take longer than them on a busy machine.
    server = McpServer(
        spec, backoff_first=0.05, backoff_max=0.2, ping_interval=0.5, connect_timeout=30.0
    )
    tools = await server.start()
    try:
        yield Harness(server, Registry(tools), ctx)
    finally:
        await server.close()


@pytest.fixture
async def stdio(ctx: ToolContext) -> AsyncIterator[Harness]:
    async for harness in _harness(stdio_spec(timeout=3.0), ctx):
        yield harness


@pytest.fixture
def http_server() -> Any:
    with mcp_http_server() as server:
        yield server


@pytest.fixture
async def http(http_server: McpHttpProcess, ctx: ToolContext) -> AsyncIterator[Harness]:
    spec = McpServerSpec(name="calc", url=http_server.url, timeout=3.0)
    async for harness in _harness(spec, ctx):
        yield harness


@pytest.fixture(params=["stdio", "http"])
def mcp(request: pytest.FixtureRequest) -> Harness:
    harness: Harness = request.getfixturevalue(str(request.param))
    return harness


async def test_the_servers_tools_are_listed_with_their_schemas(mcp: Harness) -> None:
    names = mcp.registry.names()
    assert {"calc.add", "calc.secret", "calc.slow"} <= set(names)
    spec = next(s for s in mcp.registry.specs() if s.name == "calc.add")
    assert spec.description == "Add two integers."
    assert spec.parameters["properties"]["a"]["type"] == "integer"
    assert spec.parameters["required"] == ["a", "b"]


async def test_a_call_returns_the_tools_answer_and_carries_the_session_id(mcp: Harness) -> None:
    assert await mcp.call("calc.add", a=2, b=40) == ToolResult("calc.add", "success", 42)
    result = await mcp.call("calc.secret", name="x")
    assert result == ToolResult("calc.secret", "success", "hello x, session sess-42")


async def test_args_that_do_not_match_the_schema_never_reach_the_server(mcp: Harness) -> None:
    result = await mcp.call("calc.add", a=1, b="two")
    assert result.status == "failure"
    assert "args.b: \"two\" is not of type 'integer'" in result.content
    missing = await mcp.call("calc.add", a=1)
    assert "'b' is a required property" in missing.content


async def test_an_error_reported_by_the_tool_is_a_failure_with_its_text(mcp: Harness) -> None:
    result = await mcp.call("calc.refuse", reason="no budget left")
    assert result.status == "failure" and "no budget left" in result.content


async def test_images_become_a_short_note(mcp: Harness) -> None:
    result = await mcp.call("calc.picture")
    assert result.status == "success"
    assert result.content.startswith("a tiny picture\n\n[image (image/png, ")
    assert "not shown" in result.content


async def test_a_call_that_takes_too_long_fails_within_the_timeout(mcp: Harness) -> None:
    started = time.monotonic()
    result = await mcp.call("calc.slow", seconds=30)
    assert result.status == "failure" and "did not answer within 3s" in result.content
    assert time.monotonic() - started < 10  # liveness: answered, not hung
    assert (await mcp.call("calc.add", a=1, b=1)).content == 2


@pytest.fixture
async def patient_stdio(ctx: ToolContext) -> AsyncIterator[Harness]:
    """A stdio server whose calls may wait out a restart: a Python with the SDK
    may take more than the 3 s of ``stdio`` to start on a busy machine."""
    async for harness in _harness(stdio_spec(timeout=30.0), ctx):
        yield harness


async def test_a_crash_mid_call_is_a_failure_and_the_server_is_restarted(
    patient_stdio: Harness,
) -> None:
    stdio = patient_stdio
    first_pid = (await stdio.call("calc.pid")).content
    result = await stdio.call("calc.crash")
    assert result.status == "failure"
    assert "calc" in result.content
    # Its last stderr line is its operator's (the log has it), not the model's or a
    # client's: found from outside, a database password reached both.
    assert "Pa55w0rd" not in str(result.content), result
    # The supervisor starts a new child; the next call reaches it.
    after = await stdio.call("calc.pid")
    assert after.status == "success", after
    assert after.content != first_pid
    assert stdio.server.connects == 2


async def test_an_http_server_that_goes_away_is_reported_down_then_reconnected(
    http_server: McpHttpProcess, http: Harness
) -> None:
    http_server.stop()
    started = time.monotonic()
    result = await http.call("calc.add", a=1, b=2)
    assert result.status == "failure"
    assert "calc" in result.content
    assert time.monotonic() - started < 10
    down = await http.call("calc.add", a=1, b=2)
    assert down.status == "failure" and "down" in down.content
    # Back on the same port: the session is reconnected.
    with mcp_http_server(port=http_server.port):
        # The supervisor reconnects after its backoff: a call until then fails naming it.
        async with asyncio.timeout(30):
            while (again := await http.call("calc.add", a=1, b=2)).status != "success":
                assert "MCP server 'calc'" in again.content, again
                await asyncio.sleep(0.05)
        assert again == ToolResult("calc.add", "success", 3)
        assert http.server.connects == 2


async def test_a_command_that_does_not_exist_fails_the_start_at_once() -> None:
    spec = McpServerSpec(name="calc", command=("no-such-mcp-server", "--stdio"), timeout=30.0)
    started = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        await McpServer(spec).start()
    assert str(info.value) == (
        "could not be started (FileNotFoundError: [Errno 2] No such file or directory: "
        "'no-such-mcp-server')"
    )
    assert time.monotonic() - started < 2  # not retried until the 30 s timeout


async def test_a_server_that_exits_at_once_fails_the_start_with_its_last_words() -> None:
    code = "import sys; print('Traceback (most recent call last):\\nRuntimeError: no config', file=sys.stderr); sys.exit(3)"
    spec = McpServerSpec(name="calc", command=(sys.executable, "-c", code), timeout=30.0)
    started = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        await McpServer(spec).start()
    assert str(info.value) == (
        "exited with status 3 before it answered (last stderr line: RuntimeError: no config)"
    )
    assert time.monotonic() - started < 5


async def test_a_server_that_never_answers_fails_the_start_after_the_sections_timeout() -> None:
    spec = McpServerSpec(
        name="calc", command=(sys.executable, "-c", "import sys; sys.stdin.read()"), timeout=1.0
    )
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="did not connect within 1s"):
        await McpServer(spec).start()
    assert time.monotonic() - started < 5  # 1 s, then the child is stopped


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_gateway_serve_stops_at_once_with_one_line_naming_the_server(tmp_path: Path) -> None:
    tools = tmp_path / "tools.toml"
    tools.write_text('[mcp.broken]\ncommand = ["python3", "-c", "import no_such_module"]\n')
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--tools", str(tools)],
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "REDIS_URL": "", "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path,
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    print(f"\n{elapsed:.1f} s to exit {done.returncode}:\n{output}")
    assert done.returncode == 2, output
    assert "Traceback" not in output
    [line] = [line for line in output.splitlines() if "[mcp.broken]" in line]
    assert "exited with status 1 before it answered" in line
    assert "ModuleNotFoundError: No module named 'no_such_module'" in line
    assert elapsed < 15  # mostly the gateway's own imports; it was 20-30 s of retries


async def test_values_the_server_was_given_from_the_environment_are_scrubbed(
    ctx: ToolContext,
) -> None:
    spec = McpServerSpec(
        name="calc",
        command=(sys.executable, str(SERVER)),
        env={"CALC_KEY": "mcp-key-0123456789", "CALC_OOPS": "mcp-error-secret!"},
        timeout=10.0,
        secrets=(("CALC_KEY", "mcp-key-0123456789"), ("CALC_OOPS", "mcp-error-secret!")),
    )
    async for harness in _harness(spec, ctx):
        said = await harness.call("calc.config", variable="CALC_KEY")
        assert said == ToolResult("calc.config", "success", "CALC_KEY=[redacted:CALC_KEY]")
        failed = await harness.call("calc.config", variable="CALC_OOPS")
        assert failed.status == "failure"
        assert "refusing with [redacted:CALC_OOPS]" in failed.content
        assert "mcp-error-secret" not in failed.content
