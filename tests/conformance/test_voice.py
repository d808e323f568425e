"""Voice conformance: each adapter against its simulator flavour, over real sockets.

The client side is what the session loop will do: stream PCM16 at real-time
pace (a tone as speech, silence around it), read the adapter's events. The
same script must give the same vocabulary of events on either provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from gateway.common.pcm import duration_ms, silence, tone
from gateway.sim.model import SimConfig
from gateway.sim.server import serve_sim
from gateway.upstream import providers
from gateway.upstream.base import (
    AudioDelta,
    AudioIn,
    AudioOut,
    FunctionTool,
    NativeCall,
    ResponseBegan,
    ResponseDone,
    SpeechBegan,
    SpeechEnded,
    Spoken,
    TextDelta,
    Transcript,
    Upstream,
    UpstreamEvent,
    VoiceConfig,
)
from protocol.assembly import Message

# One row per wire: voice is the wire's (the rows on a wire differ in address and shape).
FIRST_ON_WIRE: dict[str, str] = {}
for _row in providers.PROVIDERS:
    FIRST_ON_WIRE.setdefault(_row.wire, _row.name)
PROVIDERS = list(FIRST_ON_WIRE.values())
STEP = 10.0  # seconds any one event may take
CHUNK_S = 0.02  # 20 ms chunks, as a microphone sends them
WEATHER = FunctionTool(
    name="weather",
    description="The weather in a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


@contextlib.asynccontextmanager
async def adapter(provider: str, voice: VoiceConfig, **knobs: float) -> AsyncIterator[Upstream]:
    config = SimConfig(flavor=provider, api_key="k", **knobs)  # type: ignore[arg-type]
    async with serve_sim(config) as sim:
        row = providers.by_name(provider)
        # The simulator's own model takes TEXT output too (today's Live models only speak).
        model = row.default_model if row.wire == "openai" else "sim"
        upstream = row.factory(row.settings(base_url=sim.url, api_key="k"), model).create()
        await upstream.open("Be brief.", [], voice=voice)
        try:
            yield upstream
        finally:
            await upstream.close()


async def stream(upstream: Upstream, pcm: bytes, rate: int) -> None:
    """Send ``pcm`` in 20 ms chunks at real-time pace (due times from the start: no drift)."""
    size = round(rate * CHUNK_S) * 2
    start = time.monotonic()
    for index, at in enumerate(range(0, len(pcm), size)):
        delay = start + index * CHUNK_S - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await upstream.send_audio(pcm[at : at + size])


def utterance(seconds: float, rate: int) -> bytes:
    """Speech (a tone) with silence around it: 0.3 s before, 0.8 s after."""
    return silence(0.3, rate) + tone(seconds, rate) + silence(0.8, rate)


async def events_until(upstream: Upstream, last: type) -> list[UpstreamEvent]:
    """Events up to and including the first of type ``last``."""
    events: list[UpstreamEvent] = []
    while True:
        async with asyncio.timeout(STEP):
            event = await upstream.recv()
        events.append(event)
        if isinstance(event, last):
            return events


def kinds(events: list[UpstreamEvent]) -> list[str]:
    """Event type names, runs of deltas collapsed to one; resumption handles (Gemini's,
    after each turn) are left out: they are not part of a turn."""
    out: list[str] = []
    for event in events:
        name = type(event).__name__
        if name == "Resumable":
            continue
        if not (out and out[-1] == name and name.endswith("Delta")):
            out.append(name)
    return out


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("rate", [24000, 16000, 48000])
async def test_speech_gives_vad_events_a_transcript_and_an_answer(provider: str, rate: int) -> None:
    voice = VoiceConfig(audio_in=AudioIn(rate=rate))
    async with adapter(provider, voice) as upstream:
        sender = asyncio.create_task(stream(upstream, utterance(1.2, rate), rate))
        events = await events_until(upstream, ResponseDone)
        await sender
    started = next(e for e in events if isinstance(e, SpeechBegan))
    stopped = next(e for e in events if isinstance(e, SpeechEnded))
    transcripts = [e.text for e in events if isinstance(e, Transcript)]
    assert transcripts == ["(speech 1.2 s)"]
    assert 250 <= started.offset_ms <= 350  # the tone starts 0.3 s in
    assert stopped.offset_ms >= started.offset_ms + 1200
    assert kinds(events)[:2] == ["SpeechBegan", "SpeechEnded"]
    assert "ResponseBegan" in kinds(events)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "<think>The user said something.</think>Echo: (speech 1.2 s)<end>"
    done = events[-1]
    assert isinstance(done, ResponseDone) and done.status == "completed"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_manual_turn_commit_gets_an_answer(provider: str) -> None:
    rate = 16000
    voice = VoiceConfig(audio_in=AudioIn(rate=rate, turn_detection="none"))
    async with adapter(provider, voice) as upstream:
        await stream(upstream, silence(0.1, rate) + tone(0.7, rate), rate)
        await upstream.commit_audio()
        events = await events_until(upstream, ResponseDone)
    assert not any(isinstance(e, (SpeechBegan, SpeechEnded, ResponseBegan)) for e in events)
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text.endswith("Echo: (speech 0.7 s)<end>")
    assert isinstance(events[-1], ResponseDone) and events[-1].status == "completed"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_speech_during_an_answer_cancels_it(provider: str) -> None:
    rate = 24000
    voice = VoiceConfig(audio_in=AudioIn(rate=rate))
    async with adapter(provider, voice, tokens_per_second=20, chunk_size=2) as upstream:
        await upstream.add_message(Message(role="user", content="/raw " + "z" * 400))
        await upstream.start_response()
        await events_until(upstream, TextDelta)  # the answer is running
        sender = asyncio.create_task(stream(upstream, utterance(0.5, rate), rate))
        began = time.monotonic()
        events = await events_until(upstream, ResponseDone)
        cancelled_after = time.monotonic() - began
        assert isinstance(events[-1], ResponseDone)
        assert events[-1].status == "cancelled"
        # In order: the speech was heard, then the answer cut before its 400 characters
        # (10 s) were sent. ~0.4 s (0.3 s of silence, 0.1 s of speech): a loaded machine's
        # margin over 10x; tests/bench/barge_in_bench.py prints the figure.
        assert any(isinstance(e, SpeechBegan) for e in events)
        sent = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert len(sent) < 400, len(sent)
        assert cancelled_after < 5.0
        # The user's speech is answered next.
        answer = await events_until(upstream, ResponseDone)
        await sender
    assert any(isinstance(e, Transcript) for e in answer)
    text = "".join(e.text for e in answer if isinstance(e, TextDelta))
    assert text.endswith("Echo: (speech 0.5 s)<end>")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_audio_output_gives_audio_and_its_transcript(provider: str) -> None:
    voice = VoiceConfig(audio_in=AudioIn(), audio_out=AudioOut(voice="alloy"))
    async with adapter(provider, voice, chunk_size=5, audio_ms_per_char=10) as upstream:
        await upstream.add_message(Message(role="user", content="hello voice"))
        await upstream.start_response()
        events = await events_until(upstream, ResponseDone)
    audio = [e for e in events if isinstance(e, AudioDelta)]
    transcript = "".join(e.text for e in events if isinstance(e, Spoken))
    assert transcript == "Echo: hello voice"
    assert not any(isinstance(e, TextDelta) for e in events)
    assert {e.rate for e in audio} == {24000}
    played = sum(duration_ms(e.pcm16, e.rate) for e in audio)
    assert played == pytest.approx(len(transcript) * 10, abs=1)
    assert isinstance(events[-1], ResponseDone) and events[-1].status == "completed"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_function_call_round_trip_in_audio_output(provider: str) -> None:
    voice = VoiceConfig(audio_in=AudioIn(), audio_out=AudioOut(), tools=(WEATHER,))
    async with adapter(provider, voice, chunk_size=4, audio_ms_per_char=5) as upstream:
        await upstream.add_message(Message(role="user", content='/tool weather {"city": "Oslo"}'))
        await upstream.start_response()
        called = await events_until(upstream, ResponseDone)
        [call] = [e for e in called if isinstance(e, NativeCall)]
        assert call.name == "weather"
        assert call.call_id
        assert call.arguments.replace(" ", "") == '{"city":"Oslo"}'
        await upstream.send_function_output(call.call_id, "sunny")
        await upstream.start_response()
        answer = await events_until(upstream, ResponseDone)
    transcript = "".join(e.text for e in answer if isinstance(e, Spoken))
    assert transcript == "The tool weather returned sunny."
    assert any(isinstance(e, AudioDelta) for e in answer)
    assert isinstance(answer[-1], ResponseDone) and answer[-1].status == "completed"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_undeclared_tool_is_not_called(provider: str) -> None:
    voice = VoiceConfig(audio_out=AudioOut())
    async with adapter(provider, voice) as upstream:
        await upstream.add_message(Message(role="user", content="/tool weather {}"))
        await upstream.start_response()
        events = await events_until(upstream, ResponseDone)
    assert not any(isinstance(e, NativeCall) for e in events)
    transcript = "".join(e.text for e in events if isinstance(e, Spoken))
    assert transcript == "I have no tool named weather."


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_text_session_sees_only_text_events(provider: str) -> None:
    async with adapter(provider, VoiceConfig()) as upstream:
        await upstream.add_message(Message(role="user", content="hi"))
        await upstream.start_response()
        events = await events_until(upstream, ResponseDone)
    assert set(kinds(events)) == {"TextDelta", "ResponseDone"}
