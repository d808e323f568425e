"""``gateway chat`` as a user meets it: in a real terminal (pty) or with piped input."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from gateway.client.chat import COMMANDS
from gateway.client.loadtest import sized_message
from gateway.edge.server import Gateway
from tests.client.terminal import Terminal
from tests.gateway.conftest import GatewayFactory
from tests.support.redis_server import free_port


async def test_ctrl_c_cancels_a_running_turn_then_exits_at_the_prompt(
    gateway_factory: GatewayFactory,
) -> None:
    async with gateway_factory(sim_tokens_per_second=20.0) as gw:
        term = await Terminal.start("chat", gw.url, "--no-color")
        try:
            await term.expect("/help lists commands")
            term.type(sized_message("a long answer", 400) + "\n")
            await term.expect("Echo: a lo")
            term.type("\x03")
            await term.expect("cancelled")
            term.type("\x03")  # at the prompt: leave
            assert await term.wait() == 0
        finally:
            term.close()


async def test_help_lists_the_commands_and_cancel_works(gateway_factory: GatewayFactory) -> None:
    async with gateway_factory(sim_tokens_per_second=20.0) as gw:
        term = await Terminal.start("chat", gw.url, "--no-color")
        try:
            banner = await term.expect_re(r"\[session ([A-Za-z0-9_-]+) \(new\) at seq 0\]")
            sid = banner[1]
            await term.expect("/help lists commands")
            term.type("/help\n")
            await term.expect("/help\n")  # the typed line's echo: the answer comes after it
            for command, meaning in COMMANDS.items():  # each line of the list, in order
                await term.expect(f"  {command:<9} {meaning}\n")
            await term.expect("  anything else is sent to the model\n")
            term.type(sized_message("more words", 400) + "\n")
            await term.expect("Echo: more")
            term.type("/cancel\n")
            await term.expect("cancelled")
            term.type("/session\n")
            await term.expect("/session\n")
            answer = await term.expect_re(rf"session {sid}, last seq (\d+)\n")
            assert int(answer[1]) > 3  # the cancelled turn's events were received
            term.type("/quit\n")
            assert await term.wait() == 0
        finally:
            term.close()


async def run_chat_command(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "chat",
        *args,
        "--no-color",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_an_http_url_without_the_path_is_corrected_in_one_line(gateway: Gateway) -> None:
    http = f"http://127.0.0.1:{gateway.port}"
    code, out, err = await run_chat_command(http, stdin=b"hello\n")
    assert code == 0, err
    assert err.strip() == f"gateway chat: using ws://127.0.0.1:{gateway.port}/v1/realtime"
    assert "Echo: hello" in out


async def test_a_gateway_that_is_not_running_is_one_line_and_an_exit() -> None:
    code, out, err = await run_chat_command(f"ws://127.0.0.1:{free_port()}/v1/realtime")
    assert code == 1
    assert len(err.strip().splitlines()) == 1
    assert "nothing is listening" in err and "gateway serve" in err
    assert "reconnecting" not in err + out


async def test_a_url_that_is_not_a_gateway_url_is_refused_in_one_line() -> None:
    code, _, err = await run_chat_command("ftp://127.0.0.1:1/")
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "ws://HOST:PORT/v1/realtime" in err


async def test_a_background_result_after_the_turn_is_shown(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    tools = tmp_path / "tools.toml"
    tools.write_text('[builtin]\nenable = ["shell"]\nbackground = ["shell"]\n')
    async with gateway_factory(tools_file=str(tools), enable_shell=True) as gw:
        term = await Terminal.start("chat", gw.url, "--no-color")
        try:
            await term.expect("/help lists commands")
            term.type('/tool shell {"command": "sleep 1; echo late-news"}\n')
            await term.expect("The tool started in the background; its result comes later.")
            await term.expect("[tokens:")  # the turn is over, the prompt is back
            await term.expect("late-news")  # its result, shown when it came
            await term.expect("The tool returned success.")  # and the model's answer to it
            term.type("/quit\n")
            assert await term.wait() == 0
        finally:
            term.close()
