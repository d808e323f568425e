"""The Gemini simulator refuses what today's Live models refuse, and resumes sessions.

Facts (docs/providers.md): the half-cascade models were shut down on
2025-12-09 and close a setup with 1008; audio-native models close a TEXT
setup (2.5 native audio: 1007 "Cannot extract voices from a non-audio
request."); a model that does not think refuses ``thinkingConfig``; the
Developer API has no ``transparent`` resumption; a resumption handle
continues its session for two hours.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gateway.sim.gemini import PATH, GeminiSim
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from tests.upstream.helpers import STEP_TIMEOUT


@pytest.fixture
async def sim() -> AsyncIterator[GeminiSim]:
    async with serve_sim(SimConfig(flavor="gemini", chunk_size=64)) as running:
        assert isinstance(running, GeminiSim)
        yield running


async def receive(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(STEP_TIMEOUT):
        message: dict[str, Any] = json.loads(await ws.recv())
    return message


def setup(model: str, modality: str = "TEXT", **more: Any) -> str:
    body: dict[str, Any] = {
        "model": f"models/{model}",
        "generationConfig": {"responseModalities": [modality]},
        **more,
    }
    return json.dumps({"setup": body})


async def refused(sim: GeminiSim, frame: str) -> tuple[int, str]:
    async with connect(sim.endpoint) as ws:
        await ws.send(frame)
        with pytest.raises(ConnectionClosed) as info:
            await receive(ws)
    assert info.value.rcvd is not None
    return info.value.rcvd.code, info.value.rcvd.reason


@pytest.mark.parametrize(
    ("model", "code", "words"),
    [
        ("gemini-3.8-live", 1007, "Cannot extract voices from a non-audio request."),
        ("gemini-2.5-flash-native-audio-preview-12-2025", 1007, "Cannot extract voices"),
        ("gemini-3.1-flash-live-preview", 1011, "Internal error encountered."),
        ("gemini-live-2.5-flash-preview", 1008, "is not found for API version v1beta"),
        ("gemini-2.0-flash-live-001", 1008, "is not found for API version v1beta"),
    ],
)
async def test_a_text_setup_is_refused_as_the_service_refuses_it(
    sim: GeminiSim, model: str, code: int, words: str
) -> None:
    got_code, reason = await refused(sim, setup(model))
    assert got_code == code
    assert words in reason


async def test_an_audio_setup_of_a_current_model_is_taken(sim: GeminiSim) -> None:
    async with connect(sim.endpoint) as ws:
        await ws.send(setup("gemini-3.8-live", "AUDIO"))
        assert "setupComplete" in await receive(ws)


async def test_thinking_is_refused_by_a_model_that_does_not_think(sim: GeminiSim) -> None:
    thinking = {"responseModalities": ["AUDIO"], "thinkingConfig": {"includeThoughts": True}}
    frame = json.dumps({"setup": {"model": "models/gemini-3.8-live", "generationConfig": thinking}})
    code, reason = await refused(sim, frame)
    assert code == 1007 and "Thinking is not supported" in reason


async def test_transparent_resumption_is_not_the_developer_apis(sim: GeminiSim) -> None:
    code, reason = await refused(sim, setup("sim", sessionResumption={"transparent": True}))
    assert code == 1007 and 'Unknown name "transparent"' in reason


async def turn(ws: ClientConnection, text: str) -> tuple[str, str]:
    """Send ``text``; the answer's text and the handle the server offers after it."""
    content = {"turns": [{"role": "user", "parts": [{"text": text}]}], "turnComplete": True}
    await ws.send(json.dumps({"clientContent": content}))
    answer, handle = "", ""
    while not handle:
        message = await receive(ws)
        for part in message.get("serverContent", {}).get("modelTurn", {}).get("parts", []):
            answer += part.get("text", "")
        update = message.get("sessionResumptionUpdate")
        if update and update.get("resumable"):
            handle = update["newHandle"]
    return answer, handle


async def test_a_handle_continues_its_session_on_a_new_connection(sim: GeminiSim) -> None:
    async with connect(sim.endpoint) as ws:
        await ws.send(setup("sim", sessionResumption={}))
        assert "setupComplete" in await receive(ws)
        await receive(ws)  # the handle of the empty session
        _, handle = await turn(ws, "/context")
    async with connect(sim.endpoint) as ws:
        await ws.send(setup("sim", sessionResumption={"handle": handle}))
        assert "setupComplete" in await receive(ws)
        await receive(ws)
        answer, _ = await turn(ws, "/context")
    # The resumed session holds the first probe and its answer, then the second probe.
    assert "Context: 3 items" in answer
    assert sim.stats.resumed_total == 1


async def test_an_unknown_handle_is_refused(sim: GeminiSim) -> None:
    code, reason = await refused(sim, setup("sim", sessionResumption={"handle": "nope"}))
    assert code == 1008 and "resumption handle" in reason


def test_the_simulated_paths_are_the_services() -> None:
    assert PATH.endswith("v1beta.GenerativeService.BidiGenerateContent")
