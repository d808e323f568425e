"""The simulator's GPT-Live flavour, driven by the official ``openai`` SDK (``client.live``).

It serves ``/v1/live/sessions`` beside ``/v1/realtime`` and refuses what the
service refuses: a command before ``session.start``, an unknown field in the
session, a model on the wrong endpoint (both ways), Responses commands under
client delegation.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
import websockets
from openai import AsyncOpenAI
from websockets.exceptions import InvalidStatus

from gateway.sim.model import Sim, SimConfig
from gateway.sim.server import serve_sim
from gateway.upstream.live_conversation import TYPED_PREFIX

KEY = "k"
STEP = 10.0


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    async with serve_sim(SimConfig(api_key=KEY)) as running:
        yield running


def client(sim: Sim) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=KEY, websocket_base_url=sim.url, max_retries=0)


async def until(conn: Any, kind: str) -> list[Any]:
    seen: list[Any] = []
    async with asyncio.timeout(STEP):
        while True:
            event = await conn.recv()
            seen.append(event)
            if event.type == kind:
                return seen


async def test_the_sdk_starts_a_session_and_hears_a_typed_turn_answered(sim: Sim) -> None:
    async with client(sim).live.connect(max_retries=0) as conn:
        await conn.send({"type": "session.start", "session": {"model": "gpt-live-1.1"}})
        (started,) = await until(conn, "session.started")
        assert started.session.model == "gpt-live-1.1" and started.session.status == "active"
        await conn.send(
            {
                "type": "session.commentary.append",
                "content": TYPED_PREFIX + "hi",
                "delegation_id": None,
            }
        )
        events = await until(conn, "session.usage.updated")
    text = "".join(e.delta for e in events if e.type == "session.output_transcript.delta")
    assert text == "Echo: hi"
    assert any(e.type == "session.output_audio.delta" for e in events)


async def test_a_command_before_session_start_is_refused(sim: Sim) -> None:
    async with client(sim).live.connect(max_retries=0) as conn:
        await conn.send({"type": "session.input_audio.append", "audio": ""})
        (error,) = await until(conn, "error")
        assert error.error.code == "session_not_started"
        # The connection stays: a session.start after it is accepted.
        await conn.send({"type": "session.start", "session": {"model": "gpt-live-1"}})
        await until(conn, "session.started")


async def test_an_unknown_session_field_is_refused_by_name(sim: Sim) -> None:
    async with client(sim).live.connect(max_retries=0) as conn:
        session = {"model": "gpt-live-1.1", "audio": {"voice": "marin"}}
        await conn.send({"type": "session.start", "session": session})
        (error,) = await until(conn, "error")
    assert error.error.code == "unknown_parameter"
    assert error.error.param == "session.audio.voice"


async def test_a_realtime_model_is_refused_on_the_live_endpoint(sim: Sim) -> None:
    async with client(sim).live.connect(max_retries=0) as conn:
        await conn.send({"type": "session.start", "session": {"model": "gpt-realtime-2.1"}})
        (error,) = await until(conn, "error")
    assert error.error.code == "unsupported_model" and error.error.param == "session.model"
    assert "/v1/realtime" in error.error.message


async def test_a_live_model_is_refused_on_the_realtime_endpoint(sim: Sim) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    with pytest.raises(InvalidStatus) as info:
        async with websockets.connect(
            f"{sim.url}/realtime?model=gpt-live-1.1", additional_headers=headers
        ):
            pass
    assert info.value.response.status_code == 400
    assert b"/v1/live/sessions" in (info.value.response.body or b"")


async def test_responses_commands_need_responses_delegation(sim: Sim) -> None:
    async with client(sim).live.connect(max_retries=0) as conn:
        await conn.send({"type": "session.start", "session": {"model": "gpt-live-1.1"}})
        await until(conn, "session.started")
        await conn.send({"type": "response.create"})
        (error,) = await until(conn, "error")
    assert error.error.message == "response.create requires Responses delegation."


async def test_g711_sessions_speak_mulaw_at_8khz_and_other_pcm_rates_are_refused(
    sim: Sim,
) -> None:
    async with client(sim).live.connect(max_retries=0) as conn:
        audio = {"format": {"type": "audio/pcmu", "rate": 8000}}
        await conn.send(
            {"type": "session.start", "session": {"model": "gpt-live-1.1", "audio": audio}}
        )
        await until(conn, "session.started")
        await conn.send(
            {
                "type": "session.commentary.append",
                "content": TYPED_PREFIX + "hi",
                "delegation_id": None,
            }
        )
        events = await until(conn, "session.usage.updated")
    said = "".join(e.delta for e in events if e.type == "session.output_transcript.delta")
    spoken = sum(
        len(base64.b64decode(e.delta)) for e in events if e.type == "session.output_audio.delta"
    )
    # One μ-law byte a sample at 8 kHz: 60 ms of speech a character is 480 bytes.
    assert spoken == pytest.approx(len(said) * 480, rel=0.05)
    async with client(sim).live.connect(max_retries=0) as conn:
        audio = {"format": {"type": "audio/pcm", "rate": 44100}}
        await conn.send(
            {"type": "session.start", "session": {"model": "gpt-live-1.1", "audio": audio}}
        )
        (error,) = await until(conn, "error")
    assert error.error.param == "session.audio.format"
