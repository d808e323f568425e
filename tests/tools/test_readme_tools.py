"""The tools file and MCP server of docs/tools.md, run through a real gateway node.

The code blocks are read from docs/tools.md itself, so the example cannot rot:
the simulator's ``/tool calc.secret`` and ``/tool weather`` messages make the
model call the tools, and the ``result`` event must carry their real answers.
"""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.app import running_gateway
from gateway.config import ConfigError, load_config
from gateway.edge.server import Gateway
from gateway.sessions.node import Node
from protocol.events import Result
from tests.support.client import GatewayClient, text_of

from .servers.http_tool_server import ToolServer, tool_server

DOC = Path(__file__).parents[2] / "docs" / "tools.md"


def readme_block(language: str) -> str:
    text = DOC.read_text()
    section = text[text.index("## Your own tools") :]
    end = section.find("\n## ", 5)
    section = section if end < 0 else section[:end]
    match = re.search(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert match, f"no {language} block in docs/tools.md 'Your own tools'"
    return match[1]


@pytest.fixture
def weather() -> Any:
    with tool_server() as server:
        yield server


@pytest.fixture
def tools_dir(tmp_path: Path, weather: ToolServer) -> Path:
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "calc_server.py").write_text(readme_block("python"))
    toml = readme_block("toml")
    toml = toml.replace('"python3"', orjson.dumps(sys.executable).decode())
    toml = toml.replace("http://127.0.0.1:8080", weather.base)
    (folder / "tools.toml").write_text(toml)
    return folder


@pytest.fixture
async def gateway(
    tools_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("WEATHER_TOKEN", "s3cret")
    settings = {
        "port": 0,
        "workspace_root": str(tmp_path / "ws"),
        "tools_file": str(tools_dir / "tools.toml"),
    }
    async with running_gateway(load_config(settings, env={})) as gw:
        yield gw


def _node(gw: Gateway) -> Node:
    node: Node = gw.node
    return node


async def _results(client: GatewayClient, message: str) -> list[dict[str, Any]]:
    events = await client.turn(message)
    result = next(e for e in events if isinstance(e, Result))
    results: list[dict[str, Any]] = orjson.loads(result.content)
    return results


async def test_the_readme_tools_answer_through_a_gateway(gateway: Gateway) -> None:
    prompt = _node(gateway).setups.system_prompt
    assert "- calc.secret: The secret greeting for NAME." in prompt
    assert '"city":{"type":"string"}' in prompt and "- weather:" in prompt
    assert "- read:" in prompt and "- write:" not in prompt  # [builtin] enable

    client = await GatewayClient.connect(gateway.url)
    [secret] = await _results(client, '/tool calc.secret {"name": "x"}')
    assert secret == {
        "tool": "calc.secret",
        "status": "success",
        "content": f"hello x, your session is {client.sid}",
    }
    [forecast] = await _results(client, '/tool weather {"city": "Oslo"}')
    assert forecast["status"] == "success"
    assert forecast["content"]["forecast"] == "rain in Oslo"
    # The endpoint got the header from the environment; its echo of it is scrubbed.
    assert forecast["content"]["auth"] == "[redacted:Authorization]"
    assert forecast["content"]["session_id"] == client.sid

    # Failure paths: the turn finishes with a failure result, the node keeps serving.
    [bad] = await _results(client, '/tool weather {"city": 5}')
    assert bad["status"] == "failure" and "args.city: 5 is not of type 'string'" in bad["content"]
    [unknown] = await _results(client, '/tool calc.nope {"a": 1}')
    assert unknown["status"] == "failure" and "unknown tool 'calc.nope'" in unknown["content"]
    events = await client.turn("still there?")
    assert text_of(events, "respond") == "Echo: still there?"
    await client.close()


async def test_a_bad_tools_file_is_a_config_error_naming_file_section_key(tmp_path: Path) -> None:
    path = tmp_path / "tools.toml"
    path.write_text(
        '[http.weather]\nurl = "http://127.0.0.1:1/w"\ndescription = "w"\n'
        'parameters = { type = "object" }\nretries = 3\n'
    )
    settings = {"port": 0, "workspace_root": str(tmp_path / "ws"), "tools_file": str(path)}
    with pytest.raises(ConfigError, match=r"tools\.toml, \[http\.weather\] retries: unknown key"):
        async with running_gateway(load_config(settings, env={})):
            pass
