"""The command line a user types: `gateway serve`, `gateway chat`, `gateway settings`."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from gateway.cli import main
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
        # It says where a person goes next: the page and the chat command.
        ws_url = node.url
        assert f"web page:  {node.http}/" in node.log
        assert f"terminal:  gateway chat {ws_url}" in node.log
        # numpy and soxr are imported as the node starts, with no client yet: the first
        # audio frame no longer imports them on the event loop (133-183 ms of /healthz).
        node.wait_for_lines(r"audio libraries \(numpy, soxr\) imported in \d+ ms", timeout=30)


def test_a_port_in_use_is_one_line_that_says_what_to_do() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _gateway("serve", "--port", str(port), env={"REDIS_URL": ""})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"gateway serve: 127.0.0.1:{port} is already in use (another gateway?); stop it, "
        "or choose another port with --port (0 picks a free one)"
    )


def _gateway(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def test_a_bad_flag_value_is_one_line_that_says_what_to_do() -> None:
    done = _gateway("serve", "--tool-timeout", "soon")
    assert done.returncode == 2
    assert done.stderr == (
        "gateway serve: --tool-timeout: 'soon' is not valid: use a number > 0 (default 30); "
        "see gateway serve --help\n"
    )


def test_a_bad_variable_is_one_line_that_names_it() -> None:
    done = _gateway("serve", env={"GATEWAY_PORT": "abc"})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "gateway: GATEWAY_PORT='abc' is not valid: use a whole number from 0 to 65535; "
        "set GATEWAY_PORT to that, or unset it to use the default (8765)"
    ]


class _Writes:
    """A stderr that keeps each write() apart, as another thread's log line would see them."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_the_line_a_refused_start_ends_with_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The node's audio import thread logs while it starts: a refusal written as text and
    then a newline let that log line in between, and the refusal's line was lost in it."""
    writes = _Writes()
    monkeypatch.setattr(sys, "stderr", writes)
    monkeypatch.setenv("GATEWAY_PORT", "abc")
    assert main(["serve"]) == 2
    assert len(writes.writes) == 1, writes.writes
    assert writes.writes[0].startswith("gateway: GATEWAY_PORT='abc' is not valid")
    assert writes.writes[0].endswith("\n")


def test_settings_shows_each_value_and_hides_secrets(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")
    monkeypatch.setenv("GATEWAY_MAX_STEPS", "7")
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert "sk-very-secret" not in out
    assert "openai_api_key = (set)" in out.splitlines()
    assert "max_steps = 7" in out.splitlines()
    assert "sim_chunk_size = 4" in out.splitlines()
