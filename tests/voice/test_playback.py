"""Playback reports: a barge-in tells the provider and the log what the user heard.

A client playing the model's spoken answer reports how much of it it played
(``{"type": "played", "seq": N, "ms": M}``). When the user's speech cuts the
answer, the OpenAI adapter truncates the provider's item at the newest report
(``conversation.item.truncate`` with that ``audio_end_ms``), so the model's
memory is what was heard, and the ``cancelled`` event keeps it (``heard_ms``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from gateway.sim.model import Sim
from protocol.events import Cancelled, SpeechStarted
from tests.voice.conftest import VoiceClient, shape, utterance, voice_gateway

RATE = 24000


async def report_playback(client: VoiceClient, every_ms: int, stop: asyncio.Event) -> int:
    """Report playback as a player would: the audio received so far, as it plays."""
    played = 0
    while not stop.is_set():
        await asyncio.sleep(every_ms / 1000)
        if client.audio:
            played += every_ms
            seq = client.audio[-1][0]
            await client.send({"type": "played", "seq": seq, "ms": played})
    return played


async def test_a_barge_in_truncates_the_spoken_answer_where_the_client_stopped(
    tmp_path: Path,
) -> None:
    async with voice_gateway(
        "openai", tmp_path, tokens_per_second=20, chunk_size=2, audio_ms_per_char=60
    ) as gw:
        sim: Sim = gw.sim
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio")
        await client.send({"type": "user", "content": "/raw " + "z" * 200})
        await client.until("respond")  # the answer is being spoken
        stop = asyncio.Event()
        player = asyncio.create_task(report_playback(client, 100, stop))
        await asyncio.sleep(0.35)  # the user hears a bit of it...
        stop.set()
        heard = await player  # ...the player stops, its last report is final
        await client.stream(utterance(0.5, RATE), RATE)  # and talks over it
        cut = await client.until("cancelled")
        await client.turn_end()
        await client.close()
    cancelled = cut[-1]
    assert isinstance(cancelled, Cancelled) and cancelled.reason == "barge_in"
    assert heard > 0
    assert cancelled.heard_ms == heard
    assert sim.stats.truncations == [heard]


@pytest.mark.parametrize("provider", ["openai", "gemini"])
async def test_speech_over_a_finished_answer_the_client_still_plays_cuts_it_where_heard(
    provider: str, tmp_path: Path
) -> None:
    """The model's 2.4 s answer comes whole at once and its turn ends; the client has
    played 0.3 s of it (its ``played`` reports are behind the audio sent) when the user
    speaks: ``speech_started`` says where it was cut, and the provider keeps that much
    (OpenAI truncates its item; Gemini keeps what it keeps of a turn)."""
    async with voice_gateway(provider, tmp_path, audio_ms_per_char=60) as gw:
        sim: Sim = gw.sim
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio")
        await client.send({"type": "user", "content": "/raw " + "z" * 40})
        await client.turn_end()  # generated and sent: the turn is over
        sent_ms = sum(len(pcm) for _, pcm in client.audio) * 1000 // (2 * RATE)
        assert sent_ms >= 2300
        stop = asyncio.Event()
        player = asyncio.create_task(report_playback(client, 100, stop))
        await asyncio.sleep(0.35)  # the user hears a bit of it...
        stop.set()
        heard = await player
        speaking = asyncio.get_running_loop().time() + 0.3  # the utterance's silent lead
        talk = asyncio.create_task(client.stream(utterance(0.5, RATE), RATE))  # ...talks over it
        [*_, started] = await client.until("speech_started")
        latency = asyncio.get_running_loop().time() - speaking
        await talk
        await client.close()
    print(f"speech start → speech_started at the client: {latency * 1000:.0f} ms")
    assert latency < 1.5  # 300 ms with a loaded machine's margin
    assert isinstance(started, SpeechStarted) and started.heard_ms == heard
    assert 0 < heard < sent_ms
    assert sim.stats.truncations == ([heard] if provider == "openai" else [])


async def test_speech_after_the_client_played_all_of_the_answer_cuts_nothing(
    tmp_path: Path,
) -> None:
    async with voice_gateway("openai", tmp_path, audio_ms_per_char=60) as gw:
        sim: Sim = gw.sim
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio")
        await client.send({"type": "user", "content": "/raw " + "z" * 10})
        await client.turn_end()
        sent_ms = sum(len(pcm) for _, pcm in client.audio) * 1000 // (2 * RATE)
        await client.send({"type": "played", "seq": client.audio[-1][0], "ms": sent_ms})
        await client.stream(utterance(0.5, RATE), RATE)
        [*_, started] = await client.until("speech_started")
        await client.close()
    assert isinstance(started, SpeechStarted) and isinstance(started.heard_ms, msgspec.UnsetType)
    assert sim.stats.truncations == []


async def test_a_played_report_needs_no_voice_and_is_not_an_error(tmp_path: Path) -> None:
    """A report with nothing to cut (a text session) is taken and changes nothing."""
    async with voice_gateway("openai", tmp_path) as gw:
        client = await VoiceClient.connect(gw.url)
        await client.send({"type": "played", "seq": 0, "ms": 10})
        await client.send({"type": "user", "content": "hi"})
        events = await client.turn_end()
        await client.close()
    assert not [e for e in events if type(e).__name__ == "Error"]


async def test_speech_over_a_playing_answer_after_a_configure_keeps_one_copy_of_it(
    tmp_path: Path,
) -> None:
    """A configure right after the answer was generated (the connection is replaced for
    the new instructions while the client still plays it), then the user speaks over
    it: the provider holds the answer once, not the history's copy plus a replacement,
    and is told how much of it the user heard (it cannot cut the history's copy)."""
    async with voice_gateway("openai", tmp_path, audio_ms_per_char=60) as gw:
        sim: Sim = gw.sim
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", instructions="A")
        await client.send({"type": "user", "content": "/raw " + "z" * 40})
        await client.turn_end()  # generated and sent: the turn is over, 2.4 s to play
        await client.configure(instructions="B")
        stop = asyncio.Event()
        player = asyncio.create_task(report_playback(client, 100, stop))
        await asyncio.sleep(0.35)  # the user hears a bit of it...
        stop.set()
        heard = await player
        await client.stream(utterance(0.5, RATE), RATE)  # ...and talks over it
        await client.turn_end()
        [conversation] = sim.conversations()
        await client.close()
    answers = [item.text for item in conversation.items if item.role == "assistant"]
    assert sum("zzzz" in text for text in answers) == 1, answers
    said = [item.text for item in conversation.items if item.role == "user"]
    note = f"(The user spoke over your previous response after hearing {heard / 1000:.1f} s"
    [at] = [i for i, text in enumerate(said) if text.startswith(note)]
    assert said[at + 1 :] == ["(speech 0.5 s)"], said  # the note, then the speech


@pytest.mark.timeout(30)
@pytest.mark.parametrize("model", ["gemini", "gpt-live-1.1"])
async def test_a_provider_without_silent_context_is_not_given_the_note_mid_listen(
    model: str, tmp_path: Path
) -> None:
    """Gemini keeps a user message for its next request and GPT-Live takes one as the
    caller's next typed message: the barge-in note is not added there (history holds
    it for the next connection). Added, Gemini was sent the spoken turn twice and
    GPT-Live was asked the note as part of the caller's next typed message."""
    provider = "gemini" if model == "gemini" else "openai"
    settings = {} if model == "gemini" else {"model": model}
    async with voice_gateway(
        provider, tmp_path, gateway_settings=settings, audio_ms_per_char=60
    ) as gw:
        sim: Sim = gw.sim
        client = await VoiceClient.connect(gw.url)
        await client.configure(input_audio={"rate": RATE}, output="audio", instructions="A")
        await client.send({"type": "user", "content": "/raw " + "z" * 40})
        await client.turn_end()
        await client.configure(instructions="B")  # the answer goes to a new one as history
        stop = asyncio.Event()
        player = asyncio.create_task(report_playback(client, 100, stop))
        await asyncio.sleep(0.35)  # the user hears a bit of it...
        stop.set()
        await player
        await client.stream(utterance(0.5, RATE), RATE)  # ...and talks over it
        await client.turn_end()
        await client.send({"type": "user", "content": "typed after"})
        typed = await client.turn_end()
        held = sim.live() if model != "gemini" else sim.conversations()
        # Read while the connection is open: a closed one forgets, as the service does.
        said = [item.text for item in held[-1].items if item.role == "user"]
        await client.close()
    assert said[-2:] == ["(speech 0.5 s)", "typed after"], said
    assert said.count("(speech 0.5 s)") == 1, said
    assert ("respond", "Echo: typed after") in shape(typed)
