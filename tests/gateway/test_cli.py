"""The command line a user types: `gateway serve`, `gateway chat`."""

from __future__ import annotations

import asyncio
import sys
import urllib.request

from gateway.edge.server import Gateway
from tests.support.procs import NodeProcess


async def test_chat_shows_think_calls_results_and_the_answer(gateway: Gateway) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.cli",
        "chat",
        gateway.url,
        "--no-color",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    script = b'hello\n/tool list {"path": "."}\n'
    out, err = await asyncio.wait_for(proc.communicate(script), 30)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "thinking: The user said something." in text
    assert "Echo: hello" in text
    assert '→ list({"path":"."})' in text
    assert "← list [success]" in text
    assert "The tool returned success." in text
    # The second message waited for the first turn to end.
    assert "turn_active" not in text
    assert text.index("Echo: hello") < text.index("→ list")


def test_serve_with_embedded_defaults_answers_health_checks() -> None:
    # The README's run command: no Redis, no API key, the built-in simulator.
    with NodeProcess(["serve", "--port", "0"], env={"REDIS_URL": ""}) as node:
        with urllib.request.urlopen(node.http + "/healthz", timeout=10) as resp:
            assert resp.status == 200
        assert "in-process memory" in node.log
        assert "simulator" in node.log
