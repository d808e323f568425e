"""The official SDKs speak voice with the simulator: audio in, VAD, transcripts, audio out, calls.

Every raw frame the SDKs receive is validated strictly against their models
(as in ``test_openai_sdk.py`` and ``test_gemini_sdk.py``), so the voice
frames cannot drift from what real clients accept.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from google.genai import types

from gateway.common.pcm import silence, tone
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim

from .test_gemini_sdk import MODEL, TLS, bounded, frames, gemini_sim, strict, tls, user
from .test_gemini_sdk import client as gemini_client
from .test_openai_sdk import Recorder, _bounded
from .test_openai_sdk import client as openai_client

__all__ = ["frames", "tls"]  # fixtures, imported for pytest

CHUNK_S = 0.02


def speech(rate: int, seconds: float = 1.0) -> bytes:
    return silence(0.2, rate) + tone(seconds, rate) + silence(0.7, rate)


def chunks(pcm: bytes, rate: int) -> list[bytes]:
    size = round(rate * CHUNK_S) * 2
    return [pcm[at : at + size] for at in range(0, len(pcm), size)]


async def paced(send: Any, pcm: bytes, rate: int) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for index, chunk in enumerate(chunks(pcm, rate)):
        delay = start + index * CHUNK_S - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(chunk)


async def test_openai_sdk_voice_turn_and_function_call() -> None:
    recorder = Recorder()
    events: list[Any] = []
    async with (
        serve_sim(SimConfig(chunk_size=6, audio_ms_per_char=5)) as sim,
        openai_client(sim).realtime.connect(model="gpt-realtime") as conn,
    ):
        recorder.install(conn)
        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "gpt-4o-mini-transcribe"},
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    },
                    "output": {"voice": "marin"},
                },
                "tools": [
                    {
                        "type": "function",
                        "name": "weather",
                        "description": "The weather in a city.",
                        "parameters": {"type": "object", "properties": {}},
                    }
                ],
            }
        )

        async def append(chunk: bytes) -> None:
            await conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())

        sender = asyncio.create_task(paced(append, speech(24000), 24000))
        call_id = ""
        async for event in _bounded(conn):
            events.append(event)
            if event.type == "response.done" and not call_id:
                await conn.conversation.item.create(
                    item={
                        "type": "message",
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": '/tool weather {"city": "Oslo"}'}
                        ],
                    }
                )
                await conn.response.create()
                call_id = "pending"
            elif event.type == "response.function_call_arguments.done":
                call_id = event.call_id
                await conn.conversation.item.create(
                    item={"type": "function_call_output", "call_id": call_id, "output": "sunny"}
                )
            elif event.type == "response.done" and event.response.output[0].type == "function_call":
                await conn.response.create()
            elif event.type == "response.done":
                break
        await sender
    recorder.check(events)
    types_seen = [e.type for e in events]
    assert types_seen.index("input_audio_buffer.speech_started") < types_seen.index(
        "input_audio_buffer.speech_stopped"
    )
    [started] = [e for e in events if e.type == "input_audio_buffer.speech_started"]
    assert 150 <= started.audio_start_ms <= 250
    [transcript] = [
        e.transcript
        for e in events
        if e.type == "conversation.item.input_audio_transcription.completed"
    ]
    assert transcript == "(speech 1.0 s)"
    assert "input_audio_buffer.committed" in types_seen
    spoken = [e.transcript for e in events if e.type == "response.output_audio_transcript.done"]
    assert spoken == ["Echo: (speech 1.0 s)", "The tool weather returned sunny."]
    audio = b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )
    assert len(audio) == 2 * 24000 * 5 * sum(map(len, spoken)) // 1000
    [arguments] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert (arguments.name, arguments.arguments) == ("weather", '{"city": "Oslo"}')
    assert events[1].session.audio.output.voice == "marin"


async def test_genai_sdk_voice_turn_and_tool_call(tls: TLS, frames: list[bytes | str]) -> None:
    config = types.LiveConnectConfig(
        response_modalities=[types.Modality.AUDIO],
        input_audio_transcription=types.AudioTranscriptionConfig(),
        output_audio_transcription=types.AudioTranscriptionConfig(),
        speech_config=types.SpeechConfig(
            voice_config=types.VoiceConfig(
                prebuilt_voice_config=types.PrebuiltVoiceConfig(voice_name="Puck")
            )
        ),
        tools=[
            types.Tool(
                function_declarations=[
                    types.FunctionDeclaration(name="weather", description="The weather.")
                ]
            )
        ],
    )
    messages: list[types.LiveServerMessage] = []
    async with (
        gemini_sim(tls, chunk_size=6, audio_ms_per_char=5) as sim,
        gemini_client(sim, tls).aio.live.connect(model=MODEL, config=config) as session,
    ):

        async def send(chunk: bytes) -> None:
            await session.send_realtime_input(
                audio=types.Blob(data=chunk, mime_type="audio/pcm;rate=16000")
            )

        await paced(send, speech(16000), 16000)
        # ``receive()`` ends at each turnComplete: one loop per model turn.
        async for message in bounded(session.receive()):
            messages.append(message)
        await session.send_client_content(
            turns=user('/tool weather {"city": "Oslo"}'), turn_complete=True
        )
        async for message in bounded(session.receive()):
            messages.append(message)
            if message.tool_call is not None:
                [call] = message.tool_call.function_calls or []
                await session.send_tool_response(
                    function_responses=[
                        types.FunctionResponse(
                            id=call.id, name=call.name, response={"output": "sunny"}
                        )
                    ]
                )
        [conversation] = sim.conversations()
    assert [strict(raw) for raw in frames[1 : len(messages) + 1]] == messages
    heard = [
        m.server_content.input_transcription.text
        for m in messages
        if m.server_content and m.server_content.input_transcription
    ]
    assert heard == ["(speech 1.0 s)"]
    spoken = "".join(
        m.server_content.output_transcription.text or ""
        for m in messages
        if m.server_content and m.server_content.output_transcription
    )
    assert spoken == "Echo: (speech 1.0 s)The tool weather returned sunny."
    audio = [
        part.inline_data
        for m in messages
        if m.server_content and m.server_content.model_turn
        for part in m.server_content.model_turn.parts or []
        if part.inline_data
    ]
    assert {blob.mime_type for blob in audio} == {"audio/pcm;rate=24000"}
    assert sum(len(blob.data or b"") for blob in audio) == 2 * 24000 * 5 * len(spoken) // 1000
    [call_message] = [m for m in messages if m.tool_call]
    [call] = call_message.tool_call.function_calls or []  # type: ignore[union-attr]
    assert (call.name, call.args) == ("weather", {"city": "Oslo"})
    assert conversation.messages()[0] == ("user", "(speech 1.0 s)")
