"""Every run of one call carries one key (issue 28): HTTP, built-ins, the executor's journal.

A node taking a session over reruns a call whose outcome was not logged,
under the same id and so the same key. An HTTP tool gets the key as the
``Idempotency-Key`` header (and in the body); the built-ins that change the
workspace return the first run's result instead of doing the work twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.calls import ToolCall, ToolResult
from protocol.journal import idempotency_key
from tools.base import ToolContext
from tools.builtin import default_registry
from tools.builtin.phone import phone_tools
from tools.done_markers import MARKER_DIR
from tools.executor import Executor
from tools.providers.http import HttpTool, HttpToolSpec, http_client
from tools.registry import Registry

from .servers.http_tool_server import ToolServer, tool_server

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def server() -> Iterator[ToolServer]:
    with tool_server() as srv:
        yield srv


async def test_an_http_tool_gets_the_calls_key_as_header_and_in_the_body(
    server: ToolServer, tmp_path: Path
) -> None:
    spec = HttpToolSpec(
        name="weather",
        url=server.base + "/weather",
        description="weather",
        parameters=CITY,
        headers={},
        timeout=5.0,
    )
    async with http_client() as client:
        executor = Executor(Registry([HttpTool(spec, client)]))
        ctx = ToolContext(workspace=tmp_path, session_id="sess-7")
        seen: list[tuple[int, ToolResult]] = []
        calls = [ToolCall("weather", {"city": "Oslo"}), ToolCall("weather", {"city": "Rome"})]
        for _ in range(2):  # a rerun of the same calls (same ids)
            await executor.run_batch(
                calls,
                ctx,
                ids=("call_3", "call_4"),
                on_result=lambda i, r: seen.append((i, r)),
            )
    keys = [idempotency_key("sess-7", "call_3"), idempotency_key("sess-7", "call_4")]
    by_city = {
        body["args"]["city"]: (body, headers["Idempotency-Key"])
        for body, headers in zip(server.requests, server.headers_seen, strict=True)
    }
    assert by_city["Oslo"][1] == by_city["Oslo"][0]["idempotency_key"] == keys[0]
    assert by_city["Rome"][1] == keys[1]
    assert by_city["Oslo"][0]["call_id"] == "call_3"
    assert {h["Idempotency-Key"] for h in server.headers_seen} == set(keys)  # 4 runs, 2 keys
    assert sorted(i for i, _ in seen) == [0, 0, 1, 1]  # each result told as it finished
    assert all(r.status == "success" for _, r in seen)


async def test_a_rerun_of_a_finished_write_or_shell_does_not_do_it_again(tmp_path: Path) -> None:
    executor = Executor(default_registry(enable_shell=True))
    ctx = ToolContext(workspace=tmp_path, session_id="sess-7")
    calls = [
        ToolCall("write", {"path": "a.txt", "content": "first"}),
        ToolCall("shell", {"command": "echo ran >> log.txt; echo done"}),
    ]
    first = await executor.run_batch(calls, ctx, ids=("call_1", "call_2"))
    (tmp_path / "a.txt").write_text("changed since")
    again = await executor.run_batch(calls, ctx, ids=("call_1", "call_2"))
    assert again == first
    assert (tmp_path / "a.txt").read_text() == "changed since"  # not written twice
    assert (tmp_path / "log.txt").read_text() == "ran\n"  # not run twice
    # Another call (another id) does the work.
    await executor.run_batch(calls[1:], ctx, ids=("call_9",))
    assert (tmp_path / "log.txt").read_text() == "ran\nran\n"
    # Without ids (no key) nothing is recorded: every run does the work.
    await executor.run_batch(calls[1:], ctx)
    assert (tmp_path / "log.txt").read_text() == "ran\nran\nran\n"
    assert len(list((tmp_path / MARKER_DIR).iterdir())) == 3


async def test_a_failed_run_is_not_recorded(tmp_path: Path) -> None:
    executor = Executor(default_registry())
    ctx = ToolContext(workspace=tmp_path, session_id="sess-7")
    edit = [ToolCall("edit", {"path": "a.txt", "old": "x", "new": "y"})]
    [failed] = await executor.run_batch(edit, ctx, ids=("call_1",))
    assert failed.status == "failure"
    (tmp_path / "a.txt").write_text("x")
    [done] = await executor.run_batch(edit, ctx, ids=("call_1",))
    assert done.status == "success" and (tmp_path / "a.txt").read_text() == "y"


class _CountingCall:
    """A phone edge that counts what the call tools ask of it."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def end_call(self, session_id: str) -> str:
        self.asked.append(("end", session_id))
        return "the call ended"

    async def transfer_call(self, session_id: str, to: str) -> str:
        self.asked.append(("transfer", to))
        return f"transferring to {to}"

    async def send_dtmf(self, session_id: str, digits: str) -> str:
        self.asked.append(("dtmf", digits))
        return f"pressed {digits}"


async def test_a_rerun_of_a_finished_call_tool_does_not_act_on_the_call_again(
    tmp_path: Path,
) -> None:
    control = _CountingCall()
    executor = Executor(Registry(phone_tools(control)))
    ctx = ToolContext(workspace=tmp_path, session_id="sess-7")
    calls = [
        ToolCall("send_dtmf", {"digits": "12#"}),
        ToolCall("transfer_call", {"to": "+15551234567"}),
    ]
    first = await executor.run_batch(calls, ctx, ids=("call_1", "call_2"))
    again = await executor.run_batch(calls, ctx, ids=("call_1", "call_2"))  # a takeover's rerun
    assert again == first and all(r.status == "success" for r in first)
    # Each acted once; a batch's calls run concurrently, so in either order.
    assert sorted(control.asked) == [("dtmf", "12#"), ("transfer", "+15551234567")]
    await executor.run_batch([ToolCall("end_call", {})], ctx, ids=("call_3",))
    assert control.asked[-1] == ("end", "sess-7")  # another call acts
