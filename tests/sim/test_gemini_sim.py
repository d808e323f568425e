"""The Gemini flavour of the simulator, seen by a raw WebSocket client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.cli import build_parser
from gateway.sim.gemini import PATH, GeminiSim, endpoint_path
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from tests.sim.test_sim_model import sim_flags
from tests.upstream.helpers import STEP_TIMEOUT

SETUP = {
    "setup": {
        "model": "models/sim",
        "generationConfig": {"responseModalities": ["TEXT"]},
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
    }
}


def gemini(**knobs: Any) -> SimConfig:
    return SimConfig(flavor="gemini", **knobs)


@pytest.fixture
async def sim() -> AsyncIterator[GeminiSim]:
    async with serve_sim(gemini(chunk_size=8)) as running:
        assert isinstance(running, GeminiSim)
        yield running


async def receive(ws: ClientConnection) -> dict[str, Any]:
    async with asyncio.timeout(STEP_TIMEOUT):
        message: dict[str, Any] = json.loads(await ws.recv())
    return message


async def send(ws: ClientConnection, message: dict[str, Any]) -> None:
    await ws.send(json.dumps(message))


async def closed(ws: ClientConnection) -> tuple[int, str]:
    """The close code and reason the server closed ``ws`` with."""
    with pytest.raises(ConnectionClosed) as info:
        async with asyncio.timeout(STEP_TIMEOUT):
            while True:
                await ws.recv()
    assert info.value.rcvd is not None
    return info.value.rcvd.code, info.value.rcvd.reason


async def until_turn_complete(ws: ClientConnection) -> list[dict[str, Any]]:
    messages = []
    while True:
        message = await receive(ws)
        messages.append(message)
        if message.get("serverContent", {}).get("turnComplete"):
            return messages


def user(text: str, *, complete: bool = True) -> dict[str, Any]:
    return {
        "clientContent": {
            "turns": [{"role": "user", "parts": [{"text": text}]}],
            "turnComplete": complete,
        }
    }


async def open_session(url: str) -> ClientConnection:
    ws = await connect(url, compression=None)
    await send(ws, SETUP)
    assert await receive(ws) == {"setupComplete": {}}
    return ws


async def test_a_turn_is_chunks_then_generation_complete_then_turn_complete(
    sim: GeminiSim,
) -> None:
    ws = await open_session(sim.endpoint)
    await send(ws, user("hi"))
    messages = await until_turn_complete(ws)
    await ws.close()
    text = "<think>The user said something.</think>Echo: hi<end>"
    chunks = [text[i : i + 8] for i in range(0, len(text), 8)]
    prompt = (len("Be brief.") + len("hi")) // 4
    assert messages == [
        *(
            {"serverContent": {"modelTurn": {"parts": [{"text": c}], "role": "model"}}}
            for c in chunks
        ),
        {"serverContent": {"generationComplete": True}},
        {
            "serverContent": {"turnComplete": True},
            "usageMetadata": {
                "promptTokenCount": prompt,
                "responseTokenCount": len(chunks),
                "totalTokenCount": prompt + len(chunks),
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
                "responseTokensDetails": [{"modality": "TEXT", "tokenCount": len(chunks)}],
            },
        },
    ]


async def test_context_turns_wait_for_turn_complete_and_names_may_be_snake_case(
    sim: GeminiSim,
) -> None:
    ws = await open_session(sim.endpoint)
    await send(ws, user("first", complete=False))
    await send(ws, {"client_content": {"turns": [], "turn_complete": True}})
    messages = await until_turn_complete(ws)
    [conversation] = sim.conversations()
    await ws.close()
    text = "".join(
        m["serverContent"]["modelTurn"]["parts"][0]["text"]
        for m in messages
        if "modelTurn" in m["serverContent"]
    )
    assert text.endswith("Echo: first<end>")
    assert conversation.instructions == "Be brief."
    assert conversation.messages() == [("user", "first"), ("model", text)]
    assert sim.stats.responses_total == 1


async def test_content_while_generating_interrupts_the_turn() -> None:
    async with serve_sim(gemini(tokens_per_second=50, chunk_size=1)) as sim:
        ws = await open_session(sim.endpoint)
        await send(ws, user("/raw " + "z" * 500))
        first = await receive(ws)
        assert first["serverContent"]["modelTurn"]["parts"][0]["text"] == "z"
        await send(ws, user("/raw ok"))
        # Chunks already sent may come first; then the interruption, then the new turn.
        while True:
            message = await receive(ws)
            if message["serverContent"].get("interrupted"):
                break
            assert "modelTurn" in message["serverContent"]
        rest = await until_turn_complete(ws)
        [conversation] = sim.conversations()
        await ws.close()
    assert rest[0] == {"serverContent": {"modelTurn": {"parts": [{"text": "o"}], "role": "model"}}}
    items = conversation.items
    assert [(i.role, i.status) for i in items] == [
        ("user", "completed"),
        ("model", "incomplete"),
        ("user", "completed"),
        ("model", "completed"),
    ]
    assert set(items[1].text) == {"z"}
    assert items[3].text == "ok"


@pytest.mark.parametrize(
    ("first", "code", "reason"),
    [
        ("{not json", 1007, "Invalid JSON payload received."),
        (
            {"setup": {"model": "models/sim", "fooBar": 1}},
            1007,
            "Invalid JSON payload received. Unknown name \"fooBar\" at 'setup': Cannot find field.",
        ),
        ({"bogus": {}}, 1007, 'Unknown name "bogus": Cannot find field.'),
        (user("hi"), 1007, "The first message must be setup, got clientContent."),
        ({"setup": {"model": "sim"}}, 1008, "sim is not found for API version v1beta"),
        (
            {
                "setup": {
                    "model": "models/sim",
                    "generationConfig": {"responseModalities": ["TEXT", "AUDIO"]},
                }
            },
            1007,
            "response modalities (TEXT, AUDIO) is not supported",
        ),
    ],
)
async def test_bad_setup_closes_with_the_api_s_error(
    sim: GeminiSim, first: Any, code: int, reason: str
) -> None:
    async with connect(sim.endpoint, compression=None) as ws:
        await ws.send(first if isinstance(first, str) else json.dumps(first))
        got_code, got_reason = await closed(ws)
    assert got_code == code
    assert reason in got_reason
    assert len(got_reason.encode()) <= 123


async def test_bad_content_after_setup_closes(sim: GeminiSim) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"clientContent": {"turns": [{"role": "assistant", "parts": [{"text": "x"}]}]}},
            "Please use a valid role: user, model.",
        ),
        (SETUP, "setup is sent once"),
        ({"realtimeInput": {"activityStart": {}}}, "automatic activity detection disabled"),
        ({**SETUP, **user("x")}, "exactly one of"),
    ]
    for message, reason in cases:
        ws = await open_session(sim.endpoint)
        await send(ws, message)
        code, got = await closed(ws)
        assert code == 1007
        assert reason in got


async def test_only_the_live_endpoint_is_served(sim: GeminiSim) -> None:
    assert sim.endpoint == f"{sim.url}{PATH}"
    for path in ("/v1/realtime", endpoint_path("v1"), "/"):
        with pytest.raises(InvalidStatus) as info:
            async with connect(f"{sim.url}{path}"):
                pass
        assert info.value.response.status_code == 404
    ws = await open_session(f"{sim.url}{endpoint_path('v1alpha')}")
    await ws.close()


async def test_api_key_in_query_or_header() -> None:
    async with serve_sim(gemini(api_key="k")) as sim:
        for url, headers in (
            (f"{sim.endpoint}?key=k", None),
            (sim.endpoint, {"x-goog-api-key": "k"}),
        ):
            async with connect(url, additional_headers=headers) as ws:
                await send(ws, SETUP)
                assert await receive(ws) == {"setupComplete": {}}
        for url, code in ((f"{sim.endpoint}?key=nope", 1007), (sim.endpoint, 1008)):
            async with connect(url) as ws:
                await send(ws, SETUP)
                got_code, reason = await closed(ws)
            assert got_code == code
            if code == 1007:
                assert reason == "API key not valid. Please pass a valid API key."


async def test_go_away_then_close_after_the_turn() -> None:
    async with serve_sim(gemini(chunk_size=4, go_away_after=2)) as sim:
        ws = await open_session(sim.endpoint)
        await send(ws, user("hi"))
        messages = await until_turn_complete(ws)
        code, reason = await closed(ws)
    assert messages[2] == {"goAway": {"timeLeft": "10s"}}
    assert [m for m in messages if "goAway" in m] == [messages[2]]
    assert code == 1000
    assert "goAway" in reason


async def test_drop_after_aborts_the_connection() -> None:
    async with serve_sim(gemini(chunk_size=1, drop_after=2)) as sim:
        ws = await open_session(sim.endpoint)
        await send(ws, user("hi"))
        assert "serverContent" in await receive(ws)
        assert "serverContent" in await receive(ws)
        with pytest.raises(ConnectionClosed) as info:
            await receive(ws)
    assert info.value.rcvd is None  # no close frame: the TCP connection was aborted


def test_command_line_flavor_and_go_away() -> None:
    assert sim_flags().flavor == "openai"
    assert sim_flags("--flavor", "gemini", "--go-away-after", "3") == SimConfig(
        flavor="gemini", go_away_after=3
    )
    serve = build_parser().parse_args(["serve", "--sim-flavor", "gemini"])
    assert serve.sim_flavor == "gemini"
    with pytest.raises(SystemExit):
        sim_flags("--flavor", "claude")


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="flavor"):
        SimConfig(flavor="claude")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="go_away_after"):
        SimConfig(go_away_after=-1)
