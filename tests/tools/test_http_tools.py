"""HTTP tools against a real endpoint on 127.0.0.1 (stdlib http.server in a thread)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol.calls import ToolCall, ToolResult, encode_results
from tools.base import ToolContext
from tools.executor import Executor
from tools.providers.http import HttpTool, HttpToolSpec, http_client
from tools.registry import Registry

from .servers.http_tool_server import ToolServer, tool_server

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def server() -> Iterator[ToolServer]:
    with tool_server() as srv:
        yield srv


@pytest.fixture
async def call(server: ToolServer, tmp_path: Path) -> AsyncIterator[Any]:
    async with http_client() as client:
        tools = [
            HttpTool(
                HttpToolSpec(
                    name=path,
                    url=server.base + "/" + path,
                    description=f"the {path} tool",
                    parameters=CITY,
                    headers={"Authorization": "Bearer t0k"},
                    timeout=1.0,
                ),
                client,
            )
            for path in ("weather", "fail", "slow", "text", "missing", "lone")
        ]
        executor = Executor(Registry(tools), timeout=30.0)
        ctx = ToolContext(workspace=tmp_path, session_id="sess-7")

        async def run(tool: str, /, **args: Any) -> ToolResult:
            return await executor.run_call(ToolCall(name=tool, args=args), ctx)

        yield run


async def test_a_2xx_json_answer_is_the_result(call: Any, server: ToolServer) -> None:
    result = await call("weather", city="Oslo")
    assert result.status == "success"
    assert result.content == {
        "city": "Oslo",
        "forecast": "rain in Oslo",
        "session_id": "sess-7",
        "auth": "Bearer t0k",
    }
    sent = server.requests[-1]
    assert sent["args"] == {"city": "Oslo"} and sent["session_id"] == "sess-7"
    assert isinstance(sent["call_id"], str) and sent["call_id"]


async def test_a_non_2xx_answer_is_a_failure_with_status_and_body(call: Any) -> None:
    result = await call("fail", city="Oslo")
    assert result == ToolResult("fail", "failure", "'fail' answered HTTP 500: database on fire")
    missing = await call("missing", city="Oslo")
    assert "HTTP 404: no such tool" in missing.content


async def test_a_body_that_is_not_json_is_a_failure(call: Any) -> None:
    result = await call("text", city="Oslo")
    assert result.status == "failure" and "not JSON: just words" in result.content


async def test_a_lone_surrogate_in_an_answer_is_a_replacement_not_a_broken_turn(
    call: Any,
) -> None:
    """Found from outside: the JSON ``"\\ud800"`` passed the cut and failed the turn
    where the results were encoded (``UnicodeEncodeError``), every time it was asked."""
    result = await call("lone", city="Oslo")
    assert result == ToolResult("lone", "success", "? and more")
    assert encode_results([result])  # what the session sends the model


@pytest.mark.parametrize("path", ["echo500", "echo"])
async def test_a_secret_cut_through_by_a_limit_is_still_redacted(
    server: ToolServer, tmp_path: Path, path: str
) -> None:
    """Found from outside: an error body is shown up to 300 characters and a result is
    cut at its output limit before the secrets were scrubbed; a secret cut through
    was no longer found, and its first 30 characters reached the client."""
    key = "sk-live-ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789ab"
    spec = HttpToolSpec(
        path,
        server.base + "/" + path,
        "echoes",
        CITY,
        headers={"Authorization": f"Bearer {key}"},
        secrets=(("auth", f"Bearer {key}"), ("auth", key)),
    )
    async with http_client() as client:
        executor = Executor(Registry([HttpTool(spec, client)]), max_output=320)
        ctx = ToolContext(workspace=tmp_path, session_id="sess-7")
        result = await executor.run_call(ToolCall(name=path, args={"city": "Oslo"}), ctx)
    text = str(result.content)
    assert "[redacted" in text and "sk-live" not in text and "ABCDEFGH" not in text


async def test_a_slow_endpoint_fails_within_its_timeout(call: Any) -> None:
    started = time.monotonic()
    result = await call("slow", city="Oslo")
    assert result.status == "failure" and "did not answer within 1s" in result.content
    assert time.monotonic() - started < 4


async def test_bad_args_are_refused_before_any_request(call: Any, server: ToolServer) -> None:
    result = await call("weather", city=7)
    assert result.status == "failure"
    assert "args.city: 7 is not of type 'string'" in result.content
    assert "city (string, required)" in result.content
    assert server.requests == []


async def test_an_endpoint_that_is_down_is_a_failure(tmp_path: Path) -> None:
    with tool_server() as gone:
        url = gone.base + "/weather"
    async with http_client() as client:
        tool = HttpTool(HttpToolSpec("weather", url, "w", CITY, timeout=2.0), client)
        executor = Executor(Registry([tool]))
        result = await executor.run_call(
            ToolCall("weather", {"city": "Oslo"}), ToolContext(tmp_path, "s")
        )
    assert result.status == "failure" and "could not be reached" in result.content
