"""GPT-Live (``gpt-live-*``) through a real gateway, against the simulator's live flavour.

``--provider openai --model gpt-live-1.1`` opens ``/v1/live/sessions`` with
``session.start`` (nothing reaches ``/v1/realtime``); a text session's answer
is the transcript of the model's speech, ended when it falls quiet; a client
delegation runs the session's delegation tool and the model speaks its result.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.app import running_gateway
from gateway.config import load_config
from gateway.sim.live import LiveConnection
from gateway.sim.model import Sim, SimConfig
from gateway.sim.server import serve_sim
from protocol.events import Call, Configured, Error, Event, Metric
from tests.support.client import GatewayClient

KEY = "live-key"
MODEL = "gpt-live-1.1"
DELEGATE = {
    "name": "delegate",
    "description": "Do the caller's task; answers what was found.",
    "parameters": {
        "type": "object",
        "properties": {"task": {"type": "string"}},
        "required": ["task"],
    },
}


def kind(event: Event) -> str:
    tag = type(event).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def merged(events: list[Event]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for event in events:
        name = kind(event)
        content = getattr(event, "content", "")
        if name in ("think", "respond") and out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + content)
        elif name in ("metric", "execute", "end", "call", "result", "interrupt"):
            out.append((name, ""))
        else:
            out.append((name, content))
    return out


@contextlib.asynccontextmanager
async def live_gateway(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[GatewayClient, Sim]]:
    async with serve_sim(SimConfig(flavor="openai", api_key=KEY)) as sim:
        config = {
            "provider": "openai",
            "openai_base_url": sim.url,
            "openai_api_key": KEY,
            "model": MODEL,
            "port": 0,
            "workspace_root": str(tmp_path / "ws"),
            **settings,
        }
        async with running_gateway(load_config(config, env={})) as gateway:
            client = await GatewayClient.connect(gateway.url)
            try:
                yield client, sim
            finally:
                await client.close()


async def test_a_text_turn_is_answered_from_the_transcript_over_the_live_endpoint(
    tmp_path: Path,
) -> None:
    async with live_gateway(tmp_path) as (client, sim):
        events = await client.turn("hello")
        live = [conn for conn in sim.live() if isinstance(conn, LiveConnection)]
        others = [conn for conn in sim.live() if not isinstance(conn, LiveConnection)]
        audio = [frame for frame in client.events if isinstance(frame, bytes)]
    assert merged(events) == [
        ("user", "hello"),
        ("respond", "Echo: hello"),
        ("end", ""),
        ("metric", ""),
    ]
    assert len(live) == 1 and not others  # nothing on /v1/realtime
    assert live[0].config is not None and live[0].config.model == MODEL
    assert not audio  # a text client gets the transcript, not the speech


@pytest.mark.parametrize("name", ["delegate", "find_order"])
async def test_a_client_delegation_runs_the_delegate_tool_and_the_model_speaks_its_result(
    tmp_path: Path, name: str
) -> None:
    # "delegate", or the app's only tool whatever its name: the gateway's own tools
    # (the built-ins on the workspace) are not what an app means a delegation for.
    async with live_gateway(tmp_path) as (client, _):
        await client.send({"type": "configure", "tools": [{**DELEGATE, "name": name}]})
        got = await client.until(lambda e: isinstance(e, Configured | Error))
        assert isinstance(got[-1], Configured), got[-1]
        await client.user("/tool look it up")
        calls = await client.until(lambda e: isinstance(e, Call))
        call = calls[-1]
        assert isinstance(call, Call) and call.runs_on == "client"
        assert orjson.loads(call.content) == {
            "name": name,
            "args": {"task": "/tool look it up"},
        }
        await client.send(
            {"type": "tool_result", "id": call.id, "status": "success", "content": "3 apples"}
        )
        rest = await client.until_type("end")
    shape = merged(calls + rest)
    # The model's acknowledgement belongs to the turn that delegated, before its call.
    assert shape[:6] == [
        ("user", "/tool look it up"),
        ("respond", "One moment."),
        ("call", ""),
        ("execute", ""),
        ("metric", ""),
        ("result", ""),
    ]
    assert shape[-1] == ("end", "") and shape[-2][0] == "respond"
    assert "Here is what I found:" in shape[-2][1] and "3 apples" in shape[-2][1]


async def test_an_azure_gpt_live_deployment_opens_the_resources_live_endpoint(
    tmp_path: Path,
) -> None:
    async with serve_sim(SimConfig(flavor="azure", api_key=KEY)) as sim:
        config = {
            "provider": "azure",
            "azure_base_url": sim.url,
            "azure_api_key": KEY,
            "model": "gpt-live-1.1",
            "port": 0,
            "workspace_root": str(tmp_path),
        }
        async with running_gateway(load_config(config, env={})) as gateway:
            client = await GatewayClient.connect(gateway.url)
            events = await client.turn("hello")
            live = [conn for conn in sim.live() if isinstance(conn, LiveConnection)]
            await client.close()
    assert ("respond", "Echo: hello") in merged(events)
    assert len(live) == 1 and live[0].ws.request is not None
    assert live[0].ws.request.path == "/openai/v1/live/sessions"


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        ({"truncation": "auto"}, "truncation"),
        # GPT-Live decides turns: a client's commit would find the model answering.
        ({"input_audio": {"rate": 24000, "turn_detection": "none"}}, "turn_detection"),
    ],
)
async def test_a_control_gpt_live_has_not_is_refused_when_the_session_is_set_up(
    tmp_path: Path, asked: dict[str, Any], named: str
) -> None:
    async with live_gateway(tmp_path) as (client, sim):
        await client.send({"type": "configure", **asked})
        got = await client.until(lambda e: isinstance(e, Configured | Error))
        opened = list(sim.live())
    error = got[-1]
    assert isinstance(error, Error), error
    assert named in error.content and "provider openai" in error.content
    assert not opened  # refused before any connection


async def test_a_responses_delegations_function_call_runs_the_gateways_server_tool(
    tmp_path: Path,
) -> None:
    settings = {"openai_live_delegation": "responses", "openai_live_backend_model": "gpt-5.5"}
    async with live_gateway(tmp_path, **settings) as (client, sim):
        events = await client.turn('/tool list {"path": "."}')
        [conn] = [c for c in sim.live() if isinstance(c, LiveConnection)]
    assert conn.config is not None and conn.config.delegation is not None
    backend = conn.config.delegation.responses or {}
    assert backend["model"] == "gpt-5.5"
    assert "list" in {tool["name"] for tool in backend["tools"]}
    shape = merged(events)
    assert shape[:6] == [
        ("user", '/tool list {"path": "."}'),
        ("respond", "One moment."),
        ("call", ""),
        ("execute", ""),
        ("metric", ""),
        ("result", ""),
    ]
    call = next(e for e in events if isinstance(e, Call))
    assert call.runs_on == "gateway"
    assert orjson.loads(call.content) == {"name": "list", "args": {"path": "."}}
    assert shape[-2:] == [("end", ""), ("metric", "")]
    assert shape[-3][0] == "respond" and shape[-3][1].startswith("The tool list returned")


async def test_a_lost_connection_reruns_the_turn_with_the_history_in_session_start(
    tmp_path: Path,
) -> None:
    # 4 characters a chunk: the first answer is 6 chunks, the second 4; every connection
    # drops after 8, so the first is cut 2 chunks into the second answer, the rerun is not.
    knobs = SimConfig(flavor="openai", api_key=KEY, drop_after=8, chunk_size=4)
    async with serve_sim(knobs) as sim:
        config = {
            "provider": "openai",
            "openai_base_url": sim.url,
            "openai_api_key": KEY,
            "model": MODEL,
            "port": 0,
            "workspace_root": str(tmp_path),
        }
        async with running_gateway(load_config(config, env={})) as gateway:
            client = await GatewayClient.connect(gateway.url)
            await client.turn("hi there my friend")
            events = await client.turn("a question")
            histories = [conn.snapshot().messages() for conn in sim.live()]
            await client.close()
    shape = merged(events)
    assert ("interrupt", "") in shape
    assert shape[-3] == ("respond", "Echo: a question")
    assert sim.stats.connections_total == 2
    # The new connection was given the conversation so far in session.start's input.
    # As plain speech: the gateway's text-protocol markers (``<end>``) are not given to it.
    assert histories[-1][:2] == [
        ("user", "hi there my friend"),
        ("assistant", "Echo: hi there my friend"),
    ]


async def test_a_sessions_cost_is_its_billable_seconds_at_the_active_minute_rate(
    tmp_path: Path,
) -> None:
    """No tokens: GPT-Live reports cumulative seconds, and each turn's metric carries
    the seconds since the previous one, priced at $0.05 a minute."""
    async with live_gateway(tmp_path) as (client, _):
        metrics: list[Metric] = []
        for text in ("one", "two", "three"):
            events = await client.turn(text)
            metrics += [e for e in events if isinstance(e, Metric)]
    last = metrics[-1]
    assert last.total.input == last.total.output == 0
    assert last.total.seconds >= 1  # three turns, each ended by a second of quiet
    assert last.total.seconds == sum(m.step.seconds for m in metrics)
    assert last.cost.total == pytest.approx(last.total.seconds / 60 * 0.05)
