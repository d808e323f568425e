"""Text sessions on models that only speak, and Gemini's native session resumption.

Today's Gemini Live models answer in audio only (docs/providers.md): a text
session on them asks for audio with its transcript, takes the transcript as
the answer, the model's thoughts as ``think``, and its native function calls
as ``call``/``execute``/``result``; the audio never reaches a text client.
A goAway, a lost connection or a takeover continues the provider's own copy
of the conversation by its resumption handle instead of replaying history.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.app import running_gateway
from gateway.config import ConfigError, load_config
from gateway.sim.model import Sim, SimConfig
from gateway.sim.server import serve_sim
from protocol.events import Call, Event, Interrupt, Result
from tests.support.client import GatewayClient

KEY = "spoken-key"


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
async def gemini_gateway(
    tmp_path: Path, model: str = "", **knobs: Any
) -> AsyncIterator[tuple[GatewayClient, Sim]]:
    async with serve_sim(SimConfig(flavor="gemini", api_key=KEY, **knobs)) as sim:
        settings = {
            "provider": "gemini",
            "gemini_base_url": sim.url,
            "gemini_api_key": KEY,
            "model": model,
            "port": 0,
            "workspace_root": str(tmp_path),
        }
        async with running_gateway(load_config(settings, env={})) as gateway:
            client = await GatewayClient.connect(gateway.url)
            try:
                yield client, sim
            finally:
                await client.close()


async def test_a_text_session_on_todays_gemini_model_runs_a_tool_turn(tmp_path: Path) -> None:
    """The default model (gemini-3.8-live) refuses TEXT; the session takes its transcript."""
    async with gemini_gateway(tmp_path) as (client, _):
        events = await client.turn('/tool list {"path": "."}')
        plain = await client.turn("hello")
        audio = [frame for frame in client.events if isinstance(frame, bytes)]
    assert merged(events) == [
        ("user", '/tool list {"path": "."}'),
        ("call", ""),
        ("execute", ""),
        ("metric", ""),
        ("result", ""),
        ("respond", merged(events)[5][1]),
        ("end", ""),
        ("metric", ""),
    ]
    call = next(e for e in events if isinstance(e, Call))
    assert call.content == '{"name":"list","args":{"path":"."}}' and call.runs_on == "gateway"
    result = next(e for e in events if isinstance(e, Result))
    assert '"status":"success"' in result.content.replace(" ", "")
    assert merged(events)[5][1].startswith("The tool list returned")
    assert merged(plain)[1] == ("respond", "Echo: hello")
    assert not audio  # the model's speech is not sent to a text client


async def test_a_thinking_models_thoughts_are_think(tmp_path: Path) -> None:
    async with gemini_gateway(tmp_path, "gemini-3.8-live-extended-thinking") as (client, _):
        events = await client.turn("hello")
    assert merged(events)[:3] == [
        ("user", "hello"),
        ("think", "The user said something."),
        ("respond", "Echo: hello"),
    ]


async def test_a_go_away_resumes_by_handle_without_replaying_history(tmp_path: Path) -> None:
    async with gemini_gateway(tmp_path, "sim", go_away_after=3) as (client, sim):
        await client.turn("one")
        await client.turn("two")
        received = sim.stats.turns_received
        answer = await client.turn("/context")
    assert sim.stats.resumed_total >= 1
    # After the resumed connection, only the new message was sent: no history replay.
    assert sim.stats.turns_received - received == 1
    assert ("respond", "Context: 5 items") in merged(answer)


async def test_a_rerun_after_a_lost_connection_says_the_context_was_resumed(
    tmp_path: Path,
) -> None:
    async with gemini_gateway(tmp_path, "sim", drop_after=6, chunk_size=16) as (client, sim):
        await client.turn("hi")
        events = await client.turn("a longer question that is cut off")
    interrupts = [e for e in events if isinstance(e, Interrupt)]
    assert interrupts and interrupts[0].context == "resumed"
    assert merged(events)[-3][1].startswith("Echo: a longer question")
    assert sim.stats.resumed_total >= 1


async def test_a_shut_down_model_is_a_one_line_startup_error(tmp_path: Path) -> None:
    settings = {
        "provider": "gemini",
        "gemini_api_key": KEY,
        "model": "gemini-live-2.5-flash-preview",
        "port": 0,
        "workspace_root": str(tmp_path),
    }
    with pytest.raises(ConfigError) as info:
        async with running_gateway(load_config(settings, env={})):
            pass
    assert "shut down on 2025-12-09" in str(info.value)
    assert "gemini-2.5-flash-native-audio-preview-12-2025" in str(info.value)


async def test_a_background_native_call_is_non_blocking_and_answered_when_idle(
    tmp_path: Path,
) -> None:
    """A background tool on a model with native calls: declared NON_BLOCKING, the turn
    ends at once, and the call's output goes as a late function response (WHEN_IDLE)."""
    tools = tmp_path / "tools.toml"
    tools.write_text('[builtin]\nenable = ["shell"]\nbackground = ["shell"]\n')
    async with serve_sim(SimConfig(flavor="gemini", api_key=KEY)) as sim:
        settings = {
            "provider": "gemini",
            "gemini_base_url": sim.url,
            "gemini_api_key": KEY,
            "port": 0,
            "workspace_root": str(tmp_path / "ws"),
            "tools_file": str(tools),
            "enable_shell": True,
        }
        async with running_gateway(load_config(settings, env={})) as gateway:
            client = await GatewayClient.connect(gateway.url)
            first = await client.turn('/tool shell {"command": "sleep 1; echo late"}')
            later = await client.until(lambda e: kind(e) == "end")
            await client.close()
    assert [name for name, _ in merged(first)] == [
        "user", "call", "execute", "metric", "end", "metric"
    ]  # fmt: skip
    call = next(e for e in first if isinstance(e, Call))
    assert call.background is True
    result = next(e for e in later if isinstance(e, Result))
    assert result.id == call.id and "late" in result.content
    assert "The tool shell returned" in "".join(
        getattr(e, "content", "") for e in later if kind(e) == "respond"
    )


async def test_a_client_tool_made_background_is_declared_so_at_the_next_turn(
    tmp_path: Path,
) -> None:
    """A text session on a model that only speaks declares its tools natively: a
    ``configure`` that makes a client tool ``background`` changes that declaration
    (not the text prompt, which the model is not given), so the next turn's
    connection declares it NON_BLOCKING."""
    tool = {"name": "lookup", "description": "looks up", "parameters": {"type": "object"}}
    async with gemini_gateway(tmp_path) as (client, sim):
        await client.send({"type": "configure", "tools": [tool]})
        await client.turn("hello")
        [before] = [conn.setup.non_blocking for conn in sim.live()]  # type: ignore[attr-defined]
        await client.send({"type": "configure", "tools": [{**tool, "background": True}]})
        await client.turn("hello again")
        [after] = [conn.setup.non_blocking for conn in sim.live()]  # type: ignore[attr-defined]
    assert (before, after) == (frozenset(), frozenset({"lookup"}))
