"""``shell``: off by default; when on, it runs in the workspace and cleans up after itself."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from protocol.calls import ToolCall, ToolResult
from tools.base import Limits, ToolContext
from tools.builtin import default_registry
from tools.builtin.shell import ShellTool
from tools.executor import Executor
from tools.registry import Registry
from tools.sandbox import workspace_root

from .helpers import Call, failed, ok


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie awaiting its reaper counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def run_shell(tool: ShellTool, ctx: ToolContext, command: str) -> ToolResult:
    return await Executor(Registry([tool])).run_call(ToolCall("shell", {"command": command}), ctx)


async def test_shell_is_not_available_by_default(ctx: ToolContext) -> None:
    [result] = await Executor(default_registry()).run_batch(
        [ToolCall("shell", {"command": "echo hi"})], ctx
    )
    message = failed(result)
    assert "unknown tool 'shell'" in message
    assert "available tools: read, write, edit, list, find, search." in message


async def test_shell_runs_in_the_workspace_and_reports_exit_code(
    call: Call, workspace: Path
) -> None:
    (workspace / "data.txt").write_text("42\n")
    result = ok(await call("shell", command="pwd; cat data.txt; echo oops >&2; exit 3"))
    # A non-zero exit is still a successful call: the command ran and here is what it said.
    assert result == {
        "exit_code": 3,
        "stdout": f"{workspace}\n42\n",  # tmp_path is already resolved
        "stderr": "oops\n",
    }


async def test_shell_does_not_pass_the_gateways_environment_on(
    call: Call, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    result = ok(await call("shell", command="env"))
    assert "sk-must-not-leak" not in result["stdout"]
    assert "PATH=" in result["stdout"]


async def test_shell_timeout_kills_the_whole_process_group(ctx: ToolContext) -> None:
    # A background child that would outlive its shell if only the shell were killed.
    result = await run_shell(ShellTool(timeout=1.0), ctx, "sleep 60 & echo $!; echo started; wait")
    message = failed(result)
    assert "timed out after 1s and was killed" in message
    assert "stdout so far:\n" in message and "started" in message
    match = re.search(r"stdout so far:\n(\d+)\n", message)
    assert match, message
    assert not running(int(match[1])), "the background sleep must be killed with its shell"


async def test_cancelling_a_batch_kills_the_running_command(
    ctx: ToolContext, workspace: Path
) -> None:
    fifo = workspace / "started"
    os.mkfifo(fifo)
    executor = Executor(Registry([ShellTool(timeout=30)]))
    batch = asyncio.create_task(
        executor.run_batch(
            [ToolCall("shell", {"command": "echo $$ > started; exec sleep 60"})], ctx
        )
    )
    # Opening the FIFO blocks until the command writes its pid: proof it is running.
    pid = int(await asyncio.to_thread(fifo.read_text))
    assert running(pid)
    batch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await batch
    assert not running(pid)


async def test_shell_output_is_capped_per_stream(ctx: ToolContext) -> None:
    result = ok(
        await run_shell(
            ShellTool(max_output=100), ctx, "head -c 100000 /dev/zero | tr '\\0' a; echo err >&2"
        )
    )
    assert result["stdout"] == "a" * 100 + (
        "\n[output truncated: 100,000 bytes, showing the first 100]"
    )
    assert result["stderr"] == "err\n"
    assert result["exit_code"] == 0


async def test_shell_has_no_stdin(call: Call) -> None:
    """A command waiting for input gets EOF at once instead of hanging to the timeout."""
    result = ok(await call("shell", command="cat; echo done"))
    assert result["stdout"] == "done\n"


async def test_shell_description_states_its_timeout() -> None:
    assert "killed after 5s" in ShellTool(timeout=5).description


# --- guarantees added for issue 13 ----------------------------------------------


async def test_background_processes_are_killed_when_the_command_succeeds(call: Call) -> None:
    result = ok(await call("shell", command="sleep 60 >/dev/null 2>&1 & echo $!"))
    assert result["exit_code"] == 0
    pid = int(result["stdout"].strip())
    for _ in range(100):  # SIGKILL is delivered asynchronously; reaping takes a moment
        if not running(pid):
            break
        await asyncio.sleep(0.02)
    assert not running(pid), "a background process outlived its shell call"


async def test_shell_environment_is_an_allow_list(
    call: Call, monkeypatch: pytest.MonkeyPatch, workspace: Path
) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", "g-must-not-leak")
    monkeypatch.setenv("REDIS_URL", "redis://user:pw@host/0")
    monkeypatch.setenv("RTGW_SOMETHING", "node-setting")
    result = ok(await call("shell", command="env"))
    names = {line.split("=", 1)[0] for line in result["stdout"].splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "PWD", "LANG", "TERM", "SHLVL", "_", "OLDPWD"}, names
    assert f"HOME={workspace_root(workspace)}" in result["stdout"]


async def test_a_file_the_command_writes_cannot_pass_the_workspace_quota(
    workspace: Path,
) -> None:
    ctx = ToolContext(workspace, "s", Limits(max_workspace_bytes=100_000))
    (workspace / "existing").write_bytes(b"x" * 40_000)
    result = ok(await run_shell(ShellTool(), ctx, "head -c 1000000 /dev/zero > big; echo $?"))
    # head was stopped by SIGXFSZ at the 60,000 bytes left: the workspace is at its quota.
    assert (workspace / "big").stat().st_size == 60_000
    assert "workspace quota of 100,000 bytes" in result["note"]


async def test_a_command_that_leaves_the_workspace_over_quota_fails_and_says_what_to_do(
    workspace: Path,
) -> None:
    ctx = ToolContext(workspace, "s", Limits(max_workspace_bytes=20_000))
    command = "for i in 1 2 3 4; do head -c 9000 /dev/zero > f$i; done; echo wrote"
    message = failed(await run_shell(ShellTool(), ctx, command))
    assert "over its 20,000-byte quota; delete files" in message
    assert "wrote" in message
    # Over quota, write refuses to grow the workspace, and deleting makes room again.
    executor = Executor(default_registry(enable_shell=True))
    refused = await executor.run_call(ToolCall("write", {"path": "g", "content": "x"}), ctx)
    assert "quota" in failed(refused)
    await executor.run_call(ToolCall("shell", {"command": "rm f1 f2 f3"}), ctx)
    ok(await executor.run_call(ToolCall("write", {"path": "g", "content": "x"}), ctx))
