"""The first hour's last stumbles (issue 38), each as the user meets it: one line that
says what to do, and values that print as what they mean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from gateway.client import Client
from protocol.events import Call
from tests.gateway.conftest import GatewayFactory
from tests.support.procs import NodeProcess
from tests.support.redis_server import free_port


def _gateway(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *argv],
        capture_output=True,
        text=True,
        timeout=45,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "REDIS_URL": ""},
    )


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if " INFO " not in line]
    lines = [line for line in lines if "auth is OFF" not in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_failing_mcp_server_is_named_by_its_own_section(tmp_path: Path) -> None:
    tools = tmp_path / "tools.toml"
    tools.write_text(
        "[mcp.w]\n"
        f'command = ["{tmp_path / "no-such-server"}"]\n'
        "[http.w]\n"
        'url = "http://127.0.0.1:9/w"\n'
        'description = "an HTTP tool of the same name"\n'
        'parameters = { type = "object" }\n'
    )
    line = _one_line(_gateway("serve", "--port", "0", "--tools", str(tools)), 2)
    assert f"tools file {tools}, [mcp.w]: the MCP server" in line
    assert "[http.w]" not in line


def test_keys_add_where_no_file_can_be_made_says_what_to_do() -> None:
    line = _one_line(_gateway("keys", "add", "alice", "--file", "/proc/nope/keys"), 1)
    assert "Errno" not in line
    assert line.startswith("gateway keys: cannot write the keys file /proc/nope/keys (")
    assert "pass --file a path in a folder you may write" in line


def test_the_api_port_equal_to_the_port_is_one_port() -> None:
    port = free_port()
    with NodeProcess(["serve", "--port", str(port), "--api-port", str(port)]) as node:
        assert "another gateway" not in node.log
        request = urllib.request.Request(
            f"{node.http}/v1/sessions",
            data=b"{}",
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:  # the API, on that port
            assert answer.status == 201 and "session_id" in json.loads(answer.read())


@pytest.mark.parametrize("store_kind", ["memory"])  # the store makes no difference
async def test_a_calls_background_prints_as_a_bool(
    gateway_factory: GatewayFactory, store_kind: str
) -> None:
    async with gateway_factory() as gw, Client(gw.url) as c:
        events = [e async for e in c.send('/tool list {"path": "."}')]
    [call] = [e for e in events if isinstance(e, Call)]
    assert str(call.background) == "False"
    assert "background=False" in repr(call)
