"""GPT-Live voice through a real gateway: a spoken turn, and speech over the model's.

GPT-Live has no VAD events and no turn boundaries, only transcripts (docs/
providers.md, "GPT-Live"): the gateway's ``speech_started`` comes from the
first piece of the caller's transcript, the turn from the model speaking, its
end from the model falling quiet, and the caller speaking over the model ends
the model's turn (``cancelled``, ``barge_in``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.sim.live import LiveConnection
from protocol.events import Cancelled
from tests.voice.conftest import VoiceClient, kind, shape, utterance, voice_gateway

RATE = 24000
LIVE = {"model": "gpt-live-1.1"}


async def test_a_spoken_turn_is_heard_and_answered_aloud(tmp_path: Path) -> None:
    async with voice_gateway("openai", tmp_path, gateway_settings=LIVE, audio_ms_per_char=5) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio")
        await client.stream(utterance(1.2, RATE), RATE)
        events = await client.turn_end()
        live = [conn for conn in gw.sim.live() if isinstance(conn, LiveConnection)]
        await client.close()
    got = shape(events)
    assert got[0] == ("speech_started", "")
    assert ("user", "(speech 1.2 s)") in got
    assert ("respond", "Echo: (speech 1.2 s)") in got
    assert got[-2:] == [("end", ""), ("metric", "")]
    assert client.audio, "the model's speech reaches a client that asked for audio"
    assert len(live) == 1 and live[0].format.rate == RATE


async def test_speech_over_the_models_speech_ends_its_turn(tmp_path: Path) -> None:
    knobs = {"tokens_per_second": 20, "chunk_size": 2}
    async with voice_gateway("openai", tmp_path, gateway_settings=LIVE, **knobs) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE})
        await client.send({"type": "user", "content": "/raw " + "z" * 400})
        await client.until("respond")  # the model is talking
        sender = asyncio.create_task(client.stream(utterance(0.5, RATE), RATE))
        cut = await client.until("cancelled")
        answered = await client.turn_end()
        await sender
        await client.close()
    cancelled = cut[-1]
    assert isinstance(cancelled, Cancelled) and cancelled.reason == "barge_in"
    assert any(kind(e) == "speech_started" for e in cut)
    got = shape(answered)
    assert ("user", "(speech 0.5 s)") in got
    assert ("respond", "Echo: (speech 0.5 s)") in got
    assert got[-2:] == [("end", ""), ("metric", "")]


async def test_manual_turns_are_refused_and_the_model_decides_the_turn(
    tmp_path: Path,
) -> None:
    """GPT-Live has no manual turn mode: it answers when it hears the caller stop, so a
    client's ``commit`` could only find a turn already running. ``turn_detection:
    none`` is refused when the session is set up, saying so; without it the turn is
    the model's."""
    async with voice_gateway("openai", tmp_path, gateway_settings=LIVE) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.send(
            {"type": "configure", "input_audio": {"rate": RATE, "turn_detection": "none"}}
        )
        refused = (await client.until("error"))[-1]
        await client.configure(input_audio={"rate": RATE})
        await client.stream(utterance(0.7, RATE), RATE)
        events = await client.turn_end()
        await client.close()
    assert 'turn_detection "none"' in getattr(refused, "content", "")
    got = shape(events)
    assert ("user", "(speech 0.7 s)") in got
    assert ("respond", "Echo: (speech 0.7 s)") in got
    assert got[-2:] == [("end", ""), ("metric", "")]
