"""The real clients, unmodified, through the OpenAI door of a ``gateway serve`` node:
the ``openai`` SDK's ``realtime.connect`` and the Agents SDK's ``RealtimeRunner``, a
text turn and a client-tool turn (the tool runs in the client), with an OpenAI and a
Gemini model (each served by its provider's simulator flavour)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner

from gateway.common.pcm import silence, tone
from tests.openai_door.conftest import MODELS, sdk_client
from tests.support.procs import NodeProcess
from tests.voice.conftest import utterance

pytestmark = pytest.mark.timeout(60)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = '/tool get_weather {"city": "Paris"}'  # the simulator's script: call the tool


@pytest.mark.parametrize("model", MODELS)
async def test_the_openai_sdk_has_a_text_turn_and_a_client_tool_turn(
    node: NodeProcess, model: str
) -> None:
    client = sdk_client(node)
    async with client.realtime.connect(model=model) as conn:
        await conn.session.update(
            session={"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER_TOOL]}
        )
        created = await conn.recv()
        assert created.type == "session.created"
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hello"}],
            }
        )
        await conn.response.create()
        text: list[str] = []
        async for event in conn:
            assert event.type != "error", event
            if event.type == "response.output_text.delta":
                text.append(event.delta)
            if event.type == "response.done":
                assert event.response.status == "completed"
                assert event.response.usage is not None and event.response.usage.output_tokens
                break
        assert "hello" in "".join(text).lower()

        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": CALL}],
            }
        )
        await conn.response.create()
        calls: list[tuple[str, dict[str, Any]]] = []
        answer: list[str] = []
        async for event in conn:
            assert event.type != "error", event
            if event.type == "response.function_call_arguments.done":
                calls.append((event.name, json.loads(event.arguments)))
                await conn.conversation.item.create(
                    item={
                        "type": "function_call_output",
                        "call_id": event.call_id,
                        "output": "sunny",
                    }
                )
                await conn.response.create()
            if event.type == "response.output_text.delta" and calls:
                answer.append(event.delta)
            if event.type == "response.done" and calls and answer:
                break
        assert calls == [("get_weather", {"city": "Paris"})]
        assert answer  # the model answered after the client's output


@pytest.mark.parametrize("model", MODELS)
async def test_the_agents_sdk_runs_a_text_turn_and_its_own_tool(
    node: NodeProcess, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    agent = RealtimeAgent(name="assistant", instructions="Be brief.", tools=[get_weather])
    # The SDK asks for semantic_vad by default, which Gemini has not: the door refuses
    # what a provider cannot do, so this app asks for server_vad, which both have.
    settings: Any = {
        "model_name": model,
        "output_modalities": ["text"],
        "turn_detection": {"type": "server_vad"},
    }
    runner = RealtimeRunner(agent, config={"model_settings": settings})
    session = await runner.run(
        model_config={"url": f"{node.base}/openai/v1/realtime?model={model}", "api_key": "unused"}
    )
    errors: list[Any] = []

    async def turn(text: str, ends: int) -> list[Any]:
        await session.send_message(text)
        seen: list[Any] = []
        async for event in session:
            seen.append(event)
            if event.type == "error":
                errors.append(event.error)
            if event.type == "raw_model_event" and event.data.type == "error":
                errors.append(event.data.error)
            if sum(1 for e in seen if e.type == "agent_end") >= ends:
                return seen
        return seen

    async with session:
        first = await asyncio.wait_for(turn("hello", 1), 30)
        assert any(e.type == "history_updated" for e in first)
        second = await asyncio.wait_for(turn(CALL, 2), 30)
    assert errors == []
    # The SDK validates every server event against openai's types and logs a failure.
    refused = [r.getMessage() for r in caplog.records if "validate" in r.getMessage()]
    assert refused == []
    assert ran == ["Paris"]  # the tool ran in the client, with the model's arguments
    assert [e.type for e in second].count("tool_end") == 1


@pytest.mark.parametrize("model", MODELS)
async def test_the_agents_sdk_has_an_audio_turn(
    node: NodeProcess, model: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = RealtimeAgent(name="assistant", instructions="Be brief.")
    settings: Any = {"model_name": model, "turn_detection": {"type": "server_vad"}}
    runner = RealtimeRunner(agent, config={"model_settings": settings})
    session = await runner.run(
        model_config={"url": f"{node.base}/openai/v1/realtime?model={model}", "api_key": "unused"}
    )
    speech = utterance(0.5, 24000)
    kinds: list[str] = []
    heard = 0
    history: list[Any] = []

    async def microphone() -> None:
        for at in range(0, len(speech), 960):  # 20 ms at a time, as a microphone
            await session.send_audio(speech[at : at + 960])
            await asyncio.sleep(0.02)

    async with session:
        mic = asyncio.create_task(microphone())
        async for event in session:
            kinds.append(event.type)
            assert event.type != "error", event
            if event.type == "audio":
                heard += len(event.audio.data)
            if event.type == "history_updated":
                history = event.history
            if event.type == "agent_end":
                break
        await mic
    assert "audio_end" in kinds and heard > 24000  # more than 0.25 s of PCM16 at 24 kHz
    # Its history, built from the items' events: the question, then the answer.
    assert [getattr(item, "role", None) for item in history] == ["user", "assistant"], history
    refused = [r.getMessage() for r in caplog.records if "validate" in r.getMessage()]
    assert refused == []


async def test_the_agents_sdk_sends_a_recording_whole(
    node: NodeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """``session.send_audio`` with a 23 s recording: one append of 1.5 MB of base64,
    past the gateway's own 1 MiB frames (it closed the connection with 1009), within
    OpenAI's 15 MiB. The speech in it is heard and answered in speech."""
    agent = RealtimeAgent(name="assistant", instructions="Be brief.")
    model = MODELS[0]
    settings: Any = {"model_name": model, "turn_detection": {"type": "server_vad"}}
    runner = RealtimeRunner(agent, config={"model_settings": settings})
    session = await runner.run(
        model_config={"url": f"{node.base}/openai/v1/realtime?model={model}", "api_key": "unused"}
    )
    recording = silence(2.0, 24000) + tone(20.0, 24000) + silence(1.0, 24000)
    kinds: list[str] = []
    async with session:
        await session.send_audio(recording)
        async for event in session:
            kinds.append(event.type)
            assert event.type != "error", event
            if event.type == "agent_end":
                break
    assert "audio" in kinds and "audio_end" in kinds
    refused = [r.getMessage() for r in caplog.records if "validate" in r.getMessage()]
    assert refused == []
